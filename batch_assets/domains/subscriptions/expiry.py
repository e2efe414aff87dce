"""The nightly subscription expiry (CONTRACT §6).

Transaction shape, and why:
- Batches are read in keyset order (expiry_date, id) on `subscriptions_expiring_idx`, one
  bounded read per batch with no transaction kept open, so memory is bounded by batch_size
  and a row that could not be handled is never fetched again by the same run.
- Each subscription is expired in its own short transaction (status EXPIRED + its enrollments
  deleted, or neither), with SET LOCAL statement and lock timeouts, so one bad or locked row
  cannot poison or stall the others (a failed statement aborts its whole transaction).
- A failure is recorded (FAILED, retry_count + 1, last_error) in a second transaction of its
  own, after the first one rolled back; FAILED rows leave the nightly selection.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import sqlalchemy as sa

from batch_assets.db.engine import translate_errors
from batch_assets.errors import ConfigError, DatabaseUnavailable, LeaseLost
from batch_assets.knobs import build_settings, check_positive_fields
from batch_assets.locking.lock import JobLock

log = logging.getLogger(__name__)

JOB_LOCK_NAME = "subscription_expiry"
ERROR_MAX_CHARS = 500
_MIN_BIGINT = -(2**63)

# NIGHTLY_BATCH — next ACTIVE subscriptions past their expiry, keyset on (expiry_date, id).
#   :run_date    date    expire rows with expiry_date < run date
#   :after_date  date    keyset: expiry_date of the last row seen (NULL at the start = -infinity)
#   :after_id    bigint  keyset: id of the last row seen (the smallest bigint at the start)
#   :limit       int     batch size
NIGHTLY_BATCH = sa.text(
    """
SELECT id, expiry_date
  FROM subscriptions
 WHERE status = 'ACTIVE' AND expiry_date < :run_date
   AND (expiry_date, id) > (coalesce(CAST(:after_date AS date), '-infinity'::date), :after_id)
 ORDER BY expiry_date, id
 LIMIT :limit
"""
)

# RETRY_BATCH — next FAILED subscriptions still under the retry limit, keyset on id
# (subscriptions_failed_idx).
#   :run_date     date    only rows still past their expiry
#   :max_retries  int     retry_count must be below this
#   :after_id     bigint  keyset: id of the last row seen (the smallest bigint at the start)
#   :limit        int     batch size
RETRY_BATCH = sa.text(
    """
SELECT id, expiry_date
  FROM subscriptions
 WHERE status = 'FAILED' AND retry_count < :max_retries AND expiry_date < :run_date
   AND id > :after_id
 ORDER BY id
 LIMIT :limit
"""
)

# SET_TIMEOUTS — transaction-local statement and lock timeouts (SET LOCAL takes no parameters).
#   :statement_timeout  text  statement_timeout in milliseconds
#   :lock_timeout       text  lock_timeout in milliseconds
# (the same parameters as the lease fence's preamble, which replaces it under a guard)
SET_TIMEOUTS = sa.text(
    "SELECT set_config('statement_timeout', :statement_timeout, true), "
    "set_config('lock_timeout', :lock_timeout, true)"
)

# EXPIRE_ONE — mark one subscription EXPIRED if it is still in the expected state and past its expiry.
#   :id           bigint  subscription id
#   :from_status  text    ACTIVE (nightly) or FAILED (retry)
#   :run_date     date    the run date
# Returns the id when the row was changed; nothing when another writer changed it meanwhile.
EXPIRE_ONE = sa.text(
    """
UPDATE subscriptions
   SET status = 'EXPIRED', last_error = NULL
 WHERE id = :id AND status = :from_status AND expiry_date < :run_date
RETURNING id
"""
)

# EXPIRE_BATCH — a whole batch in one statement: mark EXPIRED every subscription still in the
# expected state and past its expiry, and delete exactly those subscriptions' enrollments. Run
# in one short transaction, so each subscription is still all-or-nothing; if the statement fails
# (one bad row), the batch is redone one subscription per transaction.
#   :ids          bigint[] subscription ids of the batch
#   :from_status  text     ACTIVE (nightly) or FAILED (retry)
#   :run_date     date     the run date
# Returns one row: (subscriptions expired, enrollments deleted).
EXPIRE_BATCH = sa.text(
    """
WITH expired AS (
    UPDATE subscriptions
       SET status = 'EXPIRED', last_error = NULL
     WHERE id = ANY(CAST(:ids AS bigint[])) AND status = :from_status AND expiry_date < :run_date
    RETURNING id
), deleted AS (
    DELETE FROM enrollments WHERE subscription_id IN (SELECT id FROM expired)
    RETURNING 1
)
SELECT (SELECT count(*) FROM expired), (SELECT count(*) FROM deleted)
"""
)

# DELETE_ENROLLMENTS — the enrollments of one subscription (enrollments_subscription_idx).
#   :id  bigint  subscription id
DELETE_ENROLLMENTS = sa.text("DELETE FROM enrollments WHERE subscription_id = :id")

# MARK_FAILED — record a failed expiry: FAILED, retry_count + 1, last_error.
#   :id           bigint  subscription id
#   :from_status  text    the state the row was selected in (ACTIVE or FAILED)
#   :error        text    one line, clipped
# Returns the new retry_count (nothing when another writer changed the row meanwhile).
MARK_FAILED = sa.text(
    """
UPDATE subscriptions
   SET status = 'FAILED', retry_count = retry_count + 1, last_error = :error
 WHERE id = :id AND status = :from_status
RETURNING retry_count
"""
)


@dataclass(frozen=True)
class ExpirySettings:
    """Knobs of the expiry job; 0 or None means the documented default (use `build`)."""

    batch_size: int = 500  # rows read per keyset batch (1..10000)
    max_retries: int = 3  # retry_failed retries rows with retry_count below this; reaching it alerts
    lock_ttl_s: float = 120  # lock-at-most-for; renewed by the heartbeat (and checked after each batch)
    lock_min_s: float = 60  # lock-at-least-for
    lease_ttl_s: float = 60  # the run's lease; renewed by the heartbeat, fences every write transaction
    heartbeat_s: float = 10  # renewal interval of lock and lease
    row_timeout_s: float = 5  # statement_timeout of each per-row transaction; lock_timeout is half of it
    batch_timeout_s: float = 30  # statement_timeout of the one-statement batch transaction
    max_batch_failures: int = 3  # consecutive transient batch failures before the run ends FAILURE
    retry_backoff_s: float = 1.0  # wait after the first transient failure, doubled after each next one

    def __post_init__(self) -> None:
        check_positive_fields(self)
        if self.batch_size > 10_000:
            raise ConfigError(f"must be <= 10000, got {self.batch_size}", field="batch_size")
        if self.max_retries > 1000:
            raise ConfigError(f"must be <= 1000, got {self.max_retries}", field="max_retries")
        if self.max_batch_failures > 100:
            raise ConfigError(f"must be <= 100, got {self.max_batch_failures}", field="max_batch_failures")
        if self.retry_backoff_s > 60:
            raise ConfigError(f"must be <= 60, got {self.retry_backoff_s}", field="retry_backoff_s")
        if self.lock_min_s > self.lock_ttl_s:
            raise ConfigError(f"must be <= lock_ttl_s ({self.lock_ttl_s}), got {self.lock_min_s}", field="lock_min_s")
        if self.row_timeout_s >= self.lock_ttl_s:
            raise ConfigError("must be < lock_ttl_s", field="row_timeout_s")
        if self.heartbeat_s >= min(self.lock_ttl_s, self.lease_ttl_s):
            raise ConfigError("must be shorter than lock_ttl_s and lease_ttl_s", field="heartbeat_s")

    @property
    def lock_fail_open(self) -> bool:
        """Expiry never runs without its lock (job_guard reads this)."""
        return False

    @classmethod
    def build(cls, **overrides: Any) -> ExpirySettings:
        """Settings from keyword overrides; a value of 0 or None takes the default; unknown names are errors."""
        return build_settings(cls, overrides)


MAX_ALERT_IDS = 1000
"""At most this many subscription ids are kept for the retries-exhausted alert (memory stays bounded)."""


@dataclass
class ExpiryResult:
    """Counters of one expiry run."""

    run_date: date
    mode: str = "nightly"  # nightly | retry_failed
    scanned: int = 0  # rows selected
    expired: int = 0  # rows set EXPIRED (their enrollments deleted)
    unchanged: int = 0  # selected, but changed by another writer before this run got to them
    failed: int = 0  # rows whose expiry failed this run
    failed_by_type: Counter[str] = field(default_factory=Counter)
    enrollments_deleted: int = 0
    batches: int = 0
    max_batch_rows: int = 0
    duration_s: float = 0.0
    stopped_by: str = ""  # done | stop | lock_lost | lease_lost | batch_failures
    status: str = "SUCCESS"
    error: str | None = None
    batch_retries: int = 0  # transient batch failures that were retried
    exhausted: int = 0  # rows whose failure this run brought retry_count to max_retries
    exhausted_ids: list[int] = field(default_factory=list)  # the first MAX_ALERT_IDS of them

    def to_summary(self, run_id: str) -> dict[str, Any]:
        """The CONTRACT §2 summary (changed = expired) plus run_date, mode and extras."""
        summary = {
            "status": self.status,
            "run_id": run_id,
            "scanned": self.scanned,
            "changed": self.expired,
            "unchanged": self.unchanged,
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


Fence = Callable[[sa.Connection, Mapping[str, str]], None]
"""Inside a write transaction: set its timeouts and check the run still owns its lease (raises LeaseLost)."""


@dataclass
class _Position:
    """The keyset position: everything before it has been handled (committed or recorded as failed)."""

    after_date: date | None = None
    after_id: int = _MIN_BIGINT


def _transient(exc: BaseException) -> bool:
    """A failure of the connection or the server, worth retrying the batch on a fresh connection."""
    if isinstance(exc, DatabaseUnavailable):
        return True
    if isinstance(exc, sa.exc.DBAPIError):
        sqlstate = getattr(exc.orig, "sqlstate", None) or ""
        return (
            exc.connection_invalidated
            or isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError) and not sqlstate.startswith("57014")
            or sqlstate.startswith("08")
            or sqlstate.startswith("57P")
            or sqlstate in ("40001", "40P01")
        )
    # SQLAlchemy's "Can't reconnect until invalid transaction is rolled back" and friends.
    return isinstance(exc, sa.exc.PendingRollbackError | sa.exc.ResourceClosedError)


def run_expiry(
    engine: sa.Engine,
    *,
    run_date: date,
    settings: ExpirySettings,
    retry_failed: bool = False,
    stop: threading.Event | None = None,
    progress: Callable[[ExpiryResult], None] | None = None,
    keep_alive: Callable[[], bool] | None = None,
    fence: Fence | None = None,
) -> ExpiryResult:
    """Expire ACTIVE subscriptions with expiry_date < run_date (or, retry_failed=True, retry FAILED ones).

    Each row is expired atomically in its own transaction; a row that fails is marked FAILED
    (retry_count + 1, last_error) in a transaction of its own and the run goes on. A transient
    failure of a batch (connection lost, server restart, deadlock) is retried from the same keyset
    position on a fresh connection after a backoff; after `max_batch_failures` consecutive ones the
    run ends FAILURE (`stopped_by` = "batch_failures"). `keep_alive` is called after each batch (e.g.
    to check the job lock); False stops the run. `fence` (from the run's guard) starts every write
    transaction; a lost lease ends the run FAILURE before it writes anything more.
    """
    if not isinstance(run_date, date):
        raise ConfigError(f"must be a date, got {run_date!r}", field="run_date")
    started = time.monotonic()
    result = ExpiryResult(run_date=run_date, mode="retry_failed" if retry_failed else "nightly")
    position = _Position()
    consecutive = 0
    batches_at_last_failure = -1
    backoff = settings.retry_backoff_s
    reason = "done"
    while True:
        try:
            with translate_errors(engine), engine.connect() as conn:
                reason = _run_batches(
                    conn, position, result, settings=settings, run_date=run_date, retry_failed=retry_failed,
                    stop=stop, progress=progress, keep_alive=keep_alive, fence=fence, started=started,
                )
            break
        except LeaseLost as exc:
            reason, result.error = "lease_lost", str(exc)
            break
        except Exception as exc:
            if not _transient(exc):
                raise
            # Only consecutive failures count: a batch that succeeded since the last one resets the count.
            consecutive = 1 if result.batches > batches_at_last_failure else consecutive + 1
            batches_at_last_failure = result.batches
            what = _one_line(exc)
            if consecutive >= settings.max_batch_failures:
                reason = "batch_failures"
                result.error = f"{consecutive} consecutive batch failures; last: {what}"
                log.error("subscription expiry: %s", result.error)
                break
            result.batch_retries += 1
            log.warning("subscription expiry: batch failed (%s); retry %d of %d in %.1fs",
                        what, consecutive, settings.max_batch_failures - 1, backoff)
            if stop is not None and stop.wait(backoff) or stop is None and _sleep(backoff):
                reason = "stop"
                break
            backoff = min(backoff * 2, 60.0)
    stopped = reason == "stop" or (reason != "done" and stop is not None and stop.is_set())
    if reason in ("lock_lost", "lease_lost", "batch_failures") or stopped:
        # A stop (SIGTERM, run termination) before the last batch leaves due subscriptions ACTIVE: the run
        # did not do its work, so it is not SUCCESS; the next run picks them up (they are still due).
        result.status = "FAILURE"
        if stopped and not result.error:
            result.error = "stopped before every due subscription was expired; the next run continues"
    result.stopped_by = "stop" if stopped else reason
    result.duration_s = time.monotonic() - started
    log.info(
        "subscription expiry %s run_date=%s: scanned=%d expired=%d failed=%d",
        result.mode,
        run_date,
        result.scanned,
        result.expired,
        result.failed,
    )
    return result


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)  # a retry backoff in the product, not a test synchronisation
    return False


def _one_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    return f"{type(orig).__name__}: {first}"[:ERROR_MAX_CHARS]


def _run_batches(
    conn: sa.Connection,
    position: _Position,
    result: ExpiryResult,
    *,
    settings: ExpirySettings,
    run_date: date,
    retry_failed: bool,
    stop: threading.Event | None,
    progress: Callable[[ExpiryResult], None] | None,
    keep_alive: Callable[[], bool] | None,
    fence: Fence | None,
    started: float,
) -> str:
    """Batches from `position` until done; returns the stop reason. Connection errors propagate."""
    from_status = "FAILED" if retry_failed else "ACTIVE"
    # lock_timeout below statement_timeout, so a row lock held by another writer is
    # reported as lock_not_available rather than as a generic statement timeout.
    timeouts = {
        "statement_timeout": str(max(1, round(settings.row_timeout_s * 1000))),
        "lock_timeout": str(max(1, round(settings.row_timeout_s * 500))),
    }
    batch_timeouts = {
        "statement_timeout": str(max(1, round(settings.batch_timeout_s * 1000))),
        "lock_timeout": timeouts["lock_timeout"],
    }
    writer = _Writer(fence, settings.max_retries)
    while True:
        if stop is not None and stop.is_set():
            return "stop"
        with conn.begin():
            if retry_failed:
                params = {"run_date": run_date, "max_retries": settings.max_retries, "after_id": position.after_id}
                batch = conn.execute(RETRY_BATCH, {**params, "limit": settings.batch_size}).all()
            else:
                params = {"run_date": run_date, "after_date": position.after_date, "after_id": position.after_id}
                batch = conn.execute(NIGHTLY_BATCH, {**params, "limit": settings.batch_size}).all()
        if not batch:
            return "done"
        if writer.expire_batch(conn, [row.id for row in batch], from_status, run_date, batch_timeouts, result):
            result.scanned += len(batch)
            position.after_date, position.after_id = batch[-1].expiry_date, batch[-1].id
        else:
            for row in batch:
                if stop is not None and stop.is_set():
                    break
                writer.expire_one(conn, row.id, from_status, run_date, timeouts, result)
                result.scanned += 1
                position.after_date, position.after_id = row.expiry_date, row.id
        result.batches += 1
        result.max_batch_rows = max(result.max_batch_rows, len(batch))
        result.duration_s = time.monotonic() - started
        if progress is not None:
            progress(result)
        if keep_alive is not None and not keep_alive():
            return "lock_lost"
        if len(batch) < settings.batch_size:
            return "done"


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
    Every write transaction fences the lease; after each batch the lock is checked, so a run
    that lost it stops (FAILURE, "lock_lost").
    """
    from batch_assets.locking.guard import job_guard

    if lock is None:
        from batch_assets.locking.lock import PostgresJobLock

        lock = PostgresJobLock(engine)
    with job_guard(engine, job_key=JOB_LOCK_NAME, run_id=run_id, settings=settings, lock=lock) as guard:

        def keep_alive() -> bool:
            return guard.alive() and bool(lock.extend(JOB_LOCK_NAME, guard.owner, settings.lock_ttl_s))

        result = run_expiry(
            engine,
            run_date=run_date,
            settings=settings,
            retry_failed=retry_failed,
            stop=stop,
            progress=progress,
            keep_alive=keep_alive,
            fence=guard.fence,
        )
        if result.status != "SUCCESS":
            guard.mark_failed()  # a retry must not wait for lock-at-least-for
        return result


class _Writer:
    """The write transactions of a run: each starts with one preamble that sets its timeouts and,
    under a guard, fences the lease in the same round trip."""

    def __init__(self, fence: Fence | None, max_retries: int) -> None:
        self.fence = fence
        self.max_retries = max_retries

    def _preamble(self, conn: sa.Connection, timeouts: Mapping[str, str]) -> None:
        if self.fence is not None:
            self.fence(conn, timeouts)
        else:
            conn.execute(SET_TIMEOUTS, timeouts)

    def expire_batch(
        self,
        conn: sa.Connection,
        ids: list[int],
        from_status: str,
        run_date: date,
        timeouts: Mapping[str, str],
        result: ExpiryResult,
    ) -> bool:
        """Expire the whole batch in one short transaction; False (rolled back, nothing counted) on a row error."""
        try:
            with conn.begin():
                self._preamble(conn, timeouts)
                expired, deleted = conn.execute(
                    EXPIRE_BATCH, {"ids": ids, "from_status": from_status, "run_date": run_date}
                ).one()
        except sa.exc.DBAPIError as exc:
            if exc.connection_invalidated or not isinstance(exc, sa.exc.DatabaseError) or _connection_level(exc):
                raise
            log.info("subscription expiry: batch of %d failed (%s); redoing it one subscription at a time",
                     len(ids), _describe(exc)[0])
            return False
        result.expired += int(expired)
        result.unchanged += len(ids) - int(expired)
        result.enrollments_deleted += int(deleted)
        return True

    def expire_one(
        self,
        conn: sa.Connection,
        sub_id: int,
        from_status: str,
        run_date: date,
        timeouts: Mapping[str, str],
        result: ExpiryResult,
    ) -> None:
        try:
            with conn.begin():
                self._preamble(conn, timeouts)
                changed = conn.execute(
                    EXPIRE_ONE, {"id": sub_id, "from_status": from_status, "run_date": run_date}
                ).first()
                if changed is None:
                    result.unchanged += 1
                    return
                deleted = conn.execute(DELETE_ENROLLMENTS, {"id": sub_id}).rowcount
        except sa.exc.DBAPIError as exc:
            if exc.connection_invalidated or not isinstance(exc, sa.exc.DatabaseError) or _connection_level(exc):
                raise
            kind, error = _describe(exc)
            result.failed += 1
            result.failed_by_type[kind] += 1
            log.warning("subscription %s: expiry failed (%s)", sub_id, kind)
            self.mark_failed(conn, sub_id, from_status, error, timeouts, result)
            return
        result.expired += 1
        result.enrollments_deleted += max(deleted, 0)

    def mark_failed(
        self,
        conn: sa.Connection,
        sub_id: int,
        from_status: str,
        error: str,
        timeouts: Mapping[str, str],
        result: ExpiryResult,
    ) -> None:
        """Record the failure in a transaction of its own; if even that fails, the row stays as it was."""
        try:
            with conn.begin():
                self._preamble(conn, timeouts)
                retry_count = conn.execute(
                    MARK_FAILED, {"id": sub_id, "from_status": from_status, "error": error}
                ).scalar()
        except sa.exc.DBAPIError as exc:
            if exc.connection_invalidated or not isinstance(exc, sa.exc.DatabaseError) or _connection_level(exc):
                raise
            # e.g. the subscription row itself is locked by another writer: it stays selectable
            # and the next run tries it again; this run's keyset has already moved past it.
            log.warning("subscription %s: could not record the failure (%s)", sub_id, _describe(exc)[0])
            return
        if retry_count is not None and retry_count >= self.max_retries:
            # No retry will select it again: the retries-exhausted alert names it (ids only).
            result.exhausted += 1
            if len(result.exhausted_ids) < MAX_ALERT_IDS:
                result.exhausted_ids.append(int(sub_id))


def _connection_level(exc: sa.exc.DBAPIError) -> bool:
    # Class 08 = connection exception; 57P0x = admin shutdown / crash shutdown / cannot connect now.
    sqlstate = getattr(exc.orig, "sqlstate", None) or ""
    return sqlstate.startswith("08") or sqlstate.startswith("57P")


def _describe(exc: sa.exc.DBAPIError) -> tuple[str, str]:
    """(kind, one-line error) of a per-row database error; kind is the driver's error class in snake_case."""
    orig = exc.orig if exc.orig is not None else exc
    kind = re.sub(r"(?<!^)(?=[A-Z])", "_", type(orig).__name__).lower()
    first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    text = f"{kind}: {first}"
    return kind, text if len(text) <= ERROR_MAX_CHARS else text[: ERROR_MAX_CHARS - 1] + "…"
