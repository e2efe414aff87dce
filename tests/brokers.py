"""The real local brokers of the outbox tests (RabbitMQ, NATS JetStream): where they are, whether they answer,
and plain consumers that read back what a sink delivered. Never a mock: a test that needs a broker skips when
it is absent (a fresh machine has none) and runs in CI (.ci/run starts both).

Importable as `brokers` from every test (tests/ is on sys.path).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

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


@dataclass(frozen=True)
class Delivered:
    """One message as a consumer read it: the broker-level id (message_id / Nats-Msg-Id / entry id field) and
    the body's event id."""

    key: str | None
    event_id: int
    persistent: bool = True


def unique_name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:12]}"


# --- RabbitMQ ------------------------------------------------------------------------------------------


def rabbit_read(queue: str, url: str = AMQP_URL) -> list[Delivered]:
    """Every message in `queue`, consumed (acked) by a plain aio-pika consumer."""
    import aio_pika

    async def read() -> list[Delivered]:
        conn = await aio_pika.connect(url, timeout=10)
        try:
            channel = await conn.channel()
            q = await channel.declare_queue(queue, durable=True, passive=True)
            out: list[Delivered] = []
            while (msg := await q.get(no_ack=True, fail=False, timeout=10)) is not None:
                out.append(Delivered(msg.message_id, int(json.loads(msg.body)["id"]),
                                     msg.delivery_mode == aio_pika.DeliveryMode.PERSISTENT))
            return out
        finally:
            await conn.close()

    return asyncio.run(read())


def rabbit_delete(exchange: str, queue: str, url: str = AMQP_URL) -> None:
    import aio_pika

    async def delete() -> None:
        conn = await aio_pika.connect(url, timeout=10)
        try:
            channel = await conn.channel()
            await channel.queue_delete(queue)
            await channel.exchange_delete(exchange)
        finally:
            await conn.close()

    asyncio.run(delete())


# --- NATS JetStream ------------------------------------------------------------------------------------


def nats_read(stream: str, url: str = NATS_URL) -> list[Delivered]:
    """Every message the JetStream stream holds, read by sequence."""
    import nats

    async def read() -> list[Delivered]:
        nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False)
        try:
            js = nc.jetstream(timeout=10)
            info = await js.stream_info(stream)
            out: list[Delivered] = []
            if info.state.messages:
                for seq in range(info.state.first_seq, info.state.last_seq + 1):
                    msg = await js.get_msg(stream, seq)
                    headers: dict[str, Any] = msg.headers or {}
                    out.append(Delivered(headers.get("Nats-Msg-Id"), int(json.loads(msg.data or b"{}")["id"])))
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def nats_delete(stream: str, url: str = NATS_URL) -> None:
    import nats
    from nats.js.errors import NotFoundError

    async def delete() -> None:
        nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False)
        try:
            try:
                await nc.jetstream(timeout=10).delete_stream(stream)
            except NotFoundError:
                return  # the test failed before creating it
        finally:
            await nc.close()

    asyncio.run(delete())


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
