"""What the asyncio brokers' sinks (RabbitMQ, NATS) share: an event loop on a thread of its own for the sink's
lifetime, so heartbeats are answered between batches and the relay stays plain synchronous code, and the
connect-on-first-use, drop-after-any-failure cycle around each batch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from batch_assets.outbox.event import OutboxEvent
from batch_assets.outbox.sinks.base import SinkNotConfirmed

T = TypeVar("T")


class LoopThread:
    """One asyncio event loop on a daemon thread; `run` executes a coroutine there, bounded by a timeout."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout_s), self.loop)
        try:
            return future.result(timeout_s + 5)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout_s}s") from None

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class AsyncSink:
    """A sink whose client is asyncio: connect on first use, drop the connection after any failure."""

    name = "sink"

    def __init__(self, url: str, timeout_s: float) -> None:
        self._url = url
        self.timeout_s = timeout_s
        self._loop = LoopThread(f"outbox-{self.name}")
        self._connected = False

    async def _connect(self) -> None:
        raise NotImplementedError

    async def _disconnect(self) -> None:
        raise NotImplementedError

    async def _publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        raise NotImplementedError

    async def _send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        if not self._connected:
            await self._connect()
            self._connected = True
        return await self._publish(events)

    def send_batch(self, events: Sequence[OutboxEvent]) -> None:
        try:
            outcomes = self._loop.run(self._send(events), self.timeout_s)
        except BaseException:
            self._reset()
            raise
        failed = [o for o in outcomes if o is not None]
        if failed:
            self._reset()
            confirmed = [e.id for e, o in zip(events, outcomes, strict=True) if o is None]
            raise SinkNotConfirmed(f"{self.name}: {len(failed)} of {len(events)} not confirmed "
                                   f"({type(failed[0]).__name__})", confirmed)

    def _reset(self) -> None:
        if self._connected:
            self._connected = False
            try:
                self._loop.run(self._disconnect(), min(self.timeout_s, 5.0))
            except Exception:  # noqa: BLE001 - the connection is already broken; the next batch connects anew
                self._connected = False

    def close(self) -> None:
        try:
            self._reset()
        finally:
            self._loop.stop()
