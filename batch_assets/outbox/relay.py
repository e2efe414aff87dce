"""The outbox relay: PENDING events → a sink → SENT, in batches, safe to repeat.

A batch is claimed with FOR UPDATE SKIP LOCKED (several relays never send the
same batch at once), handed to the sink, and marked SENT in the same
transaction only after the sink accepted it. A crash between the two resends
the batch (at-least-once); every message carries the event id for dedupe.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

from batch_assets.errors import ConfigError
from batch_assets.settings import Settings

DEFAULT_STREAM = "batch_assets.outbox"
MAX_BATCH = 10_000

# CLAIM_PENDING — the oldest PENDING events not claimed by another relay. Parameters: limit int.
CLAIM_PENDING = """
SELECT id, aggregate_id, event_type, payload, created_at
  FROM outbox_events
 WHERE status = 'PENDING'
 ORDER BY id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED
"""

# MARK_SENT — after the sink accepted the batch, in the claiming transaction. Parameters: ids bigint[].
MARK_SENT = """
UPDATE outbox_events SET status = 'SENT', sent_at = now()
 WHERE id = ANY(CAST(%(ids)s AS bigint[])) AND status = 'PENDING'
"""


@dataclass(frozen=True)
class OutboxEvent:
    id: int
    aggregate_id: str
    event_type: str
    payload: dict[str, Any]
    created_at: datetime

    def to_message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "aggregate_id": self.aggregate_id,
            "event_type": self.event_type,
            "payload": self.payload,
            "created_at": self.created_at.isoformat(),
        }


class Sink(Protocol):
    def send(self, events: Sequence[OutboxEvent]) -> None:
        """Deliver the batch durably or raise; returning means accepted."""


class JsonLinesSink:
    """Appends one JSON object per event to a file, flushed and fsynced before returning."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def send(self, events: Sequence[OutboxEvent]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(e.to_message(), separators=(",", ":")) + "\n" for e in events)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(lines)
            fh.flush()
            os.fsync(fh.fileno())

    def __repr__(self) -> str:
        return f"JsonLinesSink({str(self.path)!r})"


class RedisStreamSink:
    """XADDs one entry per event to a Redis stream, the batch in one pipeline round trip."""

    def __init__(self, redis_url: str, stream: str = DEFAULT_STREAM) -> None:
        import redis

        self.stream = stream
        self._client = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)

    def send(self, events: Sequence[OutboxEvent]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for e in events:
            pipe.xadd(
                self.stream,
                {
                    "id": str(e.id),
                    "aggregate_id": e.aggregate_id,
                    "event_type": e.event_type,
                    "payload": json.dumps(e.payload, separators=(",", ":")),
                    "created_at": e.created_at.isoformat(),
                },
            )
        pipe.execute()

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:  # the URL may hold a password
        return f"RedisStreamSink(stream={self.stream!r})"


def make_sink(settings: Settings) -> Sink:
    """The Redis stream when BATCH_ASSETS_REDIS_URL is set, else <home>/outbox.jsonl."""
    if settings.redis_url:
        return RedisStreamSink(settings.redis_url)
    return JsonLinesSink(settings.home / "outbox.jsonl")


@dataclass(frozen=True)
class RelayResult:
    sent: int
    batches: int
    duration_s: float
    error: str | None = None
    """Type of the sink or database error that stopped the relay; its batch stays PENDING."""

    @property
    def ok(self) -> bool:
        return self.error is None


def relay_outbox(engine: sa.Engine, *, sink: Sink, batch_size: int = 500) -> RelayResult:
    """Send every PENDING event (in id order, in batches) and mark it SENT; stops at the first failure."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH:
        raise ConfigError(f"must be an integer in 1..{MAX_BATCH}", field="batch_size")
    started = time.monotonic()
    sent = batches = 0
    while True:
        try:
            with engine.begin() as conn:
                rows = conn.exec_driver_sql(CLAIM_PENDING, {"limit": batch_size}).fetchall()
                if not rows:
                    break
                events = [OutboxEvent(int(r[0]), str(r[1]), r[2], r[3], r[4]) for r in rows]
                sink.send(events)  # raises → rollback → the batch stays PENDING
                conn.exec_driver_sql(MARK_SENT, {"ids": [e.id for e in events]})
        except Exception as exc:  # the sink's or the database's; the caller gets it in the result
            return RelayResult(sent, batches, time.monotonic() - started, error=type(exc).__name__)
        sent += len(events)
        batches += 1
        if len(rows) < batch_size:
            break
    return RelayResult(sent, batches, time.monotonic() - started)
