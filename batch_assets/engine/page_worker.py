"""A page on a worker thread: each row computed outside any transaction, then the changes written in (at most)
two short transactions, and row by row when the page write fails for the rows' own reason."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

from batch_assets.db.engine import is_transient
from batch_assets.db.timeouts import SET_LOCAL_TIMEOUTS, local_timeouts
from batch_assets.engine.breaker import over_ratio
from batch_assets.engine.definition import RowOutcome, RunGuardLike, Sweep, WriteCounts
from batch_assets.engine.result import INVALID_VALUE, PageCounts
from batch_assets.engine.retry import Retrier, discard
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import error_text

log = logging.getLogger("batch_assets.sweep")

T = TypeVar("T")


class PageWorker:
    """Computes and writes one page at a time; shared by a run's worker threads (it keeps no page's state)."""

    def __init__(
        self,
        engine: sa.Engine,
        definition: Sweep,
        settings: SweepSettings,
        guard: RunGuardLike | None,
        retrying: Retrier,
    ) -> None:
        self.engine = engine
        self.definition = definition
        self.settings = settings
        self.guard = guard
        self.retrying = retrying
        # SET_LOCAL_TIMEOUTS' parameters, computed once: sent first in every write transaction.
        page_s, row_s, lock_s = settings.page_timeout_s, settings.row_timeout_s, settings.lock_timeout_s
        self.page_timeouts = local_timeouts(page_s, min(lock_s, page_s))
        self.row_timeouts = local_timeouts(row_s, min(lock_s, row_s))

    def process(self, rows: Sequence[Any]) -> tuple[PageCounts, float]:
        """Compute every row of a page and write its changes: the page's counts and the seconds it took."""
        started = time.monotonic()
        definition = self.definition
        page = PageCounts()
        page.scanned = len(rows)
        pre_check = definition.pre_check  # hooks are looked up once per page, never per row
        compute = definition.compute
        debug = log.isEnabledFor(logging.DEBUG)
        changed: list[RowOutcome] = []
        for row in rows:
            if pre_check is not None and not pre_check(row):
                page.unchanged += 1
                continue
            try:
                outcome = compute(row)
            except Exception as exc:  # a defect in compute: fail the row, and count it as systemic
                page.fail(INVALID_VALUE, systemic=True)
                log.warning("sweep %s: compute raised %s for %s", definition.name, type(exc).__name__,
                            self._describe(row))
                continue
            page.decrypted += outcome.decrypted
            if outcome.failure is not None:
                # A known bad row (same failure last time) is data, whatever its kind; only new
                # systemic failures feed the breaker.
                page.fail(outcome.failure, systemic=False if outcome.known else None)
                if debug:
                    log.debug("sweep %s: row %s failed: %s", definition.name, self._describe(row),
                              outcome.failure)
            elif outcome.change is None:
                page.unchanged += 1
            if outcome.change is not None:
                changed.append(outcome)
        if changed and over_ratio(page, self.settings):
            # This page may trip the breaker (a wrong key, a broken dependency): its failed rows' writes (the
            # marker, the cleared date) wait for the drain, which knows whether it trips. If it does, they are
            # never written, so a systemic failure never turns rows into "known bad" ones and a wrong key
            # writes nothing; the page never moves the low watermark and the run that resumes it evaluates
            # those rows again. If it does not (the run has not seen breaker_min_rows rows), they are written.
            page.deferred = [outcome for outcome in changed if outcome.failure is not None]
            changed = [outcome for outcome in changed if outcome.failure is None]
        if changed:
            self.write(changed, page)
        return page, time.monotonic() - started

    def _describe(self, row: Any) -> str:
        """How a row is named in logs: its cursor as shown to people (an id, never a sensitive value)."""
        reader = self.definition.reader
        return str(reader.display_cursor(reader.cursor_of(row)))

    def begin(self, conn: sa.Connection, timeouts: dict[str, str]) -> None:
        """First statement of every write transaction: SET LOCAL the timeouts and, when guarded, fence
        the lease in the same round trip, so a zombie that lost its lease commits nothing."""
        if self.guard is not None:
            self.guard.fence(conn, timeouts)
        else:
            conn.execute(SET_LOCAL_TIMEOUTS, timeouts)

    def write(self, changed: list[RowOutcome], page: PageCounts) -> None:
        """Side effects, then the page write; on a failure caused by the rows, one transaction per row.

        Every transaction is all or nothing and counted only once it committed, so a transaction that
        failed for a transient reason (connection lost, server restarting, timeout) is simply run again
        on a fresh connection (`Retrier`). When the retries are spent, PageNotDone leaves the page
        unfinished: the low watermark never passes it and the run ends FAILURE, resumable.
        """
        definition = self.definition
        side_effects = definition.side_effects
        with _PageConnection(self.engine) as held:
            # 1. Side effects that must survive a failed page, in their own short transaction, first:
            #    if the page write then fails, the stored row still differs and the next run redoes both.
            #    A sweep without the hook opens no transaction for it.
            side_effects_done = side_effects is None
            try:
                if side_effects is not None:
                    page.triggers += held.transaction(
                        self, "side-effect write", self.page_timeouts, lambda conn: side_effects(conn, changed),
                    )
                    side_effects_done = True
            except sa.exc.DBAPIError as exc:
                log.warning("sweep %s: side-effect write failed (%s); retrying row by row", definition.name,
                            error_text(exc))
            # 2. The page write: data + stamp + outbox in one transaction with its own timeouts.
            if side_effects_done:
                try:
                    counts = held.transaction(
                        self, "page write", self.page_timeouts, lambda conn: definition.write_page(conn, changed)
                    )
                    _take(page, counts)
                    return
                except sa.exc.DBAPIError as exc:
                    log.warning("sweep %s: page write failed (%s); retrying row by row", definition.name,
                                error_text(exc))
            # 3. Fallback: one short transaction per row; a row that fails for its own reason keeps its
            #    stored (due) state and is counted; a transient failure that outlasts the retries stops the page.
            for outcome in changed:
                self._write_one(held, outcome, page, side_effects_done)

    def _write_one(
        self, held: _PageConnection, outcome: RowOutcome, page: PageCounts, side_effects_done: bool
    ) -> None:
        definition = self.definition
        side_effects = definition.side_effects
        try:
            if not side_effects_done and side_effects is not None:
                page.triggers += held.transaction(
                    self, "row side-effect write", self.row_timeouts, lambda conn: side_effects(conn, (outcome,)),
                )
            counts = held.transaction(
                self, "row write", self.row_timeouts, lambda conn: definition.write_row(conn, outcome)
            )
        except sa.exc.DBAPIError as exc:  # the row's own failure (retryable ones are retried, then PageNotDone)
            failures = definition.write_failures
            if outcome.failure is None:
                page.fail(failures.kind(exc))
                page.unwritten += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug("sweep %s: row write failed: %s", definition.name, error_text(exc))
            if failures.record is not None:
                self._record_failure(held, failures.record, outcome, exc)
            return
        _take(page, counts)

    def _record_failure(
        self,
        held: _PageConnection,
        record: Callable[[sa.Connection, RowOutcome, BaseException], Callable[[], None] | None],
        outcome: RowOutcome,
        exc: sa.exc.DBAPIError,
    ) -> None:
        """The sweep's record of a failed row write (`WriteFailures.record`), in a short transaction of its
        own; what it returned runs once that transaction committed."""
        try:
            committed = held.transaction(
                self, "failure record", self.row_timeouts, lambda conn: record(conn, outcome, exc),
            )
        except sa.exc.DBAPIError as record_exc:  # e.g. the row itself is locked: it keeps its stored state
            log.warning("sweep %s: a failed row write was not recorded (%s)", self.definition.name,
                        error_text(record_exc))
            return
        if committed is not None:
            committed()


def _take(page: PageCounts, counts: WriteCounts) -> None:
    """Count a committed write. A row it did not apply because another writer changed it since the read
    is a conflict (left as that writer left it, due), never `unchanged`."""
    page.changed += counts.rows
    page.audit_events += counts.audit_events
    page.triggers += counts.triggers
    page.conflicts += counts.conflicts
    page.add_extra(counts.extra)


class _PageConnection:
    """The one connection a page's transactions use, replaced by a fresh one after a transient failure."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.conn: sa.Connection | None = None

    def __enter__(self) -> _PageConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def transaction(
        self, worker: PageWorker, what: str, timeouts: dict[str, str], work: Callable[[sa.Connection], T]
    ) -> T:
        """`work(conn)` in one transaction (fenced, with `timeouts`), retried on transient failures."""

        def once() -> T:
            if self.conn is None:
                self.conn = self.engine.connect()
            conn = self.conn
            try:
                with conn.begin():
                    worker.begin(conn, timeouts)
                    return work(conn)
            except Exception as exc:
                if is_transient(exc):
                    self.conn = None
                    discard(conn)
                raise

        return worker.retrying(what, once, retryable=worker.definition.write_failures.retryable)
