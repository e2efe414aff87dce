"""The queue bench's HTTP case: the default handler at concurrency HTTP_CONCURRENCY against a keep-alive stub on
127.0.0.1 that answers every call after HTTP_LATENCY_S."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from multiprocessing.context import SpawnContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from batch_assets.bench.queue_harness import EndReport, drain_process

HTTP_LATENCY_S = 0.05
HTTP_CONCURRENCY = 64


def _stub_process(port_out: Queue[int], stop: Event, latency_s: float) -> None:
    """A keep-alive HTTP/1.1 server that answers every POST with 200 after `latency_s`."""

    async def serve() -> None:
        calls = 0

        async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal calls
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":", 1)[1])
                    if length:
                        await reader.readexactly(length)
                    await asyncio.sleep(latency_s)
                    calls += 1
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(client, "127.0.0.1", 0, backlog=1024)
        port_out.put(server.sockets[0].getsockname()[1])
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, stop.wait)
        port_out.put(calls)
        server.close()

    asyncio.run(serve())


def _http_setup(limits_url: str) -> tuple[Any, Any]:
    """The default handler at HTTP_CONCURRENCY against the stub."""
    from batch_assets.queue.settings import QueueSettings
    from batch_assets.reference.payments.handler import default_handler

    settings = QueueSettings(concurrency=HTTP_CONCURRENCY, http_timeout_s=5)
    return settings, default_handler(limits_url, settings.http_timeout_s, concurrency=settings.concurrency)


def http_stub_case(ctx: SpawnContext, url: str) -> tuple[float, int]:
    port_out: Queue[int] = ctx.Queue()
    stop = ctx.Event()
    stub = ctx.Process(target=_stub_process, args=(port_out, stop, HTTP_LATENCY_S), daemon=True)
    stub.start()
    try:
        port = port_out.get(timeout=60)
        ready = ctx.Barrier(2)
        out: Queue[EndReport] = ctx.Queue()
        limits_url = f"http://127.0.0.1:{port}/limits"
        proc = ctx.Process(target=drain_process, args=(url, ready, out, partial(_http_setup, limits_url)),
                           daemon=True)
        proc.start()
        try:
            ready.wait(timeout=120)
            started = time.monotonic()
            end = out.get(timeout=900)
            if isinstance(end, str):
                raise RuntimeError(f"HTTP bench worker failed: {end}")
        finally:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        stop.set()
        calls = int(port_out.get(timeout=30))
        return end - started, calls
    finally:
        stop.set()
        stub.join(timeout=30)
        if stub.is_alive():
            stub.kill()
