"""The subscription expiry (docs/guide/subscriptions.md) as a `Sweep` on the engine's plug-in API.

Row = (id, expiry_date). Nothing is computed: every selected row is to be expired. The engine reads
keyset batches, writes a batch in one statement (EXPIRE_BATCH) and, when that fails for a row's own
reason, one subscription per transaction (EXPIRE_ONE + DELETE_ENROLLMENTS), so each subscription is
all-or-nothing. A row whose expiry fails is recorded FAILED (MARK_FAILED) in a transaction of its own.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from datetime import date
from typing import Any

import sqlalchemy as sa

from batch_assets import (
    ConfigError,
    CursorRange,
    RowOutcome,
    SqlReader,
    Sweep,
    WriteCounts,
    WriteFailures,
    first_line,
    is_transient,
)
from batch_assets.reference.subscriptions import sql

log = logging.getLogger(__name__)

SWEEP_NAME = "subscription_expiry"
NIGHTLY = "nightly"
RETRY_FAILED = "retry_failed"
MODES = (NIGHTLY, RETRY_FAILED)
MAX_BATCH_SIZE = 10_000
"""A batch's ids travel as one bigint[] parameter of EXPIRE_BATCH (no IN-list limit)."""
ERROR_MAX_CHARS = 500
MAX_ALERT_IDS = 1000
"""At most this many subscription ids are kept for the retries-exhausted alert (memory stays bounded)."""
ENROLLMENTS_DELETED = "enrollments_deleted"
_MIN_BIGINT = -(2**63)


class ExpiryReader(SqlReader):
    """nightly: ACTIVE subscriptions past their expiry, in (expiry_date, id) order; retry_failed: FAILED ones
    under max_retries, in id order. Whole key space only."""

    max_page_size = MAX_BATCH_SIZE
    # A row whose expiry failed is FAILED (the retry mode selects it) or, if even that could not be
    # recorded, still in its selected state: the next run of the mode selects it again.
    failed_writes_stay_due = True

    def __init__(self, mode: str, run_date: date, max_retries: int) -> None:
        self.retry = mode == RETRY_FAILED
        self.run_date = run_date
        self.max_retries = max_retries

    def first_page_sql(self) -> sa.TextClause:
        return sql.RETRY_BATCH if self.retry else sql.NIGHTLY_BATCH

    def after_page_sql(self) -> sa.TextClause:
        return self.first_page_sql()

    def page_params(self, cursor: Any, limit: int, cursor_range: CursorRange) -> dict[str, Any]:
        params: dict[str, Any] = {"run_date": self.run_date, "limit": limit, "after_id": _MIN_BIGINT}
        if self.retry:
            params["max_retries"] = self.max_retries
            if cursor is not None:
                params["after_id"] = cursor
            return params
        params["after_date"] = None
        if cursor is not None:
            after_date, params["after_id"] = cursor
            params["after_date"] = date.fromisoformat(after_date)
        return params

    def cursor_of(self, row: Any) -> Any:
        if self.retry:
            return row[0]
        return [row[1].isoformat(), row[0]]


class ExpiryFailures(WriteFailures):
    """Only a failure of the connection or the server is retried as it is; any other failure of a subscription's
    own write is named by the driver's error class and recorded FAILED (retry_count + 1, last_error)."""

    def __init__(self, from_status: str, max_retries: int) -> None:
        self.from_status = from_status
        self.max_retries = max_retries
        self._lock = threading.Lock()
        self.exhausted = 0
        """Rows whose failure this run brought retry_count to max_retries."""
        self.exhausted_ids: list[int] = []
        """The first MAX_ALERT_IDS of them."""

    def retryable(self, exc: BaseException) -> bool:
        # A timeout, a lock timeout or a deadlock is the row's (its enrollments are locked by another writer):
        # the batch falls back to one subscription per transaction and that one is marked FAILED.
        if isinstance(exc, sa.exc.DBAPIError):
            sqlstate = getattr(exc.orig, "sqlstate", None) or ""
            return (exc.connection_invalidated or not isinstance(exc, sa.exc.DatabaseError)
                    or sqlstate.startswith(("08", "57P")))
        return is_transient(exc)

    def kind(self, exc: BaseException) -> str:
        """The driver's error class in snake_case (e.g. raise_exception, lock_not_available)."""
        orig = getattr(exc, "orig", None) or exc
        return re.sub(r"(?<!^)(?=[A-Z])", "_", type(orig).__name__).lower()

    def record(self, conn: sa.Connection, outcome: RowOutcome, exc: BaseException) -> Callable[[], None] | None:
        """MARK_FAILED, only if the row still holds what was read; once committed, a row that reached
        max_retries is counted for the retries-exhausted alert."""
        kind = self.kind(exc)
        subscription_id, expiry_date = outcome.change
        # Per row at DEBUG only: the engine's one warning per batch counts the failures by kind.
        log.debug("subscription %s: expiry failed (%s)", subscription_id, kind)
        orig = getattr(exc, "orig", None) or exc
        text = f"{kind}: {first_line(str(orig)) or type(orig).__name__}"
        if len(text) > ERROR_MAX_CHARS:
            text = text[: ERROR_MAX_CHARS - 1] + "…"
        params = {"id": subscription_id, "expiry_date": expiry_date, "from_status": self.from_status, "error": text}
        retry_count: int | None = conn.execute(sql.MARK_FAILED, params).scalar()
        if retry_count is None or retry_count < self.max_retries:
            return None
        return lambda: self._exhausted(int(subscription_id))

    def _exhausted(self, subscription_id: int) -> None:
        # No retry will select it again: the retries-exhausted alert names it (ids only).
        with self._lock:
            self.exhausted += 1
            if len(self.exhausted_ids) < MAX_ALERT_IDS:
                self.exhausted_ids.append(subscription_id)


class ExpirySweep(Sweep):
    """nightly (ACTIVE past their expiry) | retry_failed (FAILED under max_retries) subscriptions. Hooks: its own
    per-row write (EXPIRE_ONE + DELETE_ENROLLMENTS) and write failures (ExpiryFailures)."""

    name = SWEEP_NAME
    write_failures: ExpiryFailures

    def __init__(self, mode: str, *, run_date: date, max_retries: int) -> None:
        if mode not in MODES:
            raise ConfigError(f"must be one of {', '.join(MODES)}, got {mode!r}", field="mode")
        self.mode = mode
        self.run_date = run_date
        self.max_retries = max_retries
        self.from_status = "FAILED" if mode == RETRY_FAILED else "ACTIVE"
        self.reader = ExpiryReader(mode, run_date, max_retries)
        self.write_failures = ExpiryFailures(self.from_status, max_retries)

    @property
    def exhausted(self) -> int:
        """Rows whose failure this run brought retry_count to max_retries."""
        return self.write_failures.exhausted

    @property
    def exhausted_ids(self) -> list[int]:
        """The first MAX_ALERT_IDS of them."""
        return self.write_failures.exhausted_ids

    # Computing -------------------------------------------------------------

    def compute(self, row: Any) -> RowOutcome:
        return RowOutcome((row[0], row[1]))  # (id, expiry_date as read): the write expires it only if unchanged

    # Writing ---------------------------------------------------------------

    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        params = {"ids": [o.change[0] for o in changed], "expiry_dates": [o.change[1] for o in changed],
                  "from_status": self.from_status, "run_date": self.run_date}
        expired, deleted, conflicts = conn.execute(sql.EXPIRE_BATCH, params).one()
        return WriteCounts(int(expired), extra={ENROLLMENTS_DELETED: int(deleted)}, conflicts=int(conflicts))

    def write_row(self, conn: sa.Connection, outcome: RowOutcome) -> WriteCounts:
        subscription_id, expiry_date = outcome.change
        params = {"id": subscription_id, "expiry_date": expiry_date, "from_status": self.from_status,
                  "run_date": self.run_date}
        if conn.execute(sql.EXPIRE_ONE, params).first() is None:
            return WriteCounts(0, conflicts=1)  # changed by another writer since the read: left to the next run
        deleted = conn.execute(sql.DELETE_ENROLLMENTS, {"id": subscription_id}).rowcount
        return WriteCounts(1, extra={ENROLLMENTS_DELETED: max(deleted, 0)})
