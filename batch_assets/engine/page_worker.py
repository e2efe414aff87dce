"""A page on a worker thread: each row computed outside any transaction, then the changes written in (at most)
two short transactions, and row by row when the page write fails for the rows' own reason.

A sweep whose compute calls are bounded (`Sweep.call_timeout_s`, or the run's `call_timeout_s`) computes each page on
a compute thread of its own while the page's worker thread watches it: a call past the bound is left to its thread
(a Python thread cannot be killed), its row is counted `compute_timeout`, and the rest of the page goes on on another
thread. A call left behind can never write: its result goes to a computation no one reads any more. Once the run
gives up on its pages in flight (`abandon`: the drain timed out, the run stopped), no page of it writes any more.

Failures are logged per row at DEBUG only; pages with systemic failures (compute defects, timeouts, failed row
writes) are told in a few WARNINGs per run counting them by kind (`systemic_log`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import sqlalchemy as sa

from batch_assets.db.engine import is_transient
from batch_assets.db.timeouts import SET_LOCAL_TIMEOUTS, local_timeouts
from batch_assets.engine.breaker import over_ratio
from batch_assets.engine.definition import UNCHANGED, RowOutcome, RunGuardLike, Sweep, WriteCounts
from batch_assets.engine.failures import COMPUTE_TIMEOUT
from batch_assets.engine.result import INVALID_VALUE, PageCounts
from batch_assets.engine.retry import PageNotDone, Retrier, discard
from batch_assets.engine.settings import SweepSettings
from batch_assets.engine.systemic_log import SystemicWarnings
from batch_assets.shutdown import DaemonThreadPool

log = logging.getLogger("batch_assets.sweep")

T = TypeVar("T")

MAX_WATCH_S = 0.5
"""How often, at most, a page's worker looks at its compute thread: whether the call in hand outlasted its bound, and
whether the run still waits for the page."""


class _Raised:
    """A row whose compute raised (the exception's type name only: its message may hold a value)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_SKIPPED = object()
"""A row the pre-check found unchanged (not computed)."""
_TIMED_OUT = object()
"""A row whose compute call outlasted its bound."""


class _Computation:
    """A page's rows computed on a compute thread from `start` on: their outcomes in row order (one appended as each
    call returns, so `start + len(outcomes)` is the row whose call is in hand), and whether it was left behind."""

    __slots__ = ("rows", "start", "outcomes", "left")

    def __init__(self, rows: Sequence[Any], start: int) -> None:
        self.rows = rows
        self.start = start
        self.outcomes: list[Any] = []
        self.left = False


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
        self.describe_error = definition.describe_error
        self.warnings = SystemicWarnings(definition.name)
        self.abandoned = threading.Event()
        """Set once the run no longer waits for its pages in flight: none of them writes any more."""
        bound = settings.call_timeout_s if settings.call_timeout_s is not None else definition.call_timeout_s
        self.call_timeout_s = bound
        self.calls = None if bound is None else DaemonThreadPool(settings.workers, f"{definition.name}-compute")
        # SET_LOCAL_TIMEOUTS' parameters, computed once: sent first in every write transaction.
        page_s, row_s, lock_s = settings.page_timeout_s, settings.row_timeout_s, settings.lock_timeout_s
        self.page_timeouts = local_timeouts(page_s, min(lock_s, page_s))
        self.row_timeouts = local_timeouts(row_s, min(lock_s, row_s))

    def process(self, rows: Sequence[Any]) -> tuple[PageCounts, float]:
        """Compute every row of a page and write its changes: the page's counts and the seconds it took."""
        started = time.monotonic()
        page = PageCounts()
        page.scanned = len(rows)
        changed = self._computed_inline(rows, page) if self.calls is None else self._computed_bounded(rows, page)
        if changed and over_ratio(page, self.settings):
            # This page may trip the breaker (a wrong key, a broken dependency): its failed rows' writes (the
            # marker, the cleared date) wait for the drain, which knows whether it trips. If it does, they are
            # never written, so a systemic failure never turns rows into "known bad" ones and a wrong key
            # writes nothing; the page never moves the low watermark and the run that resumes it evaluates
            # those rows again. If it does not (the run has not seen breaker_min_rows rows), they are written.
            page.deferred = [outcome for outcome in changed if outcome.failure is not None]
            changed = [outcome for outcome in changed if outcome.failure is None]
        if self.abandoned.is_set():
            raise PageNotDone("the run stopped waiting for this page: nothing of it is written")
        if changed:
            self.write(changed, page)
        if page.systemic_by_type:
            self.warnings.add(page)
        return page, time.monotonic() - started

    def abandon(self) -> None:
        """The run no longer waits for its pages in flight (the drain timed out, or the run stopped): none of them
        writes from now on (a page already inside its write transaction ends it within its statement timeout), and
        a compute call in hand is left to its thread."""
        self.abandoned.set()

    def close(self) -> None:
        """The run ended: the compute threads end once idle (a call left behind ends on its own; it is a daemon), and
        the pages' systemic failures not yet told are."""
        self.warnings.flush()
        if self.calls is not None:
            self.calls.shutdown(wait=False, cancel_futures=True)

    def _computed_inline(self, rows: Sequence[Any], page: PageCounts) -> list[RowOutcome]:
        """Every row computed on this thread (the sweep's compute is not bounded): the outcomes to write."""
        definition = self.definition
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
            except BaseException as exc:  # noqa: BLE001 — a defect in compute (SystemExit too): fail the row, systemic
                page.fail(INVALID_VALUE, systemic=True)
                if debug:
                    log.debug("sweep %s: compute raised %s for %s", definition.name, type(exc).__name__,
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
        return changed

    def _computed_bounded(self, rows: Sequence[Any], page: PageCounts) -> list[RowOutcome]:
        """Every row computed on a compute thread, each call bounded (`call_timeout_s`): the outcomes to write."""
        name = self.definition.name
        debug = log.isEnabledFor(logging.DEBUG)
        changed: list[RowOutcome] = []
        for row, outcome in zip(rows, self._bounded_outcomes(rows), strict=True):
            if outcome is UNCHANGED or outcome is _SKIPPED:  # the steady state's outcome, first
                page.unchanged += 1
                continue
            if not isinstance(outcome, RowOutcome):
                timed_out = outcome is _TIMED_OUT
                page.fail(COMPUTE_TIMEOUT if timed_out else INVALID_VALUE, systemic=True)
                if debug:
                    what = f"outlasted {self.call_timeout_s:g}s" if timed_out else f"raised {outcome.name}"
                    log.debug("sweep %s: compute %s for %s", name, what, self._describe(row))
                continue
            page.decrypted += outcome.decrypted
            if outcome.failure is not None:
                page.fail(outcome.failure, systemic=False if outcome.known else None)
                if debug:
                    log.debug("sweep %s: row %s failed: %s", name, self._describe(row), outcome.failure)
            elif outcome.change is None:
                page.unchanged += 1
            if outcome.change is not None:
                changed.append(outcome)
        return changed

    def _bounded_outcomes(self, rows: Sequence[Any]) -> list[Any]:
        """The outcome of every row, computed on compute threads; a call that made no progress for `call_timeout_s`
        is left behind (`_TIMED_OUT`) and the rows after it go on on a fresh computation. PageNotDone once the run
        no longer waits for the page."""
        assert self.calls is not None and self.call_timeout_s is not None
        bound = self.call_timeout_s
        watch = min(MAX_WATCH_S, bound / 4)
        outcomes: list[Any] = []
        start, count = 0, len(rows)
        while start < count:
            computation = _Computation(rows, start)
            try:
                future = self.calls.submit(self._compute_from, computation)
            except RuntimeError:  # the run ended (its compute pool is shut down)
                raise PageNotDone("the run ended before this page was computed") from None
            seen, since = start, time.monotonic()
            while True:
                try:
                    future.result(timeout=watch)
                except FutureTimeout:
                    pass
                else:
                    outcomes.extend(computation.outcomes)
                    return outcomes
                if self.abandoned.is_set():
                    computation.left = True
                    self.calls.abandon(future)
                    raise PageNotDone("the run stopped waiting for this page's compute calls")
                position, now = start + len(computation.outcomes), time.monotonic()
                if position != seen:
                    seen, since = position, now
                elif now - since >= bound:
                    # The call on row `position` outlasted its bound: left to its thread, whose result no one reads.
                    computation.left = True
                    self.calls.abandon(future)
                    outcomes.extend(computation.outcomes[: position - start])
                    outcomes.append(_TIMED_OUT)
                    start = position + 1
                    break
        return outcomes

    def _compute_from(self, computation: _Computation) -> None:
        """A compute thread: the rows from `computation.start` on, until the last or until it is left behind."""
        definition = self.definition
        pre_check = definition.pre_check
        compute = definition.compute
        outcomes = computation.outcomes
        append = outcomes.append
        for row in computation.rows[computation.start:]:
            if computation.left:
                return
            if pre_check is not None and not pre_check(row):
                append(_SKIPPED)
                continue
            try:
                append(compute(row))
            except BaseException as exc:  # noqa: BLE001 — a defect in compute (SystemExit too): fail the row, systemic
                append(_Raised(type(exc).__name__))

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
                            self.describe_error(exc))
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
                                self.describe_error(exc))
            # 3. Fallback: one short transaction per row; a row that fails for its own reason keeps its
            #    stored (due) state and is counted; a transient failure that outlasts the retries stops the page.
            for outcome in changed:
                if self.abandoned.is_set():  # the run returned meanwhile: what is left of the page is not written
                    raise PageNotDone("the run stopped waiting for this page: the rest of its rows are not written")
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
                log.debug("sweep %s: row write failed: %s", definition.name, self.describe_error(exc))
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
            log.debug("sweep %s: a failed row write was not recorded (%s)", self.definition.name,
                      self.describe_error(record_exc))
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
