"""Payment rows other services may write (docs/reference/tables.md): each gets a counted, named outcome, none is lost
and none stops the worker. Real PostgreSQL; rows are inserted by another connection, while a worker runs
where it matters."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from helpers import wait_for

from batch_assets.queue.breaker import CLOSED
from batch_assets.queue.claims import ERROR_MAX_BYTES
from batch_assets.queue.settings import QueueSettings
from batch_assets.queue.store import DLQ_ERROR_CHARS
from batch_assets.reference.payments import queue, sql
from batch_assets.reference.payments.handler import PluginHandler
from batch_assets.reference.payments.store import PAYMENTS
from batch_assets.reference.payments.worker import run_worker

pytestmark = pytest.mark.integration

INT_MAX = 2**31 - 1


def _conninfo(db_url: str) -> str:
    return sa.engine.make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)


def _insert(db_url: str, rows: list[dict[str, Any]]) -> list[uuid.UUID]:
    """Insert `rows` (column → value; id added) from a connection of its own, as another service does."""
    ids = []
    with psycopg.connect(_conninfo(db_url), autocommit=True) as conn:
        for row in rows:
            pid = uuid.uuid4()
            cols = {"id": pid, **row}
            names = ", ".join(cols)
            marks = ", ".join(f"%({c})s" for c in cols)
            conn.execute(f"INSERT INTO payments ({names}) VALUES ({marks})", cols)  # column names are the test's own
            ids.append(pid)
    return ids


def _rows(engine: sa.Engine) -> dict[uuid.UUID, sa.Row[Any]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, status, attempts, last_error FROM payments")).all()
    return {r.id: r for r in rows}


class Recorder:
    """A plug-in handler (docs/guide/payment-queue.md: own handlers): records (payment_id, attempts) per call; raises
    RuntimeError("limits busy") for the ids in `failing`."""

    def __init__(self, failing: set[str] | None = None) -> None:
        self.failing = failing or set()
        self.calls: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def __call__(self, *, payment_id: str, amount_cents: int, attempts: int) -> None:
        with self.lock:
            self.calls.append((payment_id, attempts))
        if payment_id in self.failing:
            raise RuntimeError("limits busy")

    def count(self, payment_id: object) -> int:
        with self.lock:
            return sum(1 for p, _ in self.calls if p == str(payment_id))


def test_a_processing_row_without_a_lease_is_due_stuck_and_claimed(engine: sa.Engine, db_url: str) -> None:
    """PROCESSING with claimed_until NULL counts as a lapsed claim: due and stuck in stats, claimed, not refused."""
    [orphan] = _insert(db_url, [{"amount_cents": 500, "status": "PROCESSING", "claimed_until": None}])
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE payments SET next_attempt_at = now() - interval '30 seconds'"))
    stats = queue.queue_stats(engine)
    assert (stats["due"], stats["stuck_processing"]) == (1, 1), stats
    assert stats["oldest_due_s"] >= 30
    with engine.connect() as conn:
        assert conn.exec_driver_sql(sql.NEXT_DUE_IN).scalar_one() <= 0
        assert conn.execute(sql.STUCK_PAYMENTS_SQL).one()[0] == 1
    [claim] = PAYMENTS.claim(engine, 10, lease_s=60)
    assert (claim.id, claim.attempts, claim.lapsed) == (orphan, 1, False)
    assert queue.queue_stats(engine)["stuck_processing"] == 0


def test_rows_without_a_lease_inserted_while_a_resident_worker_runs_are_processed(
    engine: sa.Engine, db_url: str
) -> None:
    """Another connection inserts PROCESSING rows with claimed_until NULL (one with attempts past the maximum)
    while a resident worker runs: the insert wakes it (notification), each gets one call and is DONE, none is
    FAILED as 'claim lapsed repeatedly'."""
    queue.enqueue(engine, 20, seed=41)
    handler_fn = Recorder()
    stop = threading.Event()
    out: list[Any] = []
    settings = QueueSettings(concurrency=4, max_attempts=3, poll_interval_s=5)
    worker = threading.Thread(target=lambda: out.append(
        run_worker(engine, settings, handler=PluginHandler(handler_fn, concurrency=4), stop=stop, drain=False)))
    worker.start()
    try:
        wait_for(lambda: queue.queue_stats(engine)["by_status"]["DONE"] == 20, timeout=30, what="the first 20 DONE")
        orphans = _insert(db_url, [
            {"amount_cents": 700, "status": "PROCESSING", "claimed_until": None, "attempts": 0},
            {"amount_cents": 800, "status": "PROCESSING", "claimed_until": None, "attempts": 9},
        ])
        wait_for(lambda: queue.queue_stats(engine)["by_status"]["DONE"] == 22, timeout=30,
                 what="the rows without a lease DONE")
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive()
    [result] = out
    assert result.failed == 0 and result.status == "SUCCESS", result
    assert result.claimed_after["notify"] >= 1, result  # woken by the inserts (migration 0006), not the poll
    assert [handler_fn.count(o) for o in orphans] == [1, 1]
    rows = _rows(engine)
    assert [rows[o].attempts for o in orphans] == [1, 10]


def test_a_new_row_gets_its_call_whatever_its_attempts(engine: sa.Engine, db_url: str) -> None:
    """NEW rows inserted with attempts at, past or far past the maximum, or negative, are each called once in
    one claim (no overflow): DONE on success, FAILED with the call's own error on a transient failure."""
    ids = _insert(db_url, [
        {"amount_cents": 100, "attempts": 3},  # at the maximum
        {"amount_cents": 100, "attempts": 50},  # past it, and its call fails
        {"amount_cents": 100, "attempts": INT_MAX},  # attempts + 1 would overflow int
        {"amount_cents": 100, "attempts": -7},  # taken as 0
        {"amount_cents": 100},
    ])
    handler_fn = Recorder(failing={str(ids[1])})
    result = run_worker(engine, QueueSettings(max_attempts=3, batch_size=10),
                        handler=PluginHandler(handler_fn, concurrency=2))
    assert Counter(p for p, _ in handler_fn.calls) == {str(i): 1 for i in ids}
    assert dict(handler_fn.calls)[str(ids[3])] == 1  # the negative count started over
    rows = _rows(engine)
    assert [rows[i].status for i in ids] == ["DONE", "FAILED", "DONE", "DONE", "DONE"]
    assert rows[ids[1]].last_error == "RuntimeError: limits busy"
    assert [rows[i].attempts for i in ids] == [4, 51, INT_MAX, 1, 1]
    assert result.failed_by_type == {"handler_RuntimeError": 1}


def test_amounts_that_are_no_payment_are_failed_without_a_call(engine: sa.Engine, db_url: str) -> None:
    """amount_cents zero, negative or beyond 2^53 - 1 (not exact in JSON) is FAILED as invalid_amount with no call
    and no effect on the breaker; 1 and 2^53 - 1 are called."""
    bad = _insert(db_url, [{"amount_cents": a} for a in (0, -1, -(2**63), 2**53, 2**63 - 1)])
    good = _insert(db_url, [{"amount_cents": a} for a in (1, 2**53 - 1)])
    handler_fn = Recorder()
    result = run_worker(engine, QueueSettings(breaker_failures=2), handler=PluginHandler(handler_fn))
    assert sorted(p for p, _ in handler_fn.calls) == sorted(str(i) for i in good)
    rows = _rows(engine)
    assert {rows[i].status for i in bad} == {"FAILED"} and {rows[i].status for i in good} == {"DONE"}
    assert all("amount_cents" in rows[i].last_error for i in bad)
    assert result.failed_by_type == {"invalid_amount": 5}
    assert result.breaker == CLOSED and result.breaker_opened == 0


def test_unknown_statuses_are_never_claimed_and_are_counted_by_name(engine: sa.Engine, db_url: str) -> None:
    """Statuses outside the tables (docs/reference/tables.md)'s four ('new', 'PENDING', 'NEW ') are left alone and
    counted, by name and in total."""
    _insert(db_url, [{"amount_cents": 100, "status": s} for s in ("new", "PENDING", "NEW ")])
    result = run_worker(engine, QueueSettings(), handler=PluginHandler(Recorder()))
    assert result.claimed == 0
    stats = queue.queue_stats(engine)
    assert stats["unknown_status"] == 3 and stats["total"] == 3
    assert {k: v for k, v in stats["by_status"].items() if v} == {"new": 1, "PENDING": 1, "NEW ": 1}


def test_last_error_is_bounded_in_bytes_when_written_and_when_listed(engine: sa.Engine, db_url: str) -> None:
    """A handler error of a million multi-byte characters is stored clipped to ERROR_MAX_BYTES bytes; a huge
    last_error another service wrote is listed by dlq_list cut to DLQ_ERROR_CHARS characters."""
    [ours] = _insert(db_url, [{"amount_cents": 100}])

    def huge(*, payment_id: str, amount_cents: int, attempts: int) -> None:
        raise RuntimeError("é" * 1_000_000)

    run_worker(engine, QueueSettings(max_attempts=1), handler=PluginHandler(huge))
    with engine.connect() as conn:
        status, size, text = conn.execute(
            sa.text("SELECT status, octet_length(last_error), last_error FROM payments WHERE id = :id"), {"id": ours}
        ).one()
    assert status == "FAILED" and 0 < size <= ERROR_MAX_BYTES
    assert text.startswith("RuntimeError: éé") and text.endswith("…")
    [theirs] = _insert(db_url, [{"amount_cents": 100, "status": "FAILED", "last_error": "x" * 5_000_000}])
    listed = {r["id"]: r for r in queue.dlq_list(engine)}
    assert len(listed[theirs]["last_error"]) == DLQ_ERROR_CHARS


def test_infinite_times_neither_crash_the_worker_nor_stats_and_are_counted(engine: sa.Engine, db_url: str) -> None:
    """next_attempt_at '-infinity' is due (claimed, DONE); 'infinity' on next_attempt_at or claimed_until never
    comes (counted as never_due); a worker drains past them and stats and dlq list stay readable."""
    [early, never, held, listed] = _insert(db_url, [
        {"amount_cents": 100, "next_attempt_at": "-infinity"},
        {"amount_cents": 100, "next_attempt_at": "infinity"},
        {"amount_cents": 100, "status": "PROCESSING", "claimed_until": "infinity"},
        {"amount_cents": 100, "status": "FAILED", "created_at": "infinity", "processed_at": "-infinity"},
    ])
    stats = queue.queue_stats(engine)
    assert stats["due"] == 1 and stats["never_due"] == 2, stats
    assert stats["oldest_due_s"] > 99 * 365 * 86400  # due since forever, shown as 100 years
    handler_fn = Recorder()
    result = run_worker(engine, QueueSettings(), handler=PluginHandler(handler_fn))
    assert result.status == "SUCCESS" and result.stopped_by == "drained", result
    assert [p for p, _ in handler_fn.calls] == [str(early)]
    rows = _rows(engine)
    assert [rows[i].status for i in (early, never, held)] == ["DONE", "NEW", "PROCESSING"]
    after = queue.queue_stats(engine)
    assert (after["never_due"], after["due"], after["oldest_due_s"]) == (2, 0, 0), after
    [item] = queue.dlq_list(engine)
    assert (item["id"], item["created_at"], item["processed_at"]) == (listed, None, None)


def test_a_handler_that_exits_is_a_transient_failure_counted_by_kind(engine: sa.Engine, db_url: str) -> None:
    """`sys.exit(...)` in a team's handler (SystemExit, a BaseException) ends neither the worker nor the run: the row
    is retried later with the handler's text as its last_error, and the run counts it under `handler_SystemExit`
    in retried_by_type; the other rows are DONE."""
    ids = _insert(db_url, [{"amount_cents": 100 + i} for i in range(6)])
    exiting = {str(ids[1]), str(ids[4])}

    def handler_fn(*, payment_id: str, amount_cents: int, attempts: int) -> None:
        if payment_id in exiting:
            raise SystemExit(f"cents={amount_cents}")

    result = run_worker(engine, QueueSettings(max_attempts=3, batch_size=10),
                        handler=PluginHandler(handler_fn, concurrency=2))
    assert (result.status, result.done, result.retried, result.failed) == ("SUCCESS", 4, 2, 0), result
    assert result.retried_by_type == {"handler_SystemExit": 2} and not result.failed_by_type
    assert result.to_summary("r")["retried_by_type"] == {"handler_SystemExit": 2}
    rows = _rows(engine)
    assert sorted((rows[i].status, rows[i].attempts) for i in ids) == [("DONE", 1)] * 4 + [("NEW", 1)] * 2
    assert rows[ids[1]].last_error == "SystemExit: cents=101"
