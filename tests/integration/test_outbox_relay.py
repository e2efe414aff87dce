"""The outbox relay: PENDING → sink → SENT, in batches, repeatable, never losing a batch the sink refused."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from batch_assets.errors import ConfigError
from batch_assets.outbox.relay import JsonLinesSink, OutboxEvent, RedisStreamSink, make_sink, relay_outbox
from batch_assets.settings import load_settings

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/0"


def _add_events(engine: sa.Engine, n: int) -> list[str]:
    ids = [uuid.uuid4() for _ in range(n)]
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload) "
            "SELECT id, 'age_category_changed', jsonb_build_object('customer_id', id, 'from_category', NULL, "
            "'to_category', 'ADULT') FROM unnest(CAST(%(ids)s AS uuid[])) AS id",
            {"ids": ids},
        )
    return [str(i) for i in ids]


def _statuses(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.exec_driver_sql("SELECT status, count(*) FROM outbox_events GROUP BY status").all())


def test_relay_sends_everything_in_batches_then_nothing(engine: sa.Engine, tmp_path: Path) -> None:
    """Every PENDING event reaches the file once, in id order and batches, is marked SENT; a repeat sends none."""
    ids = _add_events(engine, 23)
    sink = JsonLinesSink(tmp_path / "outbox.jsonl")
    result = relay_outbox(engine, sink=sink, batch_size=10)
    assert (result.ok, result.sent, result.batches) == (True, 23, 3)
    lines = [json.loads(x) for x in (tmp_path / "outbox.jsonl").read_text().splitlines()]
    assert [m["aggregate_id"] for m in lines] == ids
    assert [m["id"] for m in lines] == sorted(m["id"] for m in lines)
    assert set(lines[0]["payload"]) == {"customer_id", "from_category", "to_category"}
    assert _statuses(engine) == {"SENT": 23}
    again = relay_outbox(engine, sink=sink, batch_size=10)
    assert (again.sent, len((tmp_path / "outbox.jsonl").read_text().splitlines())) == (0, 23)


class FailingSink:
    """Accepts `accept` batches, then refuses."""

    def __init__(self, accept: int) -> None:
        self.accept = accept
        self.received: list[int] = []

    def send(self, events: Sequence[OutboxEvent]) -> None:
        if self.accept == 0:
            raise ConnectionError("sink down")
        self.accept -= 1
        self.received.extend(e.id for e in events)


def test_a_refused_batch_stays_pending(engine: sa.Engine) -> None:
    """When the sink refuses, that batch is not marked SENT and the relay reports the error."""
    _add_events(engine, 10)
    sink = FailingSink(accept=1)
    result = relay_outbox(engine, sink=sink, batch_size=4)
    assert (result.ok, result.error, result.sent) == (False, "ConnectionError", 4)
    assert _statuses(engine) == {"SENT": 4, "PENDING": 6}
    assert relay_outbox(engine, sink=FailingSink(accept=99), batch_size=4).sent == 6


def test_a_claimed_batch_is_skipped_by_a_second_relay(engine: sa.Engine, tmp_path: Path) -> None:
    """Rows locked by another relay's claim are skipped (SKIP LOCKED), not waited for or sent twice."""
    _add_events(engine, 6)
    with engine.connect() as other:
        other.begin()
        held = other.exec_driver_sql(
            "SELECT id FROM outbox_events ORDER BY id LIMIT 2 FOR UPDATE SKIP LOCKED").scalars().all()
        result = relay_outbox(engine, sink=JsonLinesSink(tmp_path / "o.jsonl"), batch_size=100)
        other.rollback()
    assert result.sent == 4
    sent_ids = {json.loads(x)["id"] for x in (tmp_path / "o.jsonl").read_text().splitlines()}
    assert sent_ids.isdisjoint(held)
    assert _statuses(engine) == {"SENT": 4, "PENDING": 2}


@pytest.mark.usefixtures("require_redis")
def test_redis_stream_sink_adds_one_entry_per_event(engine: sa.Engine) -> None:
    """The Redis sink XADDs each event (with its id) to the stream."""
    stream = f"batch_assets.test.{uuid.uuid4().hex}"
    client = redis.Redis.from_url(REDIS_URL)
    sink = RedisStreamSink(REDIS_URL, stream=stream)
    try:
        _add_events(engine, 7)
        result = relay_outbox(engine, sink=sink, batch_size=5)
        assert (result.sent, client.xlen(stream)) == (7, 7)
        fields = client.xrange(stream, count=1)[0][1]
        assert set(fields) == {b"id", b"idempotency_key", b"aggregate_id", b"event_type", b"payload", b"created_at"}
    finally:
        client.delete(stream)
        client.close()
        sink.close()


def test_make_sink_and_batch_size_validation(engine: sa.Engine, tmp_path: Path) -> None:
    """make_sink picks Redis when a URL is set, else <home>/outbox.jsonl; a bad batch size is ConfigError."""
    file_sink = make_sink(load_settings({"BATCH_ASSETS_HOME": str(tmp_path)}))
    assert isinstance(file_sink, JsonLinesSink) and file_sink.path == tmp_path.resolve() / "outbox.jsonl"
    redis_sink = make_sink(load_settings({"BATCH_ASSETS_HOME": str(tmp_path), "BATCH_ASSETS_REDIS_URL": REDIS_URL}))
    assert isinstance(redis_sink, RedisStreamSink)
    redis_sink.close()
    with pytest.raises(ConfigError) as info:
        relay_outbox(engine, sink=file_sink, batch_size=0)
    assert info.value.field == "batch_size"
