"""The Redis sink: one stream entry per event, the batch in one pipeline round trip (client: redis-py)."""

from __future__ import annotations

from collections.abc import Sequence

from batch_assets.outbox.event import OutboxEvent
from batch_assets.outbox.sinks.base import DEFAULT_STREAM, SinkNotConfirmed, client_library


class RedisStreamSink:
    """XADDs one entry per event (its id in the entry) to a Redis stream, the batch in one pipeline round trip.

    `timeout_s` bounds connecting and every reply: a Redis that hangs fails the send instead of
    stalling the relay. Every XADD's reply is its confirmation.
    """

    def __init__(self, redis_url: str, stream: str = DEFAULT_STREAM, *, timeout_s: float = 10.0) -> None:
        with client_library("redis", "redis"):
            import redis

        self.stream = stream
        self._client = redis.Redis.from_url(
            redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False
        )

    def send_batch(self, events: Sequence[OutboxEvent]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for e in events:
            pipe.xadd(
                self.stream,
                {
                    "id": str(e.id),
                    "idempotency_key": str(e.id),
                    "aggregate_id": e.aggregate_id,
                    "event_type": e.event_type,
                    "payload": e.payload_json,
                    "created_at": e.created_at.isoformat(),
                },
            )
        replies = pipe.execute(raise_on_error=False)
        confirmed = [e.id for e, reply in zip(events, replies, strict=True) if not isinstance(reply, Exception)]
        if len(confirmed) < len(events):
            raise SinkNotConfirmed(f"Redis refused {len(events) - len(confirmed)} of {len(events)} entries", confirmed)

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:  # the URL may hold a password
        return f"RedisStreamSink(stream={self.stream!r})"
