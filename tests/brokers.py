"""The real local brokers of the outbox tests (RabbitMQ, NATS JetStream): where they are, whether they answer,
and plain consumers that read back what a sink delivered. Never a mock: a test that needs a broker skips when
it is absent (a fresh machine has none) and runs in CI (.ci/run starts both).

Importable as `brokers` from every test (tests/ is on sys.path).
"""

from __future__ import annotations

import os
import socket
import uuid
from urllib.parse import urlsplit

import pytest

from faults import brokers as campaign
from faults.brokers import Delivered

__all__ = ["Delivered"]

AMQP_URL = os.environ.get("BATCH_ASSETS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
NATS_URL = os.environ.get("BATCH_ASSETS_TEST_NATS_URL", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("BATCH_ASSETS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    default = {"amqp": 5672, "nats": 4222, "redis": 6379}[parts.scheme]
    return parts.hostname or "127.0.0.1", parts.port or default


def reachable(url: str) -> bool:
    try:
        socket.create_connection(address(url), timeout=1).close()
    except OSError:
        return False
    return True


def require(url: str, what: str) -> None:
    if not reachable(url):
        pytest.skip(f"no {what} at {address(url)} (the broker sinks are optional; CI starts one)")


def closed_port_url(url: str) -> str:
    """`url` pointed at a local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host).geturl()


def proxied_url(url: str, port: int) -> str:
    """`url` through a local proxy port (tests/helpers.TcpProxy)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host).geturl()


def unique_name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:12]}"


def rabbit_read(queue: str, url: str = AMQP_URL) -> list[Delivered]:
    """Every message in `queue`, consumed (acked) by a plain aio-pika consumer."""
    return campaign.rabbit_read(url, queue)


def rabbit_delete(exchange: str, queue: str, url: str = AMQP_URL) -> None:
    campaign.rabbit_delete(url, exchange, queue)


def nats_read(stream: str, url: str = NATS_URL) -> list[Delivered]:
    """Every message the JetStream stream holds."""
    return campaign.nats_read(url, stream)


def nats_delete(stream: str, url: str = NATS_URL) -> None:
    campaign.nats_delete(url, stream)


# --- Redis ---------------------------------------------------------------------------------------------
def redis_read(stream: str, url: str = REDIS_URL) -> list[Delivered]:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        return [Delivered(fields[b"idempotency_key"].decode(), int(fields[b"id"]))
                for _entry, fields in client.xrange(stream)]
    finally:
        client.close()


def redis_delete(stream: str, url: str = REDIS_URL) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        client.delete(stream)
    finally:
        client.close()
