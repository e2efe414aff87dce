"""A lock or lease whose holder is provably dead (this host, this pid namespace, process gone) is taken over
at once; any holder that cannot be proven dead is left to expire."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
import sqlalchemy as sa

from batch_assets.locking import Lease, PostgresJobLock, RedisJobLock, make_owner, provably_dead
from batch_assets.locking.owner import parse_owner, run_level_owner

pytestmark = pytest.mark.integration


def test_the_rule_judges_only_this_hosts_processes(dead_owner: str) -> None:
    """Dead: same host and namespace, process gone. Not dead: this process, another host, a run-level owner."""
    assert provably_dead(dead_owner)
    assert not provably_dead(make_owner("alive"))
    holder = parse_owner(dead_owner)
    assert holder is not None
    assert not provably_dead(dead_owner.replace(f"@{holder.host}:", "@another-host:"))
    other_ns = dead_owner.rsplit(":n", 1)[0] + ":n1"
    assert not provably_dead(other_ns)
    assert not provably_dead(run_level_owner("r")) and not provably_dead(None) and not provably_dead("thief@x")
    # A pid reused by another process (different start time) is not the holder.
    me = parse_owner(make_owner("me"))
    assert provably_dead(f"r@{me.host}:{os.getpid()}:s{me.start + 500}:n{me.pid_namespace}")


def test_a_holder_that_ended_but_was_not_reaped_yet_is_dead() -> None:
    """A zombie (its parent has not waited for it) runs nothing and holds nothing: dead, as soon as it ended."""
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; print(1, flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()
        me = parse_owner(make_owner("me"))
        start = round(psutil.Process(child.pid).create_time() * 100)
        holder = f"r@{me.host}:{child.pid}:s{start}:n{me.pid_namespace}"
        assert me is not None and not provably_dead(holder)
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # it has ended; left unreaped (a zombie)
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        assert provably_dead(holder)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_postgres_lock_is_taken_over_from_a_dead_holder_only(engine: sa.Engine, dead_owner: str) -> None:
    """acquire() takes a dead holder's lock at once; a live holder's lock stays refused."""
    lock = PostgresJobLock(engine)
    assert lock.acquire("job", dead_owner, 3600)
    assert lock.acquire("job", make_owner("next"), 120)
    assert lock.holder("job") == make_owner("next")
    assert not lock.acquire("job", make_owner("third"), 120), "a live holder was taken over"


def test_postgres_lock_of_a_dead_holder_is_taken_over_within_its_lock_at_least_for(
    engine: sa.Engine, dead_owner: str
) -> None:
    """Lock-at-least-for keeps a finished run's tick from running twice; a crashed run did not finish."""
    lock = PostgresJobLock(engine)
    assert lock.acquire("job", dead_owner, 60, min_s=3600)
    assert lock.acquire("job", make_owner("next"), 120, min_s=0)
    assert lock.release("job", make_owner("next")) and lock.holder("job") is None


def test_a_finished_run_of_a_gone_process_keeps_its_lock_at_least_for(engine: sa.Engine, dead_owner: str) -> None:
    """A released lock kept for lock-at-least-for is not a dead holder's: its process ended, the run finished."""
    lock = PostgresJobLock(engine)
    assert lock.acquire("job", dead_owner, 60, min_s=3600) and lock.release("job", dead_owner)
    assert not lock.acquire("job", make_owner("next"), 120), "lock-at-least-for of a finished run was ignored"


def test_a_failed_run_releases_its_lock_at_once_a_finished_one_keeps_it_at_least_for(engine: sa.Engine) -> None:
    """release(failed=True) ignores lock-at-least-for; a plain release keeps the lock until min_until."""
    lock = PostgresJobLock(engine)
    assert lock.acquire("finished", make_owner("a"), 60, min_s=3600) and lock.release("finished", make_owner("a"))
    assert lock.holder("finished") == make_owner("a") + "#released"
    assert lock.acquire("failed", make_owner("a"), 60, min_s=3600)
    assert lock.release("failed", make_owner("a"), failed=True)
    assert lock.holder("failed") is None


def test_lease_is_taken_over_from_a_dead_holder_only(engine: sa.Engine, dead_owner: str) -> None:
    """Lease.acquire() takes a dead holder's live lease at once; a live holder keeps it."""
    assert Lease(engine, "job", dead_owner, 3600).acquire()
    assert Lease(engine, "job", make_owner("next"), 60).acquire()
    assert not Lease(engine, "job", make_owner("third"), 60).acquire()


def test_redis_lock_is_taken_over_from_a_dead_holder_only(require_redis: None, dead_owner: str) -> None:
    """The Redis lock: compare-and-set from a dead holder (at-least-for or not); a live one stays; failed releases."""
    url = os.environ.get("BATCH_ASSETS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    lock = RedisJobLock(url, key_prefix=f"test:{os.getpid()}:{id(dead_owner)}:")
    try:
        assert lock.acquire("job", dead_owner, 3600)
        assert lock.acquire("job", make_owner("next"), 120)
        assert not lock.acquire("job", make_owner("third"), 120)
        assert lock.release("job", make_owner("next"))
        assert lock.acquire("held", dead_owner, 60, min_s=3600)
        assert lock.acquire("held", make_owner("next"), 120), "a crashed holder's at-least-for does not count"
        assert lock.release("held", make_owner("next"))
        assert lock.acquire("kept", dead_owner, 60, min_s=3600) and lock.release("kept", dead_owner)
        assert not lock.acquire("kept", make_owner("next"), 120), "a finished run keeps lock-at-least-for"
        assert lock.acquire("failed", make_owner("a"), 60, min_s=3600)
        assert lock.release("failed", make_owner("a"), failed=True) and lock.holder("failed") is None
    finally:
        lock.client.delete(*lock._keys("job"), *lock._keys("held"), *lock._keys("failed"), *lock._keys("kept"))
        lock.close()
