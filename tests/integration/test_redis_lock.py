"""The Redis job lock (SET NX PX, Lua compare-and-extend / compare-and-delete) on a real Redis."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator

import pytest
import redis
import sqlalchemy as sa
from helpers import GuardCfg, wait_for

from batch_assets.errors import LockNotAcquired, LockStoreUnavailable
from batch_assets.locking import RedisJobLock, job_guard, lease_owner

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("BATCH_ASSETS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DOWN_REDIS_URL = "redis://:s3cret@127.0.0.1:1/0"


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key prefix of this test's own on a reachable Redis; its keys are deleted after."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        client.close()
        pytest.skip(f"Redis not reachable at {REDIS_URL}: {exc}")
    prefix = f"ba_test:{uuid.uuid4().hex}:"
    yield prefix
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def lock(prefix: str) -> Iterator[RedisJobLock]:
    lock = RedisJobLock(REDIS_URL, key_prefix=prefix)
    yield lock
    lock.close()


def _pttl_ms(lock: RedisJobLock, name: str) -> int:
    return lock.client.pttl(lock._keys(name)[0])


def test_second_acquire_fails_while_held(lock: RedisJobLock) -> None:
    """SET NX: a second owner cannot take a live lock."""
    assert lock.acquire("sweep", "A", 30)
    assert not lock.acquire("sweep", "B", 30)
    assert lock.holder("sweep") == "A"
    assert lock.acquire("other", "B", 30)


def test_acquire_succeeds_after_expiry(lock: RedisJobLock) -> None:
    """Once the key's PX expiry passes, another owner takes the lock."""
    assert lock.acquire("sweep", "A", 1)
    wait_for(lambda: lock.acquire("sweep", "B", 30), what="expired lock to be taken")
    assert lock.holder("sweep") == "B"
    assert not lock.extend("sweep", "A", 30)


def test_extend_only_by_owner(lock: RedisJobLock) -> None:
    """Compare-and-extend: the owner's PEXPIRE applies, another owner's does not."""
    assert lock.acquire("sweep", "A", 5)
    assert not lock.extend("sweep", "B", 60)
    assert _pttl_ms(lock, "sweep") <= 5000
    assert lock.extend("sweep", "A", 60)
    assert _pttl_ms(lock, "sweep") > 50_000
    assert not lock.extend("missing", "A", 60)


def test_release_only_by_owner(lock: RedisJobLock) -> None:
    """Compare-and-delete: only the holder's release frees the lock."""
    assert lock.acquire("sweep", "A", 30)
    assert not lock.release("sweep", "B")
    assert lock.holder("sweep") == "A"
    assert lock.release("sweep", "A")
    assert lock.holder("sweep") is None
    assert not lock.release("sweep", "A")
    assert lock.acquire("sweep", "B", 30)


def test_lock_at_least_for_keeps_lock_after_release(lock: RedisJobLock) -> None:
    """Releasing before the minimum hold PEXPIREs the key to what is left of it instead of deleting it."""
    assert lock.acquire("sweep", "A", 30, min_s=1.5)
    assert lock.release("sweep", "A")
    assert lock.holder("sweep") == "A#released", "kept for the minimum hold, marked as no longer held by a process"
    assert 0 < _pttl_ms(lock, "sweep") <= 1500
    assert not lock.acquire("sweep", "B", 30)
    wait_for(lambda: lock.acquire("sweep", "B", 30), what="minimum hold to pass")
    assert lock.holder("sweep") == "B"
    assert lock.release("sweep", "B")
    assert lock.holder("sweep") is None, "B took it without a minimum: release deletes"


def test_lock_at_least_for_is_a_floor_for_ttl(lock: RedisJobLock) -> None:
    """Neither acquire nor extend sets an expiry below the remaining minimum hold."""
    assert lock.acquire("sweep", "A", 1, min_s=20)
    assert _pttl_ms(lock, "sweep") > 15_000
    assert lock.extend("sweep", "A", 1)
    assert _pttl_ms(lock, "sweep") > 15_000


def test_redis_down_raises_lock_store_unavailable() -> None:
    """Every operation on an unreachable Redis raises LockStoreUnavailable with one line and no password."""
    lock = RedisJobLock(DOWN_REDIS_URL, timeout_s=1)
    try:
        for call in (
            lambda: lock.acquire("sweep", "A", 30),
            lambda: lock.extend("sweep", "A", 30),
            lambda: lock.release("sweep", "A"),
            lambda: lock.holder("sweep"),
        ):
            with pytest.raises(LockStoreUnavailable) as info:
                call()
            message = str(info.value)
            assert "127.0.0.1:1" in message
            assert "\n" not in message
            assert "s3cret" not in message
    finally:
        lock.close()


def test_guard_with_redis_lock_excludes_second_run(engine: sa.Engine, lock: RedisJobLock) -> None:
    """With the Redis lock, a second guard is refused and the lock is freed after the first ends."""
    with job_guard(engine, job_key="customer_status", run_id="run-1", settings=GuardCfg(), lock=lock) as guard:
        assert lock.holder("customer_status") == guard.owner
        with pytest.raises(LockNotAcquired):
            with job_guard(engine, job_key="customer_status", run_id="run-2", settings=GuardCfg(), lock=lock):
                pytest.fail("must not enter")
    assert lock.holder("customer_status") is None
    assert lease_owner(engine, "customer_status") is None


def test_guard_heartbeat_extends_redis_lock(engine: sa.Engine, lock: RedisJobLock) -> None:
    """The guard's heartbeat keeps a short Redis lock alive past its ttl."""
    cfg = GuardCfg(lock_ttl_s=1, lease_ttl_s=5, heartbeat_s=0.2)
    with job_guard(engine, job_key="customer_status", run_id="run-1", settings=cfg, lock=lock) as guard:
        wait_for(lambda: guard.beats >= 8, what="8 heartbeats (> 1.5 ttl)")
        assert guard.alive()
        assert lock.holder("customer_status") == guard.owner


def test_guard_fail_closed_and_fail_open_on_redis_down(engine: sa.Engine, caplog: pytest.LogCaptureFixture) -> None:
    """Redis down: fail-closed raises LockStoreUnavailable; fail-open warns and runs on the lease."""
    down = RedisJobLock(DOWN_REDIS_URL, timeout_s=1)
    try:
        with pytest.raises(LockStoreUnavailable):
            with job_guard(engine, job_key="customer_status", run_id="run-1", settings=GuardCfg(), lock=down):
                pytest.fail("must not enter")
        assert lease_owner(engine, "customer_status") is None
        entered = False
        with caplog.at_level(logging.WARNING, logger="batch_assets.locking.guard"):
            with job_guard(
                engine, job_key="customer_status", run_id="run-1", settings=GuardCfg(lock_fail_open=True), lock=down
            ) as guard:
                entered = True
                assert lease_owner(engine, "customer_status") == guard.owner
        assert entered
        assert any("lock_fail_open" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        assert all("s3cret" not in r.getMessage() for r in caplog.records)
    finally:
        down.close()
