"""The NATS JetStream sink (client: nats-py): every PubAck of a batch awaited together."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from batch_assets.outbox.event import OutboxEvent, bodies_of
from batch_assets.outbox.sinks.base import DEFAULT_NATS_STREAM, DEFAULT_STREAM, client_library
from batch_assets.outbox.sinks.loop import AsyncSink


class NatsJetStreamSink(AsyncSink):
    """NATS JetStream through nats-py: the stream (created when missing) holds `<subject>.>`; each event goes to
    `<subject>.<event type>` with header `Nats-Msg-Id` = the event id, the batch published asynchronously and
    every PubAck awaited together. A duplicate PubAck (the broker already held that id) is a confirmation."""

    name = "nats"

    def __init__(self, url: str, *, stream: str = DEFAULT_NATS_STREAM, subject: str = DEFAULT_STREAM,
                 timeout_s: float = 10.0) -> None:
        with client_library(self.name, "nats-py"):
            import nats  # noqa: F401 - imported here so that a missing library refuses the sink when chosen

        self.stream, self.subject = stream, subject
        self._nc: Any = None
        self._js: Any = None
        super().__init__(url, timeout_s)

    async def _connect(self) -> None:
        import nats
        from nats.js.errors import NotFoundError

        self._nc = await nats.connect(self._url, connect_timeout=self.timeout_s, allow_reconnect=False,
                                      max_reconnect_attempts=0)
        self._js = self._nc.jetstream(timeout=self.timeout_s, publish_async_max_pending=100_000)
        try:
            await self._js.stream_info(self.stream)
        except NotFoundError:
            await self._js.add_stream(name=self.stream, subjects=[f"{self.subject}.>"])

    async def _disconnect(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            await nc.close()

    async def _publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        acks = [
            await self._js.publish_async(f"{self.subject}.{e.event_type}", body, stream=self.stream,
                                         headers={"Nats-Msg-Id": str(e.id)})
            for e, body in zip(events, bodies_of(events), strict=True)
        ]
        await self._nc.flush(timeout=self.timeout_s)
        results = await asyncio.gather(*acks, return_exceptions=True)
        return [r if isinstance(r, BaseException) else None for r in results]

    def __repr__(self) -> str:
        return f"NatsJetStreamSink(stream={self.stream!r}, subject={self.subject!r})"
