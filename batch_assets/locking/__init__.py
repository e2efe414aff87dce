"""Job lock, run lease, heartbeat, checkpoints and the guard that combines them (no Dagster here)."""

from __future__ import annotations

from batch_assets.locking.checkpoint import Checkpoint, CheckpointStore
from batch_assets.locking.guard import GuardSettings, RunGuard, job_guard
from batch_assets.locking.heartbeat import Heartbeat
from batch_assets.locking.lease import Lease, lease_owner, steal_lease
from batch_assets.locking.lock import JobLock, PostgresJobLock, RedisJobLock, make_job_lock
from batch_assets.locking.owner import make_owner, provably_dead

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "GuardSettings",
    "Heartbeat",
    "JobLock",
    "Lease",
    "PostgresJobLock",
    "RedisJobLock",
    "RunGuard",
    "job_guard",
    "lease_owner",
    "make_job_lock",
    "make_owner",
    "provably_dead",
    "steal_lease",
]
