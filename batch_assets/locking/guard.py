"""job_guard: the job lock, the run lease and the heartbeat around one run.

Order matters. The lock comes first, so a conflicting run is skipped (exit 75)
before anything is read or written. The lease comes second: it is what page
transactions fence on, so correctness never depends on the lock alone (that is
what makes lock_fail_open safe). Cleanup is in `finally`, so it also runs for a
BaseException such as Dagster's run termination.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol

import sqlalchemy as sa

from batch_assets.errors import ConfigError, LeaseLost, LockNotAcquired, LockStoreUnavailable
from batch_assets.locking.heartbeat import Beat, Heartbeat
from batch_assets.locking.lease import Lease, lease_owner, steal_lease
from batch_assets.locking.lock import JobLock, make_job_lock
from batch_assets.locking.owner import make_owner

log = logging.getLogger(__name__)

__all__ = ["GuardSettings", "RunGuard", "job_guard", "steal_lease"]


class GuardSettings(Protocol):
    """The fields of SweepSettings that job_guard reads (read-only, so frozen dataclasses conform)."""

    @property
    def lock_ttl_s(self) -> float: ...
    @property
    def lock_min_s(self) -> float: ...
    @property
    def lock_fail_open(self) -> bool: ...
    @property
    def lease_ttl_s(self) -> float: ...
    @property
    def heartbeat_s(self) -> float: ...


class RunGuard:
    """What a guarded run sees: its owner, the page fence and whether it still owns lease and lock."""

    def __init__(self, job_key: str, owner: str, lease: Lease, heartbeat: Heartbeat, lock_held: bool) -> None:
        self.job_key = job_key
        self.owner = owner
        self.lease = lease
        self.heartbeat = heartbeat
        self.lock_held = lock_held
        self.failed = False

    def mark_failed(self) -> None:
        """The run failed: on release the lock is not kept for its lock-at-least-for time, so a retry can run."""
        self.failed = True

    def fence(self, conn: sa.Connection, timeouts: Mapping[str, str] | None = None) -> None:
        """Inside a write transaction: raise LeaseLost unless this run still owns its lease (and lock).

        `timeouts` are set for the transaction in the same round trip (see Lease.fence).
        """
        if not self.alive():
            raise LeaseLost(f"run {self.owner} lost {self.job_key!r}: {self.lost_reason}")
        self.lease.fence(conn, timeouts)

    def alive(self) -> bool:
        """False once the heartbeat failed to renew the lease or the lock."""
        return not self.heartbeat.lost.is_set()

    @property
    def lost_reason(self) -> str | None:
        return self.heartbeat.lost_reason

    @property
    def beats(self) -> int:
        """Completed heartbeat rounds."""
        return self.heartbeat.beats_done


def _check(settings: GuardSettings) -> None:
    # A heartbeat slower than an expiry renews too late; refuse before taking anything.
    if settings.heartbeat_s <= 0:
        raise ConfigError("must be > 0", field="heartbeat_s")
    if settings.heartbeat_s >= settings.lease_ttl_s:
        raise ConfigError("must be shorter than lease_ttl_s", field="heartbeat_s")
    if settings.heartbeat_s >= settings.lock_ttl_s:
        raise ConfigError("must be shorter than lock_ttl_s", field="heartbeat_s")


def heartbeat_grace(settings: GuardSettings, lock_held: bool = True) -> float:
    """How long renewals may keep failing (store unreachable) before the run gives up: two heartbeats
    short of the earliest expiry, so the run stops writing before its lease or lock could lapse."""
    ttl = min(settings.lease_ttl_s, settings.lock_ttl_s) if lock_held else settings.lease_ttl_s
    return max(0.0, ttl - 2 * settings.heartbeat_s)


def lock_beat(lock: JobLock, job_key: str, owner: str, settings: GuardSettings) -> Beat:
    """Renew the lock; with lock_fail_open an unreachable store is a warning, and an expired lock is retaken."""

    def extend_lock() -> bool:
        try:
            if lock.extend(job_key, owner, settings.lock_ttl_s):
                return True
            # Expired while the store was unreachable and nobody took it: take it back.
            return settings.lock_fail_open and lock.acquire(job_key, owner, settings.lock_ttl_s)
        except LockStoreUnavailable as exc:
            if not settings.lock_fail_open:
                raise
            log.warning("job lock %r not renewed (lock_fail_open, the lease still fences writes): %s", job_key, exc)
            return True

    extend_lock.__qualname__ = "JobLock.extend"
    return extend_lock


@contextmanager
def job_guard(
    engine: sa.Engine,
    *,
    job_key: str,
    run_id: str,
    settings: GuardSettings,
    redis_url: str | None = None,
    lock: JobLock | None = None,
    on_lost: Callable[[str], None] | None = None,
) -> Iterator[RunGuard]:
    """Hold the job lock and the lease `job_key` for the block, renewed by a heartbeat; release both after.

    Raises LockNotAcquired (exit 75) if another run holds the lock or a live lease,
    LockStoreUnavailable if the lock store is down and lock_fail_open is off.
    `on_lost(reason)` is called from the heartbeat thread when lease or lock is lost.
    """
    _check(settings)
    owner = make_owner(run_id)
    own_lock = lock is None
    job_lock = make_job_lock(engine, redis_url) if lock is None else lock
    lock_held = False
    lease: Lease | None = None
    heartbeat: Heartbeat | None = None
    guard: RunGuard | None = None
    failed = False
    try:
        try:
            lock_held = job_lock.acquire(job_key, owner, settings.lock_ttl_s, settings.lock_min_s)
        except LockStoreUnavailable as exc:
            if not settings.lock_fail_open:
                raise
            log.warning("job lock %r not taken, continuing on the lease alone (lock_fail_open): %s", job_key, exc)
        else:
            if not lock_held:
                raise LockNotAcquired(f"job {job_key!r} is locked by {holder_text(job_lock, job_key)}")

        lease = Lease(engine, job_key, owner, settings.lease_ttl_s)
        if not lease.acquire():
            held_by = lease_owner(engine, job_key)
            lease = None
            raise LockNotAcquired(f"job {job_key!r} lease is held by {held_by}")

        beats: list[Beat] = [lease.heartbeat]
        if lock_held:
            beats.append(lock_beat(job_lock, job_key, owner, settings))
        heartbeat = Heartbeat(settings.heartbeat_s, beats, on_lost, name=f"heartbeat-{job_key}",
                              grace_s=heartbeat_grace(settings, lock_held)).start()
        guard = RunGuard(job_key, owner, lease, heartbeat, lock_held)
        yield guard
    except BaseException:
        failed = True
        raise
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        release_lease_and_lock(job_key, owner, lease, job_lock if lock_held else None,
                               failed=failed or (guard is not None and guard.failed))
        if own_lock:
            close = getattr(job_lock, "close", None)
            if close is not None:
                close()


def holder_text(lock: JobLock, job_key: str) -> str:
    """Who holds the lock, for messages (the store may be down or the lock just released)."""
    try:
        return lock.holder(job_key) or "another run (just released)"
    except LockStoreUnavailable:
        return "another run"


def release_lease_and_lock(
    job_key: str, owner: str, lease: Lease | None, lock: JobLock | None, *, failed: bool = False
) -> None:
    """Owner-filtered release of a run's lease and lock; logs instead of raising.

    A run that `failed` gives its lock back at once, not at the end of its lock-at-least-for time."""
    # Best effort on purpose: both expire on their own, and a failure here must not
    # replace the exception (or the result) of the run itself.
    if lease is not None:
        try:
            if not lease.release():
                log.warning("lease %r was no longer held by %s at release", job_key, owner)
        except Exception as exc:
            log.warning("lease %r not released, it will expire: %s", job_key, exc)
    if lock is not None:
        try:
            if not lock.release(job_key, owner, failed=failed):
                log.warning("job lock %r was no longer held by %s at release", job_key, owner)
        except Exception as exc:
            log.warning("job lock %r not released, it will expire: %s", job_key, exc)
