"""The outbox's brokers in the campaign: a TCP proxy to break connections with, an owned NATS
JetStream server, a RabbitMQ virtual host of the campaign's own, and consumers that read back every message
with its broker-level id.

Nothing here stops or restarts a service of the machine: RabbitMQ is reached through the proxy (cut, mute,
down) inside a vhost the campaign creates and deletes; the NATS server is the campaign's own process on a free
port, stopped and started at will.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from faults.services import _wait, free_port

DEFAULT_NAME = "batch_assets.outbox"  # the relay's default exchange, queue and subject prefix
DEFAULT_NATS_STREAM = "BATCH_ASSETS_OUTBOX"


class TcpProxy:
    """A TCP proxy in front of a real service. Modes: "down" resets every new connection; "hang" accepts new
    ones and never answers, and stops forwarding on the open ones; "mute" forwards what the client sends but
    holds every reply (the broker took the publish, its confirm or PubAck never arrives); "up" forwards. Held
    bytes are never dropped. `cut()` resets every open connection (a connection killed mid-batch)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.mode = "down"
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.sockets.append(client)
            if self.mode == "down":
                self._reset(client)
            elif self.mode == "up":
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                except OSError:
                    self._reset(client)
                    continue
                upstream.settimeout(None)
                self.sockets.append(upstream)
                for a, b, replies in ((client, upstream, False), (upstream, client, True)):
                    threading.Thread(target=self._pipe, args=(a, b, replies), daemon=True).start()
            # "hang" / "mute": keep the socket open and never answer

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()
        except OSError:
            return  # already closed

    def _held(self, replies: bool) -> bool:
        return not self.closed.is_set() and (self.mode == "hang" or (self.mode == "mute" and replies))

    def _pipe(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                while self._held(replies):
                    time.sleep(0.01)  # holding the bytes: the peer waits for a reply that does not come
                dst.sendall(data)
        except OSError:
            return  # either side closed: the normal end of this direction (finally resets both)
        finally:
            for s in (src, dst):
                self._reset(s)

    def cut(self) -> int:
        """Reset every open connection (the service stays up; new connections follow the mode)."""
        open_ = [s for s in self.sockets if s.fileno() != -1]
        for s in open_:
            self._reset(s)
        self.sockets = []
        return len(open_)

    def close(self) -> None:
        self.closed.set()
        self.server.close()
        self.cut()


@dataclass(frozen=True)
class Delivered:
    """One message as a consumer read it: the broker-level id (message_id / Nats-Msg-Id) and the body's id."""

    key: str | None
    event_id: int
    persistent: bool = True


def delivered_ids(delivered: list[Delivered]) -> tuple[Counter[int], int]:
    """(deliveries per event id, messages whose broker-level id is not their event id)."""
    return Counter(d.event_id for d in delivered), sum(d.key != str(d.event_id) for d in delivered)


# --- RabbitMQ -----------------------------------------------------------------------------------------


def rabbit_read(url: str, queue: str) -> list[Delivered]:
    """Every message in `queue`, consumed and acked (prefetch 1000) until the queue is empty."""
    import aio_pika

    async def read() -> list[Delivered]:
        conn = await aio_pika.connect(url, timeout=10)
        try:
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=1000)
            q = await channel.declare_queue(queue, durable=True, passive=True)
            out: list[Delivered] = []
            while (msg := await q.get(no_ack=True, fail=False, timeout=10)) is not None:
                out.append(Delivered(msg.message_id, int(json.loads(msg.body)["id"]),
                                     msg.delivery_mode == aio_pika.DeliveryMode.PERSISTENT))
            return out
        finally:
            await conn.close()

    return asyncio.run(read())


def rabbit_delete(url: str, exchange: str, queue: str) -> None:
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


@dataclass
class RabbitVhost:
    """A virtual host of the campaign's own on the machine's RabbitMQ (rabbitmqctl), deleted at the end."""

    host: str = "127.0.0.1"
    port: int = 5672
    user: str = "guest"
    password: str = "guest"
    name: str = field(default_factory=lambda: f"ba-faults-{uuid.uuid4().hex[:8]}")
    created: bool = False

    @staticmethod
    def available(host: str = "127.0.0.1", port: int = 5672) -> bool:
        if shutil.which("rabbitmqctl") is None:
            return False
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            return False
        return True

    def _ctl(self, *args: str) -> None:
        subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        self._ctl("add_vhost", self.name)
        self.created = True
        self._ctl("set_permissions", "-p", self.name, self.user, ".*", ".*", ".*")

    def stop(self) -> None:
        if self.created:
            self._ctl("delete_vhost", self.name)
            self.created = False

    def url(self, port: int | None = None) -> str:
        return (f"amqp://{self.user}:{self.password}@{self.host}:{port or self.port}/"
                f"{quote(self.name, safe='')}")

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def reset(self) -> None:
        """The relay's default exchange and queue, deleted (the sink declares them again)."""
        rabbit_delete(self.url(), DEFAULT_NAME, DEFAULT_NAME)

    def read(self) -> list[Delivered]:
        return rabbit_read(self.url(), DEFAULT_NAME)


# --- NATS JetStream -----------------------------------------------------------------------------------


def nats_read(url: str, stream: str) -> list[Delivered]:
    """Every message the JetStream stream holds, through an ephemeral pull consumer in batches of 1000."""
    import nats
    from nats.errors import TimeoutError as NatsTimeout

    async def read() -> list[Delivered]:
        nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False)
        try:
            js = nc.jetstream(timeout=10)
            info = await js.stream_info(stream)
            want = info.state.messages
            out: list[Delivered] = []
            if not want:
                return out
            sub = await js.pull_subscribe((info.config.subjects or [">"])[0], stream=stream)
            while len(out) < want:
                try:
                    batch = await sub.fetch(batch=1000, timeout=5)
                except NatsTimeout:
                    break
                for msg in batch:
                    headers: dict[str, Any] = msg.headers or {}
                    out.append(Delivered(headers.get("Nats-Msg-Id"), int(json.loads(msg.data or b"{}")["id"])))
                    await msg.ack()
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def nats_delete(url: str, stream: str) -> None:
    import nats
    from nats.js.errors import NotFoundError

    async def delete() -> None:
        nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False)
        try:
            try:
                await nc.jetstream(timeout=10).delete_stream(stream)
            except NotFoundError:
                return  # not created yet
        finally:
            await nc.close()

    asyncio.run(delete())


@dataclass
class NatsServer:
    """nats-server with JetStream on a free port, its store in the campaign's directory: the campaign's own, so
    it may stop and start it (the broker stopped mid-batch) without touching the machine's server."""

    root: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def binary() -> str | None:
        return shutil.which("nats-server") or (
            "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None)

    @classmethod
    def available(cls) -> bool:
        return cls.binary() is not None

    def url(self, port: int | None = None) -> str:
        return f"nats://127.0.0.1:{port or self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "nats.log", "a") as log:
            self.proc = subprocess.Popen(
                [str(self.binary()), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.root / "js")],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        _wait(self.running, 20, "nats-server to listen")

    def running(self) -> bool:
        try:
            socket.create_connection(self.address, timeout=0.5).close()
        except OSError:
            return False
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.proc = None

    def reset(self) -> None:
        """The relay's default stream, deleted (with it JetStream's dedupe memory of the last fault's ids)."""
        nats_delete(self.url(), DEFAULT_NATS_STREAM)

    def read(self) -> list[Delivered]:
        return nats_read(self.url(), DEFAULT_NATS_STREAM)
