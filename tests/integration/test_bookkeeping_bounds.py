"""Bookkeeping transactions are bounded and checkpoints are fenced.

Checkpoint, lock, lease and run-history transactions carry a statement and a lock timeout (db.timeouts.bounded):
a table another session holds locked makes them fail within the lock timeout, not hang the run. A checkpoint store
bound to a run's lease writes only while the lease is the run's, checked in the same statement as the write: a run
whose lease was taken over can neither move its checkpoint nor mark its range DONE."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from batch_assets.db.timeouts import BOOKKEEPING_LOCK_S
from batch_assets.errors import LeaseLost, LockStoreUnavailable
from batch_assets.locking import CheckpointStore
from batch_assets.locking.lease import Lease, steal_lease
from batch_assets.locking.lock import PostgresJobLock
from batch_assets.orchestration.sweep_job.summaries import record_range

pytestmark = pytest.mark.integration

SWEEP = "loyalty_tier"
OWNER = "run-a@host:1"


def save(store: CheckpointStore, cursor: str) -> None:
    store.save(SWEEP, "full", "r0", cursor=cursor, fingerprint="fp", run_id="run-a", run_date=date(2026, 12, 1),
               counters={"scanned": 10})


def test_a_run_that_lost_its_lease_cannot_move_its_checkpoint_nor_mark_it_done(engine: sa.Engine) -> None:
    """After a takeover, the old owner's save and complete raise LeaseLost and change nothing; the new owner's
    store writes."""
    assert Lease(engine, SWEEP, OWNER, 30).acquire()
    mine = CheckpointStore(engine).in_generation("g1").fenced_by(SWEEP, OWNER)
    save(mine, "k-100")
    assert steal_lease(engine, SWEEP, "run-b@host:2", 30) == OWNER

    with pytest.raises(LeaseLost):
        save(mine, "k-900")
    with pytest.raises(LeaseLost):
        mine.complete(SWEEP, "full", "r0")
    [kept] = CheckpointStore(engine).list(SWEEP)
    assert (kept.cursor, kept.status, kept.generation) == ("k-100", "RUNNING", "g1")

    theirs = CheckpointStore(engine).in_generation("g1").fenced_by(SWEEP, "run-b@host:2")
    save(theirs, "k-200")
    theirs.complete(SWEEP, "full", "r0")
    [moved] = CheckpointStore(engine).list(SWEEP)
    assert (moved.cursor, moved.status) == ("k-200", "DONE")


def test_an_expired_lease_fences_too(engine: sa.Engine) -> None:
    """A lease that expired (nobody took it over yet) is no longer the run's: its checkpoint is not written."""
    assert Lease(engine, SWEEP, OWNER, 30).acquire()
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE ba_leases SET expires_at = clock_timestamp() - interval '1 second'"))
    with pytest.raises(LeaseLost):
        save(CheckpointStore(engine).fenced_by(SWEEP, OWNER), "k-1")
    assert CheckpointStore(engine).list(SWEEP) == []


@pytest.fixture
def locked(engine: sa.Engine) -> Iterator[Callable[[str], Callable[[], None]]]:
    """`locked(table)`: another session holds `table` ACCESS EXCLUSIVE until the returned function (or the test's
    end) releases it."""
    held: list[sa.Connection] = []

    def release() -> None:
        while held:
            conn = held.pop()
            conn.rollback()
            conn.close()

    def lock(table: str) -> Callable[[], None]:
        conn = engine.connect()
        held.append(conn)
        conn.exec_driver_sql(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")  # a constant name of the test's
        return release

    yield lock
    release()


def fails_within(work: Callable[[], object], seconds: float, release: Callable[[], None]) -> BaseException:
    """Run `work` in a thread; it must raise within `seconds` (else `release` frees it and the test fails)."""
    box: dict[str, BaseException] = {}

    def target() -> None:
        try:
            work()
        except BaseException as exc:  # what the test checks
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        release()
        thread.join(30)
        pytest.fail(f"still waiting after {seconds} s: the transaction is not bounded")
    assert "error" in box, "it succeeded although the table was locked"
    assert time.monotonic() - started >= BOOKKEEPING_LOCK_S * 0.8, "it failed before its lock timeout"
    return box["error"]


def _task() -> SimpleNamespace:
    return SimpleNamespace(index=0, count=1, started_at=datetime.now(UTC), mode="full", run_date=date(2026, 12, 1))


OPERATIONS: dict[str, tuple[str, Callable[[sa.Engine], object]]] = {
    "checkpoint save": ("ba_checkpoints", lambda e: save(CheckpointStore(e).fenced_by(SWEEP, OWNER), "k-1")),
    "checkpoint complete": ("ba_checkpoints", lambda e: CheckpointStore(e).fenced_by(SWEEP, OWNER).complete(
        SWEEP, "full", "r0")),
    "job lock": ("ba_job_locks", lambda e: PostgresJobLock(e).acquire(SWEEP, OWNER, 60)),
    "lease renewal": ("ba_leases", lambda e: Lease(e, SWEEP, OWNER, 30).heartbeat()),
    "run history": ("ba_run_history", lambda e: record_range(
        e, run_id="run-a", job=SWEEP, summary={"status": "SUCCESS", "range": "r0"}, task=_task())),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_bookkeeping_transaction_fails_within_its_lock_timeout(
    engine: sa.Engine, locked: Callable[[str], Callable[[], None]], operation: str
) -> None:
    """Its table locked by another session: the statement fails after its lock timeout (lock_not_available, or the
    lock store reported unavailable), instead of waiting for as long as the other session likes."""
    table, work = OPERATIONS[operation]
    assert Lease(engine, SWEEP, OWNER, 30).acquire()
    release = locked(table)
    error = fails_within(lambda: work(engine), BOOKKEEPING_LOCK_S + 5, release=release)
    sqlstate = getattr(getattr(error, "orig", None), "sqlstate", None)
    assert sqlstate == "55P03" or isinstance(error, LockStoreUnavailable), repr(error)
    assert isinstance(error, LockStoreUnavailable) == (operation == "job lock")
