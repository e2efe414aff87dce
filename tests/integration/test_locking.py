"""The PostgreSQL job lock and job_guard (lock + lease + heartbeat) on a real database."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from helpers import GuardCfg, wait_for

from batch_assets.db.engine import create_engine
from batch_assets.errors import EXIT_SKIPPED, ConfigError, LeaseLost, LockNotAcquired, LockStoreUnavailable
from batch_assets.locking import (
    JobLock,
    Lease,
    PostgresJobLock,
    RedisJobLock,
    job_guard,
    lease_owner,
    make_job_lock,
    steal_lease,
)

pytestmark = pytest.mark.integration

DOWN_PG_URL = "postgresql+psycopg://postgres:s3cret@127.0.0.1:1/x"


@pytest.fixture
def lock(engine: sa.Engine) -> PostgresJobLock:
    return PostgresJobLock(engine)


@pytest.fixture
def down_engine() -> Iterator[sa.Engine]:
    engine = create_engine(DOWN_PG_URL, pool_size=1)
    yield engine
    engine.dispose()


def _seconds_left(engine: sa.Engine, name: str) -> float:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT extract(epoch FROM lock_until - now()) FROM ba_job_locks WHERE name = :n"), {"n": name}
        ).scalar_one()


# --- PostgresJobLock ---------------------------------------------------------------


def test_second_acquire_fails_while_held(lock: PostgresJobLock) -> None:
    """A second owner cannot take a live lock; the first stays the holder."""
    assert lock.acquire("sweep", "A", 30)
    assert not lock.acquire("sweep", "B", 30)
    assert not lock.acquire("sweep", "A", 30), "the lock is not re-entrant"
    assert lock.holder("sweep") == "A"
    assert lock.acquire("other", "B", 30), "another key is independent"


def test_acquire_succeeds_after_expiry(lock: PostgresJobLock) -> None:
    """Once lock_until passes (database clock), another owner takes the lock."""
    assert lock.acquire("sweep", "A", 1)
    assert not lock.acquire("sweep", "B", 30)
    wait_for(lambda: lock.acquire("sweep", "B", 30), what="expired lock to be taken")
    assert lock.holder("sweep") == "B"
    assert not lock.extend("sweep", "A", 30), "the old owner cannot extend"


def test_extend_only_by_owner(engine: sa.Engine, lock: PostgresJobLock) -> None:
    """Compare-and-extend: the owner pushes lock_until forward, another owner cannot."""
    assert lock.acquire("sweep", "A", 5)
    assert not lock.extend("sweep", "B", 60)
    assert _seconds_left(engine, "sweep") <= 5
    assert lock.extend("sweep", "A", 60)
    assert _seconds_left(engine, "sweep") > 50
    assert not lock.extend("missing", "A", 60)


def test_extend_fails_after_expiry(lock: PostgresJobLock) -> None:
    """An owner whose lock expired has lost it, even if nobody took it yet."""
    assert lock.acquire("sweep", "A", 1)
    wait_for(lambda: lock.holder("sweep") is None, what="lock to expire")
    assert not lock.extend("sweep", "A", 30)


def test_release_only_by_owner(lock: PostgresJobLock) -> None:
    """Compare-and-delete: only the holder's release frees the lock."""
    assert lock.acquire("sweep", "A", 30)
    assert not lock.release("sweep", "B")
    assert lock.holder("sweep") == "A"
    assert lock.release("sweep", "A")
    assert lock.holder("sweep") is None
    assert not lock.release("sweep", "A"), "a second release finds nothing"
    assert lock.acquire("sweep", "B", 30)


def test_lock_at_least_for_keeps_lock_after_release(engine: sa.Engine, lock: PostgresJobLock) -> None:
    """Releasing before locked_at + min_s keeps the lock until then, after which it is free."""
    assert lock.acquire("sweep", "A", 30, min_s=1.5)
    assert lock.release("sweep", "A")
    assert lock.holder("sweep") == "A#released", "kept for the minimum hold, marked as no longer held by a process"
    assert not lock.acquire("sweep", "B", 30)
    assert _seconds_left(engine, "sweep") <= 1.5, "release shortens the lock to the minimum hold"
    wait_for(lambda: lock.acquire("sweep", "B", 30), what="minimum hold to pass")
    assert lock.holder("sweep") == "B"


def test_lock_at_least_for_extends_to_at_least_min(engine: sa.Engine, lock: PostgresJobLock) -> None:
    """A lock is never shorter than its minimum hold, even with a smaller ttl."""
    assert lock.acquire("sweep", "A", 1, min_s=20)
    assert _seconds_left(engine, "sweep") > 15
    assert lock.extend("sweep", "A", 1)
    assert _seconds_left(engine, "sweep") > 15


def test_release_after_minimum_deletes(lock: PostgresJobLock) -> None:
    """With the minimum hold already over, release frees the lock at once."""
    assert lock.acquire("sweep", "A", 30, min_s=0)
    assert lock.release("sweep", "A")
    assert lock.acquire("sweep", "B", 30)


def test_pg_lock_store_down_raises_lock_store_unavailable(down_engine: sa.Engine) -> None:
    """Every operation on an unreachable PostgreSQL raises LockStoreUnavailable with one line and no password."""
    lock = PostgresJobLock(down_engine)
    for call in (
        lambda: lock.acquire("sweep", "A", 30),
        lambda: lock.extend("sweep", "A", 30),
        lambda: lock.release("sweep", "A"),
        lambda: lock.holder("sweep"),
    ):
        with pytest.raises(LockStoreUnavailable) as info:
            call()
        message = str(info.value)
        assert "127.0.0.1:1/x" in message
        assert "\n" not in message
        assert "s3cret" not in message


def test_make_job_lock_picks_backend(engine: sa.Engine) -> None:
    """Without a Redis URL the lock is the PostgreSQL table; with one it is Redis."""
    pg = make_job_lock(engine, None)
    assert isinstance(pg, PostgresJobLock)
    assert isinstance(pg, JobLock)
    redis_lock = make_job_lock(engine, "redis://127.0.0.1:6379/0")
    try:
        assert isinstance(redis_lock, RedisJobLock)
    finally:
        redis_lock.close()


# --- job_guard -------------------------------------------------------------------------


def test_second_guard_raises_lock_not_acquired(engine: sa.Engine) -> None:
    """While one run holds the guard, a second run is refused with exit 75 and touches nothing."""
    with job_guard(engine, job_key="customer_status", run_id="run-1", settings=GuardCfg()) as guard:
        with pytest.raises(LockNotAcquired) as info:
            with job_guard(engine, job_key="customer_status", run_id="run-2", settings=GuardCfg()):
                pytest.fail("the second guard must not enter")
        assert info.value.exit_code == EXIT_SKIPPED
        assert "run-1@" in str(info.value)
        assert lease_owner(engine, "customer_status") == guard.owner
        assert PostgresJobLock(engine).holder("customer_status") == guard.owner
        assert guard.alive()


def test_guard_refused_when_lease_held_by_live_owner(engine: sa.Engine) -> None:
    """A live lease of another owner refuses the run even with a free lock, and the lock is given back."""
    assert Lease(engine, "customer_status", "zombie@host:1", 30).acquire()
    with pytest.raises(LockNotAcquired, match="zombie@host:1"):
        with job_guard(engine, job_key="customer_status", run_id="run-1", settings=GuardCfg()):
            pytest.fail("must not enter")
    assert PostgresJobLock(engine).holder("customer_status") is None
    assert lease_owner(engine, "customer_status") == "zombie@host:1"


def test_guard_takes_over_expired_lease(engine: sa.Engine) -> None:
    """The lease of a crashed run is taken over once it expired."""
    assert Lease(engine, "customer_status", "crashed@host:1", 1).acquire()
    wait_for(lambda: lease_owner(engine, "customer_status") is None, what="crashed lease to expire")
    with job_guard(engine, job_key="customer_status", run_id="run-2", settings=GuardCfg()) as guard:
        assert lease_owner(engine, "customer_status") == guard.owner


def test_guard_releases_on_exception(engine: sa.Engine) -> None:
    """An exception in the block releases lease and lock and stops the heartbeat."""
    seen = {}
    with pytest.raises(RuntimeError, match="boom"):
        with job_guard(engine, job_key="customer_status", run_id="run-1", settings=GuardCfg()) as guard:
            seen["guard"] = guard
            raise RuntimeError("boom")
    assert lease_owner(engine, "customer_status") is None
    assert PostgresJobLock(engine).holder("customer_status") is None
    assert not seen["guard"].heartbeat.running


class Interrupted(BaseException):
    """Stands in for Dagster's DagsterExecutionInterruptedError (a BaseException)."""


def test_guard_releases_on_base_exception(engine: sa.Engine) -> None:
    """A BaseException (run termination) also releases lease and lock."""
    with pytest.raises(Interrupted):
        with job_guard(engine, job_key="customer_status", run_id="run-1", settings=GuardCfg()):
            raise Interrupted()
    assert lease_owner(engine, "customer_status") is None
    assert PostgresJobLock(engine).holder("customer_status") is None
    with job_guard(engine, job_key="customer_status", run_id="run-2", settings=GuardCfg()) as guard:
        assert guard.owner.startswith("run-2@")


def test_guard_keeps_lock_for_minimum_after_exit(engine: sa.Engine) -> None:
    """With lock_min_s, a run that ends quickly still blocks the next one until the minimum passes."""
    cfg = GuardCfg(lock_min_s=1.5)
    with job_guard(engine, job_key="expiry", run_id="run-1", settings=cfg):
        pass
    assert lease_owner(engine, "expiry") is None
    with pytest.raises(LockNotAcquired):
        with job_guard(engine, job_key="expiry", run_id="run-2", settings=cfg):
            pytest.fail("must not enter")
    wait_for(lambda: PostgresJobLock(engine).holder("expiry") is None, what="minimum hold to pass")
    with job_guard(engine, job_key="expiry", run_id="run-3", settings=cfg):
        pass


def test_guard_fail_closed_when_lock_store_down(engine: sa.Engine, down_engine: sa.Engine) -> None:
    """With the lock store down and lock_fail_open off, the guard raises before taking the lease."""
    with pytest.raises(LockStoreUnavailable):
        with job_guard(
            engine, job_key="customer_status", run_id="run-1", settings=GuardCfg(), lock=PostgresJobLock(down_engine)
        ):
            pytest.fail("must not enter")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM ba_leases")).scalar_one() == 0


def test_guard_fail_open_when_lock_store_down(
    engine: sa.Engine, down_engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """With lock_fail_open the guard warns, runs on the lease alone, and the lease still excludes others."""
    cfg = GuardCfg(lock_fail_open=True)
    with caplog.at_level(logging.WARNING, logger="batch_assets.locking.guard"):
        with job_guard(
            engine, job_key="customer_status", run_id="run-1", settings=cfg, lock=PostgresJobLock(down_engine)
        ) as guard:
            assert not guard.lock_held
            assert lease_owner(engine, "customer_status") == guard.owner
            with pytest.raises(LockNotAcquired):
                with job_guard(
                    engine, job_key="customer_status", run_id="run-2", settings=cfg, lock=PostgresJobLock(down_engine)
                ):
                    pytest.fail("the lease must exclude a second run")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "lock_fail_open" in r.getMessage()]
    assert warnings
    assert all("s3cret" not in r.getMessage() for r in caplog.records)
    assert lease_owner(engine, "customer_status") is None


def test_guard_heartbeat_renews_lease_and_lock(engine: sa.Engine) -> None:
    """The guard's heartbeat keeps lease and lock alive well past their ttl."""
    cfg = GuardCfg(lock_ttl_s=1, lease_ttl_s=1, heartbeat_s=0.2)
    with job_guard(engine, job_key="customer_status", run_id="run-1", settings=cfg) as guard:
        wait_for(lambda: guard.beats >= 8, what="8 heartbeats (> 1.5 ttl)")
        assert guard.alive()
        assert lease_owner(engine, "customer_status") == guard.owner
        assert PostgresJobLock(engine).holder("customer_status") == guard.owner
        with engine.begin() as conn:
            guard.fence(conn)


def test_guard_stolen_lease_stops_run(engine: sa.Engine) -> None:
    """After a takeover the heartbeat reports the loss, alive() turns False and fence raises LeaseLost."""
    lost: list[str] = []
    cfg = GuardCfg(heartbeat_s=0.1)
    with job_guard(engine, job_key="customer_status", run_id="run-1", settings=cfg, on_lost=lost.append) as guard:
        assert steal_lease(engine, "customer_status", "new@host:2", 30) == guard.owner
        wait_for(lambda: not guard.alive(), what="heartbeat to notice the takeover")
        assert "Lease.heartbeat returned False" in (guard.lost_reason or "")
        assert lost == [guard.lost_reason]
        with pytest.raises(LeaseLost), engine.begin() as conn:
            guard.fence(conn)
    assert lease_owner(engine, "customer_status") == "new@host:2", "release is owner-filtered"


def test_guard_lost_lock_stops_run(engine: sa.Engine) -> None:
    """If another owner ends up holding the job lock, the heartbeat reports it and alive() turns False."""
    cfg = GuardCfg(heartbeat_s=0.1)
    with job_guard(engine, job_key="customer_status", run_id="run-1", settings=cfg) as guard:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE ba_job_locks SET owner = 'other@host:9' WHERE name = 'customer_status'"))
        wait_for(lambda: not guard.alive(), what="heartbeat to notice the lost lock")
        assert guard.lost_reason == "JobLock.extend returned False"
        with pytest.raises(LeaseLost), engine.begin() as conn:
            guard.fence(conn)
    assert PostgresJobLock(engine).holder("customer_status") == "other@host:9", "release is owner-filtered"


def test_lock_store_down_mid_run_fail_closed_stops_run(engine: sa.Engine, down_engine: sa.Engine) -> None:
    """Fail-closed: the lock store staying away longer than the renewals' grace is a loss."""
    lock = PostgresJobLock(engine)
    cfg = GuardCfg(heartbeat_s=0.1, lease_ttl_s=1, lock_ttl_s=1)  # grace: 1 s - 2 heartbeats
    with job_guard(engine, job_key="customer_status", run_id="run-1", settings=cfg, lock=lock) as guard:
        lock.engine = down_engine  # the store becomes unreachable
        wait_for(lambda: not guard.alive(), what="heartbeat to notice the lock store outage")
        assert (guard.lost_reason or "").startswith("JobLock.extend raised LockStoreUnavailable")
        lock.engine = engine
    assert lease_owner(engine, "customer_status") is None


def test_a_short_lock_store_outage_within_the_grace_keeps_the_run(
    engine: sa.Engine, down_engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Renewals that fail for less than the grace (TTL - 2 heartbeats) are retried; the run keeps its lock."""
    lock = PostgresJobLock(engine)
    cfg = GuardCfg(heartbeat_s=0.1, lease_ttl_s=30, lock_ttl_s=30)
    with caplog.at_level(logging.WARNING, logger="batch_assets.locking.heartbeat"):
        with job_guard(engine, job_key="customer_status", run_id="run-1", settings=cfg, lock=lock) as guard:
            lock.engine = down_engine
            wait_for(lambda: any("heartbeat failed" in r.getMessage() for r in caplog.records),
                       what="a failed renewal")
            lock.engine = engine
            start = guard.beats
            wait_for(lambda: guard.beats >= start + 2, what="renewals after the outage")
            assert guard.alive() and lock.holder("customer_status") == guard.owner


def test_lock_store_down_mid_run_fail_open_keeps_running(
    engine: sa.Engine, down_engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Fail-open: the lock store going away mid-run is a warning; the lease keeps being renewed."""
    lock = PostgresJobLock(engine)
    cfg = GuardCfg(heartbeat_s=0.1, lock_fail_open=True)
    with caplog.at_level(logging.WARNING, logger="batch_assets.locking.guard"):
        with job_guard(engine, job_key="customer_status", run_id="run-1", settings=cfg, lock=lock) as guard:
            lock.engine = down_engine
            start = guard.beats
            wait_for(lambda: guard.beats >= start + 3, what="three heartbeats during the outage")
            assert guard.alive()
            with engine.begin() as conn:
                guard.fence(conn)
            lock.engine = engine
    assert any("not renewed" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert PostgresJobLock(engine).holder("customer_status") is None


def test_guard_rejects_heartbeat_slower_than_ttl(engine: sa.Engine) -> None:
    """A heartbeat interval not below the lease ttl is a ConfigError before anything is taken."""
    with pytest.raises(ConfigError, match="heartbeat_s: must be shorter than lease_ttl_s"):
        with job_guard(engine, job_key="x", run_id="r", settings=GuardCfg(heartbeat_s=30, lease_ttl_s=30)):
            pytest.fail("must not enter")
    assert PostgresJobLock(engine).holder("x") is None
