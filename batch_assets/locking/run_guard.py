"""One lock and one lease per Dagster run, shared by the run's ops across processes.

`locking.job_guard` owns lock and lease for the life of one block in one process
(owner "<run_id>@<host>:<pid>"). A mapped sweep runs its cursor ranges in several
ops, possibly in several processes (multiprocess, celery), so here the owner is
derived from the run's *root* run id instead: the first op takes lock + lease,
every range op joins them (same owner: extend, or retake if they expired and are
free), heartbeats them while it works and fences its page writes on the lease,
and the summary op releases both. A re-execution from failure has the same root
run id, so it rejoins the failed run's lock and lease instead of being skipped by
them; any other run is still excluded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from batch_assets.errors import LockNotAcquired, LockStoreUnavailable
from batch_assets.locking.guard import (
    GuardSettings,
    RunGuard,
    holder_text,
    release_lease_and_lock,
    renewing,
)
from batch_assets.locking.lease import Lease, lease_owner
from batch_assets.locking.lock import JobLock
from batch_assets.locking.owner import make_owner, run_level_owner

log = logging.getLogger(__name__)


def run_owner(root_run_id: str, *, single_process: bool = False) -> str:
    """The lock/lease owner shared by every op of a run and of its re-executions.

    The range ops (in whatever process) receive this string from the plan and fence on it,
    and a re-execution from failure reuses the plan's output, so it rejoins with the same owner.
    When every op runs in the planning process (the in_process executor: the CLI), the owner
    names that process, so after a kill -9 the next run takes lock and lease over at once
    (locking.owner.provably_dead). Ops in several processes get a run-level owner, which is
    never judged dead (the planning process exits long before the ranges finish): it expires.
    """
    return make_owner(root_run_id) if single_process else run_level_owner(root_run_id)


def owned_by_run(owner: str | None, root_run_id: str) -> bool:
    return owner is not None and owner.startswith(f"{root_run_id}@")


def release_failed_run(engine: sa.Engine, lock: JobLock, *, job_key: str, root_run_id: str) -> bool:
    """After a run ended without its summary op: release the lease and lock it still holds.

    The checkpoints stay, so the next run (or a re-execution) resumes; without this the
    next run would be refused until lock-at-most-for passes. Returns whether anything was held.
    """
    released = False
    lease_holder = lease_owner(engine, job_key)
    if lease_holder is not None and owned_by_run(lease_holder, root_run_id):
        Lease(engine, job_key, lease_holder, 1).release()
        released = True
    try:
        lock_holder = lock.holder(job_key)
    except LockStoreUnavailable as exc:
        log.warning("job lock %r not released, it will expire: %s", job_key, exc)
        return released
    if lock_holder is not None and owned_by_run(lock_holder, root_run_id):
        lock.release(job_key, lock_holder, failed=True)
        released = True
    return released


def _take_lock(lock: JobLock, job_key: str, owner: str, settings: GuardSettings) -> bool:
    """Extend the lock if `owner` holds it, else take it if free; False if another owner holds it.

    Returns True without a lock when the store is down and lock_fail_open is set (the lease still fences).
    """
    try:
        if lock.extend(job_key, owner, settings.lock_ttl_s):
            return True
        if lock.acquire(job_key, owner, settings.lock_ttl_s, settings.lock_min_s):
            return True
    except LockStoreUnavailable as exc:
        if not settings.lock_fail_open:
            raise
        log.warning("job lock %r unavailable, continuing on the lease alone (lock_fail_open): %s", job_key, exc)
        return True
    raise LockNotAcquired(f"job {job_key!r} is locked by {holder_text(lock, job_key)}")


def acquire_run_lock(
    engine: sa.Engine, lock: JobLock, *, job_key: str, owner: str, settings: GuardSettings
) -> None:
    """Take (or rejoin) the job lock and the lease for the run; LockNotAcquired if another run holds either."""
    _take_lock(lock, job_key, owner, settings)
    if not Lease(engine, job_key, owner, settings.lease_ttl_s).acquire():
        held_by = lease_owner(engine, job_key)
        release_lease_and_lock(job_key, owner, None, lock)  # give the lock back (logs if the store is down)
        raise LockNotAcquired(f"job {job_key!r} lease is held by {held_by}")


def release_run_lock(engine: sa.Engine, lock: JobLock, *, job_key: str, owner: str) -> None:
    """Release lease and lock of the run (best effort: both expire on their own)."""
    release_lease_and_lock(job_key, owner, Lease(engine, job_key, owner, 1), lock)


@contextmanager
def joined_guard(
    engine: sa.Engine, lock: JobLock, *, job_key: str, owner: str, settings: GuardSettings
) -> Iterator[RunGuard]:
    """Join the run's lock and lease for one range op and heartbeat both; nothing is released on exit."""
    acquire_run_lock(engine, lock, job_key=job_key, owner=owner, settings=settings)
    lease = Lease(engine, job_key, owner, settings.lease_ttl_s)
    with renewing(engine, lock, job_key=job_key, owner=owner, settings=settings) as heartbeat:
        yield RunGuard(job_key, owner, lease, heartbeat, True)
