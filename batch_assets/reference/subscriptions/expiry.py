"""The nightly subscription expiry (docs/guide/subscriptions.md): its settings, result and run functions.

The expiry runs on the sweep engine (`engine.runner.run_sweep`) as the `ExpirySweep` definition
(sweep.py; statements in sql.py): keyset batches read with no transaction open, each batch expired by
one statement in a short transaction with SET LOCAL timeouts, or, when a row fails for its own reason,
one subscription per transaction (EXPIRE_ONE + DELETE_ENROLLMENTS), a failed one recorded FAILED in a
transaction of its own. A connection or server failure is retried on a fresh connection; every write
transaction fences the run's lease. Sequential on purpose (one worker, a window of one batch): batches
are small writes, and a stop or a lost lock ends the run after the batch in hand.

No checkpoint: the selection is its own low watermark (an expired or FAILED row leaves it), so a new
run after a failure starts from the beginning and finds only what is still to do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Self

import sqlalchemy as sa
from pydantic import Field, model_validator

from batch_assets import (
    SUCCESS,
    ConfigError,
    DatedSettings,
    JobLock,
    LeaseLost,
    PostgresJobLock,
    RunContext,
    RunGuard,
    RunGuardLike,
    SettingsModel,
    SweepResult,
    SweepSettings,
    bounds,
    error_text,
    job_guard,
    run_sweep,
    translated_error,
)
from batch_assets.reference.subscriptions.sql import NIGHTLY_BATCH, RETRY_BATCH
from batch_assets.reference.subscriptions.sweep import (
    ENROLLMENTS_DELETED,
    MAX_ALERT_IDS,
    MAX_BATCH_SIZE,
    NIGHTLY,
    RETRY_FAILED,
    ExpirySweep,
)

log = logging.getLogger(__name__)

JOB_LOCK_NAME = "subscription_expiry"
MAX_BATCH_FAILURES = int(bounds(SweepSettings.model_fields["transient_retries"])[1] or 0) + 1
"""One more than the engine's transient_retries bound (max_batch_failures - 1 retries)."""
MAX_RETRIES = 1000

__all__ = [
    "JOB_LOCK_NAME",
    "MAX_ALERT_IDS",
    "NIGHTLY_BATCH",
    "RETRY_BATCH",
    "ExpiryResult",
    "ExpiryJobSettings",
    "ExpirySettings",
    "run_expiry",
    "run_expiry_job",
]


class ExpirySettings(SettingsModel):
    """Knobs of the expiry job: type, bounds, default, description and the cross-field rules."""

    batch_size: int = Field(default=500, ge=1, le=MAX_BATCH_SIZE, description="Subscriptions per batch.")
    max_retries: int = Field(
        default=3, ge=1, le=MAX_RETRIES,
        description="Maximum retry_count retried by retry_failed; a subscription reaching it raises an alert.")
    lock_ttl_s: float = Field(default=120.0, gt=0, le=86_400,
                              description="Lock-at-most-for (s); renewed by the heartbeat, checked after each batch.")
    lock_min_s: float = Field(default=60.0, gt=0, le=86_400, description="Lock-at-least-for (s), at most lock_ttl_s.")
    lease_ttl_s: float = Field(default=60.0, gt=0, le=86_400,
                               description="The run's lease (s); renewed by the heartbeat, fences every write.")
    heartbeat_s: float = Field(default=10.0, gt=0, le=3600,
                               description="Renewal interval of lock and lease (s), below both ttls.")
    row_timeout_s: float = Field(
        default=5.0, gt=0, le=3600,
        description="statement_timeout of each per-row transaction (s), below lock_ttl_s; lock_timeout is half.")
    batch_timeout_s: float = Field(default=30.0, gt=0, le=3600,
                                   description="statement_timeout of the one-statement batch transaction (s).")
    max_batch_failures: int = Field(
        default=3, ge=1, le=MAX_BATCH_FAILURES,
        description="Attempts of a write or read failing on the connection before the run ends FAILURE.")
    retry_backoff_s: float = Field(default=1.0, gt=0, le=60,
                                   description="Wait after the first transient failure (s), doubled after each next.")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Self:
        if self.lock_min_s > self.lock_ttl_s:
            raise ConfigError(f"must be <= lock_ttl_s ({self.lock_ttl_s}), got {self.lock_min_s}", field="lock_min_s")
        if self.row_timeout_s >= self.lock_ttl_s:
            raise ConfigError("must be < lock_ttl_s", field="row_timeout_s")
        if self.heartbeat_s >= min(self.lock_ttl_s, self.lease_ttl_s):
            raise ConfigError("must be shorter than lock_ttl_s and lease_ttl_s", field="heartbeat_s")
        return self

    @property
    def lock_fail_open(self) -> bool:
        """Expiry never runs without its lock (job_guard reads this)."""
        return False

    def to_sweep_settings(self) -> SweepSettings:
        """The engine's settings: one worker and a window of one batch, no breaker (every row is independent)."""
        return SweepSettings(
            page_size=self.batch_size,
            workers=1,
            window=1,
            page_timeout_s=max(self.batch_timeout_s, self.row_timeout_s),
            row_timeout_s=self.row_timeout_s,
            # Below statement_timeout, so a row lock held by another writer is reported as
            # lock_not_available rather than as a generic statement timeout.
            lock_timeout_s=self.row_timeout_s / 2,
            breaker_ratio=1.0,
            heartbeat_s=self.heartbeat_s,
            lease_ttl_s=self.lease_ttl_s,
            lock_ttl_s=self.lock_ttl_s,
            lock_min_s=self.lock_min_s,
            transient_retries=self.max_batch_failures - 1,
            retry_backoff_s=self.retry_backoff_s,
        )


class ExpiryJobSettings(DatedSettings, ExpirySettings):
    """The expiry job's settings (`subscriptions expire`, docs/reference/cli.md): its run date and mode on top of the
    knobs.
    The one model its run config (launchpad) derives from."""

    retry_failed: bool = Field(default=False,
                               description="Retry FAILED subscriptions whose retry_count is under max_retries.")

    @property
    def engine(self) -> ExpirySettings:
        """The expiry's knobs alone."""
        return ExpirySettings(**{name: getattr(self, name) for name in ExpirySettings.model_fields})


@dataclass
class ExpiryResult:
    """Counters of one expiry run."""

    run_date: date
    mode: str = NIGHTLY  # nightly | retry_failed
    scanned: int = 0  # rows selected
    expired: int = 0  # rows set EXPIRED (their enrollments deleted)
    unchanged: int = 0  # selected but nothing to write (always 0: every selected row is to be expired)
    conflicts: int = 0  # selected, but changed by another writer before this run wrote them: left to the next run
    failed: int = 0  # rows whose expiry failed this run
    failed_by_type: Counter[str] = field(default_factory=Counter)
    enrollments_deleted: int = 0
    batches: int = 0
    max_batch_rows: int = 0
    duration_s: float = 0.0
    stopped_by: str = ""  # done | stop | lock_lost | lease_lost | batch_failures | error
    status: str = SUCCESS
    error: str | None = None
    batch_retries: int = 0  # reads or writes that failed on the connection and were retried
    exhausted: int = 0  # rows whose failure this run brought retry_count to max_retries
    exhausted_ids: list[int] = field(default_factory=list)  # the first MAX_ALERT_IDS of them

    def to_summary(self, run_id: str) -> dict[str, Any]:
        """The JSON summary (changed = expired) plus run_date, mode and extras."""
        summary = {
            "status": self.status,
            "run_id": run_id,
            "scanned": self.scanned,
            "changed": self.expired,
            "unchanged": self.unchanged,
            "conflicts": self.conflicts,
            "failed": self.failed,
            "failed_by_type": dict(sorted(self.failed_by_type.items())),
            "duration_s": round(self.duration_s, 3),
            "run_date": self.run_date.isoformat(),
            "mode": self.mode,
            "enrollments_deleted": self.enrollments_deleted,
            "batches": self.batches,
            "batch_retries": self.batch_retries,
            "retries_exhausted": self.exhausted,
            "stopped_by": self.stopped_by,
        }
        if self.error:
            summary["error"] = self.error
        return summary

    def take_counters(self, counters: Mapping[str, Any]) -> None:
        """Take the engine's counters (a progress snapshot or a finished run's)."""
        self.max_batch_rows = max(self.max_batch_rows, counters["scanned"] - self.scanned)
        self.scanned = counters["scanned"]
        self.expired = counters["changed"]
        self.unchanged = counters["unchanged"]
        self.conflicts = counters["conflicts"]
        self.failed = counters["failed"]
        self.failed_by_type = Counter({k: n for k, n in counters["failed_by_type"].items() if n})
        self.batches = counters["pages"]
        self.enrollments_deleted = counters["extra"].get(ENROLLMENTS_DELETED, 0)
        self.batch_retries = counters["retries"]


class _LockedRunGuard:
    """The run's guard as the engine sees it: before each batch the job lock is renewed too, so a run
    whose lock was taken over stops after the batch in hand; notes why the run lost its right to write."""

    def __init__(self, guard: RunGuard, lock: JobLock, ttl_s: float) -> None:
        self.guard = guard
        self.owner = guard.owner
        self.lock = lock
        self.ttl_s = ttl_s
        self.lost: tuple[str, str | None] | None = None

    def fence(self, conn: sa.Connection, timeouts: Mapping[str, str] | None = None) -> None:
        try:
            self.guard.fence(conn, timeouts)
        except LeaseLost as exc:
            self.lost = self.lost or ("lease_lost", str(exc))
            raise

    def alive(self) -> bool:
        if self.guard.alive() and self.lock.extend(JOB_LOCK_NAME, self.owner, self.ttl_s):
            return True
        self.lost = self.lost or ("lock_lost", None)
        return False


def run_expiry(
    engine: sa.Engine,
    *,
    run_date: date,
    settings: ExpirySettings,
    retry_failed: bool = False,
    stop: threading.Event | None = None,
    progress: Callable[[ExpiryResult], None] | None = None,
    guard: RunGuardLike | None = None,
    run_id: str = "expiry",
) -> ExpiryResult:
    """Expire ACTIVE subscriptions with expiry_date < run_date (or, retry_failed=True, retry FAILED ones).

    Each row is expired atomically; a row that fails is marked FAILED (retry_count + 1, last_error) in a
    transaction of its own and the run goes on. A read or write that fails on the connection or the
    server is retried on a fresh connection after a backoff; after `max_batch_failures` attempts the
    run ends FAILURE (`stopped_by` = "batch_failures"). `guard` (the run's, see run_expiry_job) fences
    every write transaction and is asked before each batch; a lost lease or lock ends the run FAILURE.
    """
    if not isinstance(run_date, date):
        raise ConfigError(f"must be a date, got {run_date!r}", field="run_date")
    started = time.monotonic()
    mode = RETRY_FAILED if retry_failed else NIGHTLY
    definition = ExpirySweep(mode, run_date=run_date, max_retries=settings.max_retries)
    result = ExpiryResult(run_date=run_date, mode=mode)

    def on_batch(counters: dict[str, Any]) -> None:
        result.take_counters(counters)
        result.duration_s = time.monotonic() - started
        if progress is not None:
            progress(result)

    sweep = run_sweep(
        engine,
        definition,
        settings.to_sweep_settings(),
        RunContext(run_id=run_id, mode=mode, run_date=run_date),
        guard=guard,
        stop=stop,
        progress=on_batch,
    )
    result.take_counters({**sweep.to_summary(), "extra": sweep.extra, "retries": sweep.retries})
    result.exhausted, result.exhausted_ids = definition.exhausted, list(definition.exhausted_ids)
    lost = guard.lost if isinstance(guard, _LockedRunGuard) else None
    result.stopped_by, result.error = _why_stopped(engine, sweep, stop, lost)
    if sweep.status != SUCCESS:
        result.status = sweep.status
    result.duration_s = time.monotonic() - started
    log.info("subscription expiry %s run_date=%s: scanned=%d expired=%d failed=%d",
             result.mode, run_date, result.scanned, result.expired, result.failed)
    return result


def _why_stopped(
    engine: sa.Engine, sweep: SweepResult, stop: threading.Event | None, lost: tuple[str, str | None] | None
) -> tuple[str, str | None]:
    """(stopped_by, error) of a finished run."""
    if sweep.status == SUCCESS:
        return "done", None
    if stop is not None and stop.is_set():
        # A stop (SIGTERM, run termination) before the last batch leaves due subscriptions ACTIVE: the run
        # did not do its work, so it is not SUCCESS; the next run picks them up (they are still due).
        return "stop", "stopped before every due subscription was expired; the next run continues"
    if lost is not None:
        return lost
    if sweep.gave_up_on is not None:
        error = (f"{sweep.gave_up_after} consecutive batch failures; "
                 f"last: {error_text(translated_error(engine.url, sweep.gave_up_on))}")
        log.error("subscription expiry: %s", error)
        return "batch_failures", error
    return "error", sweep.stopped_reason


def run_expiry_job(
    engine: sa.Engine,
    *,
    run_date: date,
    settings: ExpirySettings,
    run_id: str,
    retry_failed: bool = False,
    lock: JobLock | None = None,
    stop: threading.Event | None = None,
    progress: Callable[[ExpiryResult], None] | None = None,
) -> ExpiryResult:
    """Run the expiry under the shared job guard "subscription_expiry"; `LockNotAcquired` when held.

    job_guard takes the lock (lock-at-most-for lock_ttl_s, lock-at-least-for lock_min_s) and the
    lease, renews both every heartbeat_s, and releases both in `finally`. After a crash the lock
    lapses within lock_ttl_s (or at once when its holder is provably dead), not an hour later.
    Every write transaction fences the lease; before each batch the lock is renewed, so a run
    that lost it stops (FAILURE, "lock_lost").
    """
    if lock is None:
        lock = PostgresJobLock(engine)
    with job_guard(engine, job_key=JOB_LOCK_NAME, run_id=run_id, settings=settings, lock=lock) as guard:
        result = run_expiry(
            engine,
            run_date=run_date,
            settings=settings,
            retry_failed=retry_failed,
            stop=stop,
            progress=progress,
            guard=_LockedRunGuard(guard, lock, settings.lock_ttl_s),
            run_id=run_id,
        )
        if result.status != SUCCESS:
            guard.mark_failed()  # a retry must not wait for lock-at-least-for
        return result
