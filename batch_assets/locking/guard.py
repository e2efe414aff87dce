"""job_guard: the job lock, the run lease and the heartbeat around one run.

Order matters. The lock comes first, so a conflicting run is skipped (exit 75)
before anything is read or written. The lease comes second: it is what page
transactions fence on, so correctness never depends on the lock alone (that is
what makes lock_fail_open safe). Cleanup is in `finally`, so it also runs for a
BaseException such as Dagster's run termination.

Renewals (`renewing`) run on a connection of their own, beside the run's pool
(db.engine.dedicated_engine): a renewal never waits for a pool connection that
page work holds, is one autocommit statement (it holds the row lock only while
it runs), and has a short statement and lock timeout, so a renewal that would
wait is cancelled and retried within the grace instead of arriving late. A run
whose renewals fall behind by the grace is no longer `alive()` even while a
renewal is still on its way, and its next page fence raises LeaseLost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol

import sqlalchemy as sa

from batch_assets.db.engine import dedicated_engine
from batch_assets.errors import ConfigError, LeaseLost, LockNotAcquired, LockStoreUnavailable
from batch_assets.locking.heartbeat import Beat, Heartbeat
from batch_assets.locking.lease import Lease, lease_owner, steal_lease
from batch_assets.locking.lock import JobLock, PostgresJobLock, make_job_lock
from batch_assets.locking.owner import make_owner

log = logging.getLogger(__name__)

__all__ = ["GuardSettings", "RunGuard", "job_guard", "renewing", "steal_lease"]

RENEWAL_TIMEOUT_S = 5.0
"""statement_timeout of one renewal (at most half a heartbeat; its lock_timeout is half that): it normally takes
milliseconds, so one that waits is cancelled and retried (Heartbeat's grace) rather than arriving late."""


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
        """False once the heartbeat failed to renew the lease or the lock, or fell behind by its grace (the lease
        would lapse within two heartbeats)."""
        return not self.heartbeat.lost.is_set() and not self.heartbeat.overdue

    @property
    def lost_reason(self) -> str | None:
        if self.heartbeat.lost_reason is None and self.heartbeat.overdue:
            failure = self.heartbeat.last_failure  # the renewals failing names why, whoever saw the grace pass first
            late = f"not renewed for {self.heartbeat.grace_s:.0f} s"
            return f"{failure} ({late})" if failure else f"{late} (renewals late or failing)"
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


def renewal_timeout(settings: GuardSettings) -> float:
    """statement_timeout of a renewal: RENEWAL_TIMEOUT_S, at most half a heartbeat."""
    return min(RENEWAL_TIMEOUT_S, settings.heartbeat_s / 2)


@contextmanager
def renewing(
    engine: sa.Engine,
    lock: JobLock | None,
    *,
    job_key: str,
    owner: str,
    settings: GuardSettings,
    on_lost: Callable[[str], None] | None = None,
) -> Iterator[Heartbeat]:
    """The running heartbeat of lease `job_key` (and of `lock`, when held) for the block, on a dedicated connection.

    A PostgreSQL lock on the run's engine is renewed on the same dedicated connection; Redis on its own client."""
    timeout = renewal_timeout(settings)
    renewals = dedicated_engine(engine, statement_s=timeout, lock_s=timeout / 2)
    lock_renewals = _DedicatedLock(lock, engine, renewals, timeout) if isinstance(lock, PostgresJobLock) else lock
    heartbeat: Heartbeat | None = None
    try:
        beats: Sequence[Beat] = [Lease(renewals, job_key, owner, settings.lease_ttl_s, timeouts=None).heartbeat]
        if lock_renewals is not None:
            beats = [*beats, lock_beat(lock_renewals, job_key, owner, settings)]
        heartbeat = Heartbeat(settings.heartbeat_s, beats, on_lost, name=f"heartbeat-{job_key}",
                              grace_s=heartbeat_grace(settings, lock is not None)).start()
        yield heartbeat
    finally:
        if heartbeat is not None:
            # Bounded: a renewal in flight ends within its statement timeout; a thread cut off from the server
            # (a daemon) must not hold the release up, and its late renewal finds the lease released.
            heartbeat.stop(timeout=2 * timeout + 1)
        if isinstance(lock_renewals, _DedicatedLock):
            lock_renewals.close()
        renewals.dispose()


class _DedicatedLock:
    """A PostgreSQL job lock whose renewals (extend, and lock_fail_open's retake) run on a dedicated connection
    beside the lock's engine: the lease's when that is the run's engine, else one of its own (made again when the
    lock is pointed at another engine). Holder and release go to the lock itself."""

    def __init__(self, lock: PostgresJobLock, run_engine: sa.Engine, renewals: sa.Engine, timeout_s: float) -> None:
        self.lock = lock
        self.run_engine = run_engine
        self.renewals = renewals
        self.timeout_s = timeout_s
        self._own: tuple[sa.Engine, sa.Engine] | None = None  # (the lock's engine, its dedicated engine)

    def _renewing(self) -> PostgresJobLock:
        engine = self.lock.engine
        if engine is self.run_engine:
            return PostgresJobLock(self.renewals, timeouts=None)  # the dedicated connection's own, shorter ones
        if self._own is None or self._own[0] is not engine:
            self.close()
            self._own = (engine, dedicated_engine(engine, statement_s=self.timeout_s, lock_s=self.timeout_s / 2))
        return PostgresJobLock(self._own[1], timeouts=None)

    def acquire(self, name: str, owner: str, ttl_s: float, min_s: float = 0) -> bool:
        return self._renewing().acquire(name, owner, ttl_s, min_s)

    def extend(self, name: str, owner: str, ttl_s: float) -> bool:
        return self._renewing().extend(name, owner, ttl_s)

    def release(self, name: str, owner: str, *, failed: bool = False) -> bool:
        return self.lock.release(name, owner, failed=failed)

    def holder(self, name: str) -> str | None:
        return self.lock.holder(name)

    def close(self) -> None:
        own, self._own = self._own, None
        if own is not None:
            own[1].dispose()


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

        with renewing(engine, job_lock if lock_held else None, job_key=job_key, owner=owner, settings=settings,
                      on_lost=on_lost) as heartbeat:
            guard = RunGuard(job_key, owner, lease, heartbeat, lock_held)
            yield guard
    except BaseException:
        failed = True
        raise
    finally:
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
