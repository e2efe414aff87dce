"""The outbox relay: PENDING → sink → SENT, in batches, repeatable, never losing a batch the sink refused."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from batch_assets.errors import ConfigError
from batch_assets.outbox.event import OutboxEvent
from batch_assets.outbox.relay import relay_outbox
from batch_assets.outbox.settings import RelaySettings
from batch_assets.outbox.sinks import JsonLinesSink, RedisStreamSink, make_sink
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


def test_a_batch_is_bounded_in_payload_bytes_and_every_event_is_still_sent(engine: sa.Engine, tmp_path: Path) -> None:
    """Events of ~300 KB (incompressible) with a 1 MiB budget go 3 to a batch, a 2 MB one alone (the first event
    of a batch is always taken), and small ones fill a batch by rows; every event is sent once, in id order."""
    with engine.begin() as conn:  # another service's large payloads, then small ones
        conn.exec_driver_sql(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload) "
            "SELECT gen_random_uuid(), 'big', jsonb_build_object('blob', "
            "(SELECT string_agg(md5(random()::text || g || s), '') FROM generate_series(1, %(chunks)s) AS s)) "
            "FROM generate_series(1, 7) AS g",
            {"chunks": 300_000 // 32},
        )
        conn.exec_driver_sql(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload) "
            "SELECT gen_random_uuid(), 'huge', jsonb_build_object('blob', "
            "(SELECT string_agg(md5(random()::text || s), '') FROM generate_series(1, 65536) AS s))"
        )
    small = _add_events(engine, 25)
    sink = JsonLinesSink(tmp_path / "outbox.jsonl")
    result = relay_outbox(engine, sink=sink, settings=RelaySettings(batch_size=10, batch_bytes=1024 * 1024))
    # 7 big: 3 + 3 + 1 (the huge one's 2 MB cannot join) · huge alone (no small one joins it) · 25 small: 10 + 10 + 5
    assert (result.ok, result.sent, result.batches) == (True, 33, 7)
    lines = [json.loads(x) for x in (tmp_path / "outbox.jsonl").read_text().splitlines()]
    assert [m["id"] for m in lines] == sorted(m["id"] for m in lines) and len({m["id"] for m in lines}) == 33
    assert [m["aggregate_id"] for m in lines[-25:]] == small
    assert _statuses(engine) == {"SENT": 33}


def test_batch_bytes_is_validated(engine: sa.Engine, tmp_path: Path) -> None:
    """A byte budget below 1 KiB, above 1 GiB or not an integer is refused naming batch_bytes; nothing is sent."""
    _add_events(engine, 2)
    for bad in (0, 1023, 2**30 + 1, 1.5, True):
        with pytest.raises(ConfigError) as info:
            relay_outbox(engine, sink=JsonLinesSink(tmp_path / "x.jsonl"), settings=RelaySettings(batch_bytes=bad))
        assert info.value.field == "batch_bytes"
    assert _statuses(engine) == {"PENDING": 2}


class FailingSink:
    """Accepts `accept` batches, then refuses."""

    def __init__(self, accept: int) -> None:
        self.accept = accept
        self.received: list[int] = []

    def send_batch(self, events: Sequence[OutboxEvent]) -> None:
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


def test_claims_of_a_dead_relay_are_sent_at_once(engine: sa.Engine, tmp_path: Path, dead_owner: str) -> None:
    """Events claimed by a relay whose process is gone (kill -9) are sent by the next relay, not after the lease."""
    from batch_assets.locking.owner import make_owner

    _add_events(engine, 5)
    dead = dead_owner
    alive = make_owner("live-relay")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE outbox_events SET claimed_by = CASE WHEN mod(id, 2) = 0 THEN %(dead)s ELSE %(alive)s END, "
            "claimed_until = now() + interval '1 hour'", {"dead": dead, "alive": alive})
        live = conn.exec_driver_sql("SELECT count(*) FROM outbox_events WHERE claimed_by = %(a)s",
                                    {"a": alive}).scalar_one()
    result = relay_outbox(engine, sink=JsonLinesSink(tmp_path / "o.jsonl"), batch_size=100)
    assert result.sent == 5 - live, "the dead relay's claims must be sent now; a live relay's stay its own"
    assert _statuses(engine) == {"SENT": 5 - live, "PENDING": live}


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
    """BATCH_ASSETS_OUTBOX_SINK=redis:// picks Redis; unset is <home>/outbox.jsonl even with the lock's Redis URL set;
    a bad batch size is ConfigError."""
    home = {"BATCH_ASSETS_HOME": str(tmp_path), "BATCH_ASSETS_REDIS_URL": REDIS_URL}
    file_sink = make_sink(load_settings(home).outbox_sink)  # type: ignore[arg-type]
    assert isinstance(file_sink, JsonLinesSink) and file_sink.path == tmp_path.resolve() / "outbox.jsonl"
    redis_sink = make_sink(load_settings({**home, "BATCH_ASSETS_OUTBOX_SINK": REDIS_URL}).outbox_sink)  # type: ignore[arg-type]
    assert isinstance(redis_sink, RedisStreamSink)
    redis_sink.close()
    with pytest.raises(ConfigError) as info:
        relay_outbox(engine, sink=file_sink, batch_size=0)
    assert info.value.field == "batch_size"


# --- claim lease, sends outside transactions, follow mode ----------------------------------------

import threading  # noqa: E402
import time  # noqa: E402

from helpers import TcpProxy  # noqa: E402

from batch_assets.outbox.relay import follow_outbox, relay_batch  # noqa: E402


class RecordingSink:
    def __init__(self, during_send=None) -> None:  # noqa: ANN001
        self.received: list[int] = []
        self.during_send = during_send

    def send_batch(self, events: Sequence[OutboxEvent]) -> None:
        if self.during_send is not None:
            hook, self.during_send = self.during_send, None
            hook()
        self.received.extend(e.id for e in events)


def test_mark_sent_is_fenced_by_the_claim(engine: sa.Engine) -> None:
    """A relay whose claim lease passed while it was sending, and whose rows another relay took, marks none."""
    _add_events(engine, 3)
    slow_settings = RelaySettings(batch_size=10, claim_lease_s=0.2, send_timeout_s=0.1)
    other = RecordingSink()

    def lease_passes_and_another_relay_takes_over() -> None:
        with engine.begin() as conn:  # the passage of time: the claim lease is over
            conn.exec_driver_sql("UPDATE outbox_events SET claimed_until = now() - interval '1 second'")
        assert relay_batch(engine, sink=other, owner="relay-b", settings=RelaySettings(batch_size=10)) == (3, 3)

    slow = RecordingSink(during_send=lease_passes_and_another_relay_takes_over)
    assert relay_batch(engine, sink=slow, owner="relay-a", settings=slow_settings) == (3, 0)
    assert len(other.received) == len(slow.received) == 3  # delivered twice: at least once, never lost
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT status, claimed_by, attempts FROM outbox_events").all()
    assert {tuple(r) for r in rows} == {("SENT", None, 2)}


def _idle_in_transaction(engine: sa.Engine, longer_than_s: float = 0.2) -> int:
    """Sessions of this database idle inside a transaction for longer than `longer_than_s`.

    A short claim or mark transaction is idle in transaction for microseconds between its statements, so an
    instantaneous sample can catch one; a transaction held across a send (timeout 0.3 s here) stays idle
    for the whole send, well past the threshold, and is seen by several consecutive samples."""
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state LIKE 'idle in transaction%%' "
            "AND clock_timestamp() - state_change > make_interval(secs => %(s)s)",
            {"s": longer_than_s},
        ).scalar_one()


@pytest.mark.usefixtures("require_redis")
def test_follow_with_the_sink_down_then_hanging_holds_no_transaction_and_loses_nothing(engine: sa.Engine) -> None:
    """Sink down, then hanging: no session idle in transaction meanwhile; once it recovers every event is
    delivered (at least once, keyed by event id) and marked SENT, also events written while following."""
    stream = f"batch_assets.test.{uuid.uuid4().hex}"
    client = redis.Redis.from_url(REDIS_URL)
    proxy = TcpProxy(("127.0.0.1", 6379))
    sink = RedisStreamSink(f"redis://127.0.0.1:{proxy.port}/0", stream=stream, timeout_s=0.3)
    settings = RelaySettings(batch_size=10, claim_lease_s=5, send_timeout_s=0.3, poll_s=30, backoff_s=0.05,
                             backoff_max_s=0.2)
    _add_events(engine, 35)
    stop = threading.Event()
    errors: list[str] = []
    box: dict = {}

    def follow() -> None:
        box["result"] = follow_outbox(
            engine, sink=sink, owner="relay-test", settings=settings, stop=stop,
            on_pass=lambda r: errors.append(r.error) if r.error else None,
        )

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        samples = 0
        for mode, wanted in (("down", 3), ("hang", 6)):
            proxy.mode = mode
            deadline = time.monotonic() + 30
            while len(errors) < wanted:
                assert _idle_in_transaction(engine) == 0, f"a session sat idle in transaction (sink {mode})"
                samples += 1
                assert time.monotonic() < deadline, f"the relay did not fail against a sink that is {mode}"
                time.sleep(0.02)  # sampling interval of a deadline loop
        assert samples > 10 and _statuses(engine) == {"PENDING": 35}

        proxy.mode = "up"
        deadline = time.monotonic() + 30
        while _statuses(engine) != {"SENT": 35}:
            assert time.monotonic() < deadline, f"not everything was relayed: {_statuses(engine)}"
            time.sleep(0.05)  # polling interval of a deadline loop
        late = _add_events(engine, 5)  # written while the relay waits (poll_s = 30): the notification wakes it
        deadline = time.monotonic() + 10
        while _statuses(engine) != {"SENT": 40}:
            assert time.monotonic() < deadline, "a new event was not relayed on its notification"
            time.sleep(0.05)  # polling interval of a deadline loop
    finally:
        stop.set()
        thread.join(timeout=30)
        proxy.close()
    assert not thread.is_alive() and box["result"].failures >= 6
    with engine.connect() as conn:
        ids = set(conn.exec_driver_sql("SELECT id FROM outbox_events").scalars())
    entries = client.xrange(stream)
    client.delete(stream)
    client.close()
    sink.close()
    delivered = {int(fields[b"idempotency_key"]) for _, fields in entries}
    assert delivered == ids and len(ids) == 40  # none lost
    assert {e[1][b"aggregate_id"].decode() for e in entries} >= set(late)


def test_an_insert_of_events_notifies_the_relay_and_an_empty_insert_does_not(engine: sa.Engine) -> None:
    """The statement trigger NOTIFYs batch_assets_outbox once per inserting statement, never for zero rows."""
    from batch_assets.outbox.listener import NOTIFY_CHANNEL

    raw = engine.raw_connection()
    try:
        listener = raw.driver_connection
        listener.autocommit = True
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        with engine.begin() as conn:  # a page write with no category change inserts no event
            conn.exec_driver_sql("INSERT INTO outbox_events (aggregate_id, event_type, payload) "
                                 "SELECT gen_random_uuid(), 'x', '{}'::jsonb WHERE false")
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        _add_events(engine, 3)
        [note] = list(listener.notifies(timeout=5, stop_after=1))
        assert note.channel == NOTIFY_CHANNEL
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []  # one statement, one notification
    finally:
        raw.invalidate()


def _plan_nodes(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    found = [(plan["Node Type"], plan.get("Index Name"))]
    for child in plan.get("Plans", []):
        found += _plan_nodes(child)
    return found


def test_a_claim_walks_the_pending_index_from_where_the_pass_is_even_with_stale_statistics(engine: sa.Engine) -> None:
    """Statistics from before a sweep's events (100 rows analyzed, 20,000 inserted since): on the relay's claiming
    connection a claim reads the pending index in id order from the pass's last id and updates through the
    primary key; no sequential or bitmap scan, whose cost grows with the table and the backlog (unpinned, the
    same statement is planned as a hash join over a sequential scan of outbox_events). The mark is an index
    scan of the batch's ids."""
    from batch_assets.outbox import sql
    from batch_assets.outbox.claims import claiming_connection

    insert = ("INSERT INTO outbox_events (aggregate_id, event_type, payload) "
              "SELECT gen_random_uuid(), 'age_category_changed', '{}'::jsonb FROM generate_series(1, %(n)s)")
    with engine.begin() as conn:
        # Full pages, as a database's events written before migration 0008 (fillfactor 50): on the half-full pages
        # written since, the unpinned planner happens to choose the index walk at this size (the pin stays needed).
        conn.exec_driver_sql("ALTER TABLE outbox_events SET (fillfactor = 100)")
        conn.exec_driver_sql(insert, {"n": 100})
        conn.exec_driver_sql("ANALYZE outbox_events")
        conn.exec_driver_sql(insert, {"n": 20_000})
    explain = sa.text("EXPLAIN (FORMAT JSON) " + sql.CLAIM_BATCH.text).bindparams(
        sa.bindparam("lease_s", type_=sa.Float), sa.bindparam("after", type_=sa.BigInteger))
    params = {"limit": 500, "max_bytes": 8 << 20, "owner": "relay-t", "lease_s": 60.0, "after": 0}
    scans = {"Seq Scan", "Bitmap Heap Scan", "Bitmap Index Scan"}
    with engine.connect() as conn:
        unpinned = _plan_nodes(conn.execute(explain, params).scalar_one()[0]["Plan"])
        conn.rollback()
    assert scans & {node for node, _ in unpinned}, f"the unpinned plan no longer scans the table: {unpinned}"
    with claiming_connection(engine) as conn:
        pinned = _plan_nodes(conn.execute(explain, params).scalar_one()[0]["Plan"])
        mark = sa.text("EXPLAIN (FORMAT JSON) " + sql.MARK_SENT.text)
        marked = _plan_nodes(conn.execute(mark, {"ids": list(range(10_001, 10_501)), "owner": "relay-t"})
                             .scalar_one()[0]["Plan"])
    assert not scans & {node for node, _ in pinned}, pinned
    assert ("Index Scan", "outbox_events_pending_idx") in pinned and ("Index Scan", "outbox_events_pkey") in pinned
    assert not scans & {node for node, _ in marked}, marked
    with engine.connect() as conn:  # the pin is the claiming session's only: reset before it went back
        assert conn.exec_driver_sql("SHOW enable_hashjoin").scalar_one() == "on"


def test_an_event_that_commits_late_below_the_pass_is_sent_by_the_next_pass(engine: sa.Engine) -> None:
    """A pass claims from its last id onwards; an event whose id is lower but whose transaction commits while the
    pass runs is left PENDING by that pass and sent by the next one (which starts again at the first id)."""
    with engine.connect() as late:
        late.begin()
        late_id = late.exec_driver_sql(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload) "
            "VALUES (gen_random_uuid(), 'age_category_changed', '{}'::jsonb) RETURNING id").scalar_one()
        _add_events(engine, 30)
        sink = RecordingSink(during_send=late.commit)  # commits while the first batch is with the sink
        first = relay_outbox(engine, sink=sink, batch_size=10)
    assert first.sent == 30 and late_id not in sink.received
    assert _statuses(engine) == {"SENT": 30, "PENDING": 1}
    second = relay_outbox(engine, sink=sink, batch_size=10)
    assert second.sent == 1 and sink.received[-1] == late_id
    assert _statuses(engine) == {"SENT": 31}


def test_follow_resumes_each_pass_from_its_mark_and_a_rescan_sends_what_committed_late_below_it(
    engine: sa.Engine,
) -> None:
    """Follow mode: passes woken by notifications claim from where the previous pass ended (the sent events'
    dead index entries are not walked again); an event with a lower id whose transaction commits after the
    mark moved past it is sent by the next rescan (every poll_s), not left PENDING."""
    from helpers import wait_for

    sink = RecordingSink()
    passes: list[tuple[int, int]] = []
    stop = threading.Event()
    settings = RelaySettings(batch_size=10, poll_s=1.0)
    thread = threading.Thread(target=lambda: follow_outbox(
        engine, sink=sink, owner="relay-follow", settings=settings, stop=stop,
        on_pass=lambda r: passes.append((r.sent, r.last_id))), daemon=True)
    with engine.connect() as late:
        late.begin()
        late_id = late.exec_driver_sql(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload) "
            "VALUES (gen_random_uuid(), 'age_category_changed', '{}'::jsonb) RETURNING id").scalar_one()
        thread.start()
        try:
            _add_events(engine, 25)
            wait_for(lambda: len(sink.received) == 25, what="the 25 committed events sent")
            mark = max(sink.received)
            _add_events(engine, 5)  # a notified pass starts at the mark: it sends only these
            wait_for(lambda: len(sink.received) == 30, what="the next 5 sent")
            assert min(sink.received[25:]) > mark
            late.commit()  # below the mark: only a rescan can see it
            wait_for(lambda: late_id in sink.received, timeout=10, what="the late event sent by a rescan")
        finally:
            stop.set()
            thread.join(timeout=10)
    assert sorted(sink.received) == sorted(set(sink.received)) and len(sink.received) == 31
    assert _statuses(engine) == {"SENT": 31}
    assert any(last > late_id for _, last in passes)
