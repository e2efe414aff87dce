"""The resident payment worker (docs/guide/payment-queue.md): aging, notifications, breaker, plug-ins, crashes, plans.

Real PostgreSQL; the crash and outage tests run the worker as a separate process against a
local HTTP stub and stop it by its own process group.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from helpers import LimitsStub, WorkerProcess, wait_for

from batch_assets.db.engine import is_transient
from batch_assets.errors import ConfigError
from batch_assets.queue.batch import AdaptiveBatch
from batch_assets.queue.breaker import CLOSED, HALF_OPEN, OPEN, Breaker
from batch_assets.queue.claims import Result
from batch_assets.queue.settings import QueueSettings
from batch_assets.reference.payments import queue, sql
from batch_assets.reference.payments.handler import HttpLimitsHandler, PluginHandler, load_plugin
from batch_assets.reference.payments.store import PAYMENTS
from batch_assets.reference.payments.worker import run_worker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _conninfo(db_url: str) -> str:
    return sa.engine.make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)


def _notifications_until_marker(listener: psycopg.Connection[Any], db_url: str) -> list[str]:
    """The payloads `listener` received, up to a marker sent now from another connection.

    Notifications arrive in commit order, so everything committed before the marker has arrived
    once the marker has.
    """
    with psycopg.connect(_conninfo(db_url), autocommit=True) as writer:
        writer.execute("SELECT pg_notify(%s, 'marker')", (sql.DUE_CHANNEL,))
    payloads = []
    for note in listener.notifies(timeout=30):
        payloads.append(note.payload)
        if note.payload == "marker":
            break
    return payloads


def _statuses(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT status, count(*) FROM payments GROUP BY status")).all())


# --- a local limits service ----------------------------------------------------------------------


@pytest.fixture
def stub() -> Iterator[LimitsStub]:
    """A keep-alive limits service: `respond(body) -> status`; counts POSTs per payment (`count`)."""
    with LimitsStub(keep_alive=True) as service:
        yield service


# --- pure pieces ----------------------------------------------------------------------------------


def test_adaptive_batch_grows_shrinks_and_stays_within_bounds(caplog: pytest.LogCaptureFixture) -> None:
    """Full claims that handlers keep up with double the batch (≤ max); short claims or waiting rows shrink it (≥ 1)."""
    batch = AdaptiveBatch(10, 1000)
    with caplog.at_level("DEBUG", logger="batch_assets.queue.batch"):
        sizes = [batch.after_claim(batch.size, batch.size, waiting=0, oldest_wait_s=0.0) for _ in range(10)]
    assert sizes[:3] == [20, 40, 80] and sizes[-1] == 1000
    assert any("claim batch 10 -> 20" in r.getMessage() for r in caplog.records)
    assert batch.after_claim(1000, 1000, waiting=5, oldest_wait_s=0.01) == 1000  # full, rows barely waited: keep
    assert batch.after_claim(1000, 1000, waiting=500, oldest_wait_s=2.0) == 500  # rows wait for a handler
    assert batch.after_claim(500, 120, waiting=0, oldest_wait_s=0.0) == 250  # short claim
    for _ in range(20):
        batch.after_claim(batch.size, 0, waiting=0, oldest_wait_s=0.0)
    assert batch.size == 1


def test_breaker_opens_after_distinct_failures_probes_and_grows_its_cooldown() -> None:
    """5 distinct transient failures open it; after the cool-down one probe; a failed probe doubles the cool-down."""
    now = [0.0]
    breaker = Breaker(5, 30, 120, clock=lambda: now[0])
    for _ in range(10):
        breaker.on_transient("same-payment")  # one payment failing alone is not an outage
    assert breaker.state == CLOSED
    for i in range(5):
        breaker.on_transient(f"p{i}")
    assert breaker.state == OPEN and not breaker.allow_call()
    now[0] = 29.9
    assert not breaker.allow_call()
    now[0] = 30.0
    assert breaker.allow_call() and breaker.state == HALF_OPEN
    assert not breaker.allow_call()  # one probe at a time
    breaker.on_transient("probe")
    assert breaker.state == OPEN and breaker.cooldown_s == 60
    now[0] = 90.0
    assert breaker.allow_call()
    breaker.on_transient("probe")
    now[0] = 90.0 + 120
    assert breaker.cooldown_s == 120 and breaker.allow_call()  # capped at max_cooldown_s
    breaker.on_answer()
    assert breaker.state == CLOSED and breaker.cooldown_s == 30 and breaker.opened == 3


# --- priorities with aging --------------------------------------------------------------------------


def test_aging_claims_an_old_low_priority_payment_before_fresh_high_priority_ones(engine: sa.Engine) -> None:
    """A payment due for 3 h at priority 0 beats fresh priority-5 payments; among fresh ones priority 5 beats 0."""
    queue.enqueue(engine, 20, seed=31, priority=0)
    queue.enqueue(engine, 20, seed=32, priority=5)
    with engine.begin() as conn:
        old = conn.execute(
            sa.text(
                "INSERT INTO payments (id, amount_cents, next_attempt_at) "
                "VALUES (gen_random_uuid(), 1, now() - interval '3 hours') RETURNING id"
            )
        ).scalar_one()
    [first] = PAYMENTS.claim(engine, 1, lease_s=60)
    assert first.id == old
    batch = PAYMENTS.claim(engine, 20, lease_s=60)
    with engine.connect() as conn:
        priorities = conn.execute(
            sa.text("SELECT priority FROM payments WHERE id = ANY(:ids)"), {"ids": [c.id for c in batch]}
        ).scalars().all()
    assert priorities == [5] * 20


def test_enqueue_rejects_a_priority_outside_smallint(engine: sa.Engine) -> None:
    """A priority that does not fit the column is a ConfigError naming the field; nothing is inserted."""
    with pytest.raises(ConfigError) as info:
        queue.enqueue(engine, 3, priority=40_000)
    assert info.value.field == "priority"
    assert _statuses(engine) == {}


@pytest.mark.slow
def test_claim_is_an_index_scan_with_a_million_queued_payments(engine: sa.Engine) -> None:
    """With 1M NEW rows the claim reads payments_claim_rank_idx in order and never scans or sorts the table."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO payments (id, amount_cents, priority, next_attempt_at) "
                "SELECT gen_random_uuid(), 100, (g % 7)::smallint, now() - (g % 7200) * interval '1 second' "
                "FROM generate_series(1, 1000000) AS g"
            )
        )
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE payments"))
        [plan] = conn.exec_driver_sql(
            "EXPLAIN (FORMAT JSON) " + sql.CLAIM, {"n": 100, "lease_s": 60.0, "token": uuid.uuid4()}
        ).scalar_one()

    nodes: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    scans = {(n["Node Type"], n.get("Index Name")) for n in nodes if "Scan" in n["Node Type"]}
    assert ("Index Scan", "payments_claim_rank_idx") in scans, scans
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], scans
    # The only sort is the merge of the three branches' at most 3 x 100 rows, never the queue.
    assert all(n.get("Plan Rows", 0) <= 300 for n in nodes if n["Node Type"] == "Sort"), nodes


# --- notifications ------------------------------------------------------------------------------------


def test_one_copy_sends_one_notification_from_a_statement_level_trigger(engine: sa.Engine, db_url: str) -> None:
    """COPY of 1000 payments → exactly one notification on the channel (statement-level triggers)."""
    with engine.connect() as conn:
        row_level = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'payments'::regclass "
                "AND tgname LIKE 'payments_notify_due%' AND (tgtype & 1) = 1"
            )
        ).scalar_one()
        statement_level = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'payments'::regclass "
                "AND tgname LIKE 'payments_notify_due%' AND (tgtype & 1) = 0"
            )
        ).scalar_one()
    assert (row_level, statement_level) == (0, 2)
    with psycopg.connect(_conninfo(db_url), autocommit=True) as listener:
        listener.execute(sql.LISTEN_DUE)
        queue.enqueue(engine, 1000, seed=33)
        payloads = _notifications_until_marker(listener, db_url)
    assert payloads == ["", "marker"]


def test_no_notification_for_rows_due_later_or_claims(engine: sa.Engine, db_url: str) -> None:
    """Inserting a payment due in an hour, or claiming, sends nothing; giving a claim back does."""
    with psycopg.connect(_conninfo(db_url), autocommit=True) as listener:
        listener.execute(sql.LISTEN_DUE)
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO payments (id, amount_cents, next_attempt_at) "
                                 "VALUES (gen_random_uuid(), 5, now() + interval '1 hour')"))
        queue.enqueue(engine, 1, seed=34)  # one notification
        [claim] = PAYMENTS.claim(engine, 5, lease_s=60)  # none
        assert PAYMENTS.write_results(engine, [Result(claim, "NEW", undo=1)])  # given back, due now: one notification
        payloads = _notifications_until_marker(listener, db_url)
    assert payloads == ["", "", "marker"]


def test_idle_resident_worker_wakes_on_an_insert_by_another_connection(engine: sa.Engine, db_url: str) -> None:
    """An idle worker (poll 5 s) claims a row another connection inserts because the notification woke it."""
    stop = threading.Event()
    out: list[Any] = []
    calls: list[str] = []

    async def record(*, payment_id: str, amount_cents: int, attempts: int) -> None:
        calls.append(payment_id)

    handler = PluginHandler(record, concurrency=2)
    worker = threading.Thread(
        target=lambda: out.append(
            run_worker(engine, QueueSettings(concurrency=2, poll_interval_s=5), handler=handler, stop=stop,
                       drain=False)
        )
    )
    worker.start()
    try:
        with psycopg.connect(_conninfo(db_url), autocommit=True) as conn:
            wait_for(
                lambda: conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'batch_assets_listener' "
                    "AND query LIKE 'LISTEN%%' AND datname = current_database()"
                ).fetchone()[0],
                timeout=30, what="the worker to LISTEN",
            )
            pid = conn.execute(
                "INSERT INTO payments (id, amount_cents) VALUES (gen_random_uuid(), 7) RETURNING id"
            ).fetchone()[0]
        wait_for(lambda: _statuses(engine) == {"DONE": 1}, timeout=30, what="the payment to be DONE")
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive()
    [result] = out
    assert calls == [str(pid)]
    assert result.claimed_after["notify"] == 1, result
    assert result.notifications >= 1 and result.stopped_by == "stop"


# --- plug-in handlers ---------------------------------------------------------------------------------


PLUGIN = textwrap.dedent(
    """
    import asyncio
    import batch_assets

    seen = []

    def sync_handle(*, payment_id, amount_cents, attempts):
        seen.append((payment_id, amount_cents, attempts))
        if amount_cents % 3 == 0:
            raise batch_assets.PermanentFailure("rejected by plug-in")
        if amount_cents % 3 == 1:
            raise RuntimeError("flaky")

    async def async_handle(*, payment_id, amount_cents, attempts):
        await asyncio.sleep(0)
        sync_handle(payment_id=payment_id, amount_cents=amount_cents, attempts=attempts)

    not_callable = 42
    """
)


@pytest.mark.parametrize("function", ["sync_handle", "async_handle"])
def test_plugin_handler_done_permanent_and_transient(
    engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, function: str
) -> None:
    """Returning → DONE; PermanentFailure → FAILED at once; another exception → retry; kwargs as in the payment queue
    (docs/guide/payment-queue.md)."""
    module = f"ba_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    handler = load_plugin(f"{module}:{function}", concurrency=4)
    assert handler.is_async == (function == "async_handle")
    with engine.begin() as conn:  # amounts 3..11: three of each remainder, fewer than 5 transient failures
        conn.execute(sa.text("INSERT INTO payments (id, amount_cents) "
                             "SELECT gen_random_uuid(), a FROM generate_series(3, 11) AS a"))
    result = run_worker(engine, QueueSettings(concurrency=4), handler=handler)
    assert (result.done, result.failed, result.retried) == (3, 3, 3)
    assert result.failed_by_type == {"permanent_failure": 3}
    with engine.connect() as conn:
        got = {r.amount_cents: r for r in conn.execute(sa.text("SELECT * FROM payments"))}
    for amount, row in got.items():
        expected = {0: "FAILED", 1: "NEW", 2: "DONE"}[amount % 3]
        assert row.status == expected and row.attempts == 1, row
    assert "rejected by plug-in" in got[3].last_error and "RuntimeError: flaky" in got[4].last_error
    seen = sys.modules[module].seen
    assert sorted(a for _, a, _ in seen) == list(range(3, 12))
    assert {(pid, attempts) for pid, _, attempts in seen} == {(str(r.id), 1) for r in got.values()}


def test_unimportable_or_uncallable_plugin_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A value that is not module:function, not importable, missing or not callable names the variable."""
    module = f"ba_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("no_colon", "ba_no_such_module_xyz:handle", f"{module}:missing", f"{module}:not_callable"):
        with pytest.raises(ConfigError) as info:
            load_plugin(spec)
        assert info.value.field == "BATCH_ASSETS_PAYMENT_HANDLER", spec


def test_db_outage_s_has_an_upper_bound() -> None:
    """db_outage_s: missing is the default 60 s; above 600 s is a ConfigError naming the field."""
    assert QueueSettings().db_outage_s == 60
    assert QueueSettings(db_outage_s=600).db_outage_s == 600
    with pytest.raises(ConfigError) as info:
        QueueSettings(db_outage_s=601)
    assert info.value.field == "db_outage_s"


def test_psycopg_errors_are_classified_like_their_sqlalchemy_wrappers(db_url: str, admin_engine: sa.Engine) -> None:
    """is_transient: a terminated backend and a closed connection are transient; a constraint violation is not."""
    conn = psycopg.connect(_conninfo(db_url), autocommit=True)
    try:
        with pytest.raises(psycopg.errors.UniqueViolation) as duplicate:
            conn.execute("CREATE TEMP TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (1)")
        assert not is_transient(duplicate.value)
        pid = conn.info.backend_pid
        with admin_engine.connect() as admin:
            admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(psycopg.OperationalError) as terminated:
            conn.execute("SELECT 1")
        assert is_transient(terminated.value), terminated.value
        with pytest.raises(psycopg.Error) as closed:
            conn.execute("SELECT 1")  # the connection is closed now
        assert is_transient(closed.value), closed.value
    finally:
        conn.close()


# --- crashes and outages (real processes, a local HTTP stub) -----------------------------------------


@pytest.mark.slow
def test_kill_9_in_the_middle_of_a_bulk_flush(engine: sa.Engine, db_url: str, stub: LimitsStub, tmp_path: Path) -> None:
    """kill -9 while a result flush waits: afterwards every payment is DONE once and none is POSTed more than twice."""
    queue.enqueue(engine, 200, seed=35)
    gate_seen, gate_open = threading.Event(), threading.Event()
    gate: list[str] = []

    def answer(body: dict[str, Any]) -> int:
        pid = str(body["payment_id"])
        with stub.lock:
            first = not gate
            if first:
                gate.append(pid)
        if first:
            gate_seen.set()
            gate_open.wait(timeout=60)  # held until the test has locked this payment's row
        return 200

    stub.respond = answer
    knobs = {"concurrency": 8, "batch_size": 20, "claim_lease_s": 4, "http_timeout_s": 2, "poll_interval_s": 0.5}
    first = WorkerProcess(db_url, stub.url, knobs, tmp_path)
    blocker = psycopg.connect(_conninfo(db_url))
    try:
        assert gate_seen.wait(timeout=60), "the worker never called the stub"
        # Lock the gated payment's row: the flush that carries its result must wait on it.
        blocker.execute("SELECT 1 FROM payments WHERE id = %s FOR UPDATE", (uuid.UUID(gate[0]),))
        gate_open.set()
        with psycopg.connect(_conninfo(db_url), autocommit=True) as watch:
            flushing = wait_for(
                lambda: watch.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'batch_assets_worker' "
                    "AND wait_event_type = 'Lock' AND query LIKE '%%unnest%%'"
                ).fetchone(),
                timeout=30, what="a result flush blocked on the locked row",
            )
            os.killpg(first.popen.pid, signal.SIGKILL)
            first.popen.wait(timeout=30)
            # The worker is gone mid-statement; end its session too, so the flush is lost, not committed.
            watch.execute("SELECT pg_terminate_backend(%s)", (flushing[0],))
        blocker.rollback()
        with engine.connect() as conn:
            in_flight = {str(r[0]) for r in conn.execute(
                sa.text("SELECT id FROM payments WHERE status = 'PROCESSING'")).all()}
        assert gate[0] in in_flight
        second = WorkerProcess(db_url, stub.url, knobs, tmp_path)
        try:
            wait_for(lambda: _statuses(engine) == {"DONE": 200}, timeout=90, what="every payment DONE")
            summary = second.stop()
        finally:
            second.kill_group()
    finally:
        blocker.close()
        first.kill_group()
    assert summary["lost_claims"] == 0
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, attempts FROM payments")).all()
    assert max(stub.count(r.id) for r in rows) <= 2
    assert stub.count(gate[0]) == 2  # its DONE was lost in the crash, so it was processed again
    assert all(r.attempts <= 2 for r in rows)
    twice = {str(r.id) for r in rows if stub.count(r.id) == 2}
    assert twice <= in_flight  # only payments held by the killed worker were called again


@pytest.mark.slow
def test_breaker_an_8_second_outage_fails_nothing_and_costs_at_most_one_attempt(
    engine: sa.Engine, db_url: str, stub: LimitsStub, tmp_path: Path
) -> None:
    """The stub answers 503 for 8 s: afterwards nothing is FAILED and no payment has more than 2 attempts."""
    queue.enqueue(engine, 40, seed=36)
    outage_until: list[float] = []

    def answer(body: dict[str, Any]) -> int:
        with stub.lock:
            if not outage_until:
                outage_until.append(time.monotonic() + 8)
        return 503 if time.monotonic() < outage_until[0] else 200

    stub.respond = answer
    # Without the breaker, 3 attempts 0.5-1 s apart would send payments to FAILED within the outage.
    knobs = {
        "concurrency": 4, "batch_size": 4, "max_attempts": 3, "backoff_base_s": 0.5, "backoff_max_s": 1,
        "http_timeout_s": 1, "claim_lease_s": 5, "poll_interval_s": 0.5,
        "breaker_cooldown_s": 1, "breaker_max_cooldown_s": 2,
    }
    worker = WorkerProcess(db_url, stub.url, knobs, tmp_path)
    try:
        wait_for(lambda: _statuses(engine) == {"DONE": 40}, timeout=90, what="every payment DONE")
        summary = worker.stop()
    finally:
        worker.kill_group()
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, attempts FROM payments")).all()
    assert max(r.attempts for r in rows) <= 2
    # Every call that was made spent its attempt; claims never called while it was open spent none.
    assert all(stub.count(r.id) == r.attempts for r in rows), [(r.attempts, stub.count(r.id)) for r in rows]
    assert summary["failed"] == 0 and summary["breaker_opened"] >= 1, summary
    assert summary["released"] > 0  # claims given back unspent while it was open
    assert sum(stub.posts.values()) > 40  # the outage really happened


def test_poison_payments_reach_failed_after_max_attempts_while_good_ones_go_done(
    engine: sa.Engine, stub: LimitsStub
) -> None:
    """10 payments the limits service always answers 500, claimed first among 200 good ones, open the breaker;
    still each is POSTed exactly max_attempts times and FAILED with attempts == max_attempts, and every good
    payment is DONE after one POST (a call that was made always spends its attempt: docs/guide/payment-queue.md)."""
    with engine.begin() as conn:
        poison = [r[0] for r in conn.execute(sa.text(
            "INSERT INTO payments (id, amount_cents, priority) SELECT gen_random_uuid(), 100, 10"
            " FROM generate_series(1, 10) RETURNING id"))]
    queue.enqueue(engine, 200, seed=44)
    bad = {str(p) for p in poison}
    stub.respond = lambda body: 500 if body["payment_id"] in bad else 200
    settings = QueueSettings(
        concurrency=8, batch_size=16, max_attempts=3, backoff_base_s=0.2, backoff_max_s=0.4, http_timeout_s=2,
        claim_lease_s=30, poll_interval_s=0.2, breaker_failures=5, breaker_cooldown_s=0.5, breaker_max_cooldown_s=1,
    )
    stop = threading.Event()
    out: list[Any] = []
    handler = HttpLimitsHandler(stub.url, settings.http_timeout_s, max_connections=settings.concurrency)
    worker = threading.Thread(
        target=lambda: out.append(run_worker(engine, settings, handler=handler, stop=stop, drain=False)))
    worker.start()
    try:
        wait_for(lambda: _statuses(engine) == {"DONE": 200, "FAILED": 10}, timeout=60,
                 what="poison FAILED and good DONE")
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive()
    [result] = out
    assert result.breaker_opened >= 1, result  # the poison payments, failing together, did open it
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, status, attempts, last_error FROM payments")).all()
    for row in rows:
        if str(row.id) in bad:
            assert (row.status, row.attempts, stub.count(row.id)) == ("FAILED", 3, 3), row
            assert row.last_error == "limits service answered HTTP 500"
        else:
            assert (row.status, row.attempts, stub.count(row.id)) == ("DONE", 1, 1), row
    assert result.failed_by_type == {"http_500": 10}


@pytest.mark.slow
def test_queue_bench_quick_shape_and_every_payment_done_once(db_url: str) -> None:
    """run_queue_bench (quick) returns the documented shape and every product payment ended DONE, claimed once."""
    from batch_assets.bench.payments import run_queue_bench

    lines: list[str] = []
    result = run_queue_bench(db_url, payments=2000, quick=True, progress=lines.append)
    assert {"payments", "worker_processes", "product_per_s", "floor_per_s", "ratio", "pickup_latency_ms",
            "http_stub"} <= set(result)
    assert result["payments"] == 2000 and result["worker_processes"] == 2
    assert result["product_per_s"] > 0 and result["floor_per_s"] > 0
    assert result["ratio"] == pytest.approx(result["product_per_s"] / result["floor_per_s"], rel=0.01)
    assert set(result["pickup_latency_ms"]) == {"p50", "p99", "samples"}
    assert result["pickup_latency_ms"]["samples"] == 30
    assert 0 < result["pickup_latency_ms"]["p50"] <= result["pickup_latency_ms"]["p99"]
    http = result["http_stub"]
    assert (http["latency_ms"], http["concurrency"], http["target_per_s"]) == (50, 64, 1024.0)
    assert http["per_s"] > 0
    assert result["checks"]["product"] == {"done": 2000, "rows": 2000, "max_attempts": 1}
    assert result["checks"]["http_stub"]["done"] == http["payments"]
    assert len(lines) == 7  # floor, floor async, product, pickup, HTTP stub, rate-limit accuracy, its cost
    assert result["floor_async_commit_per_s"] > 0
    rate = result["rate_limit"]  # 2 processes sharing 100/s for 4 s; the cost over the section's 2000 payments
    assert (rate["limit_per_s"], rate["worker_processes"], rate["calls"]) == (100.0, 2, 400)
    assert 0 < rate["window_1s"]["min"] <= rate["window_1s"]["max"] and rate["statements_per_call"] > 0
    assert rate["cost"]["payments"] == 2000 and rate["cost"]["ratio"] > 0
    with psycopg.connect(_conninfo(db_url)) as conn:
        assert conn.execute("SELECT count(*) FROM payments").fetchone()[0] == 0  # it removed its rows


def test_stop_gives_back_calls_that_outlive_the_drain_timeout(engine: sa.Engine) -> None:
    """On stop, a call still running after drain_timeout_s is cancelled and its claim given back (NEW, unspent)."""
    queue.enqueue(engine, 1, seed=37)
    started, stop = threading.Event(), threading.Event()

    async def hang(*, payment_id: str, amount_cents: int, attempts: int) -> None:
        started.set()
        await asyncio.Event().wait()  # a call that never returns by itself

    out: list[Any] = []
    settings = QueueSettings(concurrency=1, drain_timeout_s=0.5, http_timeout_s=30, claim_lease_s=60)
    worker = threading.Thread(
        target=lambda: out.append(run_worker(engine, settings, handler=PluginHandler(hang), stop=stop, drain=False))
    )
    worker.start()
    try:
        assert started.wait(timeout=30), "the handler was never called"
        stop.set()
        worker.join(timeout=30)
    finally:
        stop.set()
        worker.join(timeout=30)
    assert not worker.is_alive()
    assert (out[0].released, out[0].done, out[0].stopped_by) == (1, 0, "stop")
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT status, attempts, claim_token FROM payments")).one()
    assert (row.status, row.attempts, row.claim_token) == ("NEW", 0, None)

