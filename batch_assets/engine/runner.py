"""run_sweep(): pages, a worker pool, a window, a prefetch thread, FIFO drain.

A page is read outside any transaction, computed outside any transaction, then
written in (at most) two short transactions: a definition's side effects that must
survive a failed page (if it has any) first, then the page write (data + stamp +
outbox) with its own statement and lock timeouts. The page write applies a row only
if the row still holds what was read; a row another writer changed meanwhile is a
conflict (counted, left as that writer left it). When the page write fails it is
rolled back and redone row by row, each row in its own short transaction, so one
poisoned row fails only itself; only committed writes are counted.

Pages finish out of order, so results are drained strictly in FIFO order and
only the front page's cursor is checkpointed: everything at or before the
checkpoint is finished (the low watermark). Re-running a page is a no-op, so
resuming from the low watermark at worst repeats finished pages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import sqlalchemy as sa

from batch_assets.db.engine import is_transient
from batch_assets.db.timeouts import SET_LOCAL_TIMEOUTS, local_timeouts
from batch_assets.engine.definition import (
    FULL_RANGE,
    CheckpointStoreLike,
    Cursor,
    CursorRange,
    RowOutcome,
    RunContext,
    RunGuardLike,
    Sweep,
    WriteCounts,
    check_page_size,
)
from batch_assets.engine.result import (
    FAILURE,
    INVALID_VALUE,
    SUCCESS,
    Counters,
    PageCounts,
    SweepResult,
)
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import ConfigError, LeaseLost, error_text

log = logging.getLogger("batch_assets.sweep")

# The reader's session: keyset pages must walk an index in order. Right after a bulk load (no
# statistics yet) the planner otherwise picks a bitmap scan of the whole rest of the range plus a
# sort on every page, which makes a full sweep quadratic (measured: 145 s instead of 2.3 s to read
# 1M rows). Pinned for the reader connection only, and reset before it goes back to the pool.
PIN_READ_PLAN_SQL = (
    "SELECT set_config('enable_bitmapscan', 'off', false), set_config('enable_sort', 'off', false)"
)
UNPIN_READ_PLAN_SQL = "RESET enable_bitmapscan; RESET enable_sort"

FINISHED = "finished"
"""`resumed_from` of a range that had finished in the run's checkpoint generation (it reads nothing)."""

MIN_ADAPTIVE_PAGE = 50
MAX_RETRY_BACKOFF_S = 8.0

T = TypeVar("T")


class PageNotDone(Exception):
    """A page could not be read or written for a reason that is not the rows' own (the database went
    away and did not come back within the retries, or the run was asked to stop while retrying).
    The page is not done: the low watermark stays before it and the run ends FAILURE, resumable."""

ProgressCallback = Callable[[dict[str, Any]], None]


def run_sweep(
    engine: sa.Engine,
    definition: Sweep,
    settings: SweepSettings,
    ctx: RunContext,
    *,
    checkpoints: CheckpointStoreLike | None = None,
    guard: RunGuardLike | None = None,
    stop: threading.Event | None = None,
    cursor_range: CursorRange | None = None,
    progress: ProgressCallback | None = None,
) -> SweepResult:
    """Run one sweep to completion, a stop, a lost lease or a tripped breaker; never raises for row data.

    `settings` was validated when it was built (SweepSettings.__post_init__); only the page size is
    checked here, against what this sweep's statements may carry (`Reader.max_page_size`)."""
    check_page_size(settings.page_size, definition.reader.max_page_size)
    cursor_range = cursor_range or FULL_RANGE
    if not cursor_range.is_full and not definition.reader.ranged:
        raise ConfigError(f"mode {ctx.mode!r} runs over the whole key space only", field="cursor_range")
    return _Run(engine, definition, settings, ctx, checkpoints, guard, stop, cursor_range, progress).run()


class _Run:
    def __init__(
        self,
        engine: sa.Engine,
        definition: Sweep,
        settings: SweepSettings,
        ctx: RunContext,
        checkpoints: CheckpointStoreLike | None,
        guard: RunGuardLike | None,
        stop: threading.Event | None,
        cursor_range: CursorRange,
        progress: ProgressCallback | None,
    ) -> None:
        self.engine = engine
        self.definition = definition
        self.reader = definition.reader
        self.settings = settings
        self.ctx = ctx
        self.checkpoints = checkpoints
        self.guard = guard
        self.stop = stop
        self.cursor_range = cursor_range
        self.range_key = cursor_range.key
        self.progress = progress
        self.counters = Counters()
        self._last_save = float("-inf")
        self._saved = True
        self._reader: sa.Connection | None = None
        self.unwritten = 0
        self._held: list[RowOutcome] = []
        """Failed rows' writes of pages over the breaker ratio, held until the run is judged (see
        _hold_or_write_failures)."""
        self.gave_up: tuple[BaseException, int] | None = None
        self.limit = settings.page_size
        # SET_LOCAL_TIMEOUTS' parameters, computed once: sent first in every write transaction.
        page_s, row_s, lock_s = settings.page_timeout_s, settings.row_timeout_s, settings.lock_timeout_s
        self.page_timeouts = local_timeouts(page_s, min(lock_s, page_s))
        self.row_timeouts = local_timeouts(row_s, min(lock_s, row_s))

    # The main loop (caller's thread) ----------------------------------------

    def run(self) -> SweepResult:
        started = time.monotonic()
        cursor, finished = self._load_checkpoint()
        if finished:
            log.info("sweep %s: range %s finished earlier in this run's checkpoint generation; not read again",
                     self.definition.name, self.range_key)
            return self._result(SUCCESS, None, FINISHED, None, time.monotonic() - started)
        resumed_from = last_cursor = cursor
        window: deque[tuple[Future[tuple[PageCounts, float]], Cursor]] = deque()
        reason: str | None = None
        advance = True  # False once the breaker tripped: later pages must not move the low watermark
        prefetch = ThreadPoolExecutor(1, thread_name_prefix=f"{self.definition.name}-prefetch")
        pool = ThreadPoolExecutor(self.settings.workers, thread_name_prefix=f"{self.definition.name}-worker")
        log.info(
            "sweep %s started: run_id=%s mode=%s run_date=%s range=%s resumed_from=%s",
            self.definition.name, self.ctx.run_id, self.ctx.mode, self.ctx.run_date, self.range_key,
            self.reader.display_cursor(resumed_from),
        )
        next_read: Future[tuple[list, int]] | None = prefetch.submit(self._read, cursor, self.limit)
        try:
            try:
                while next_read is not None and reason is None:
                    reason = self._stop_reason()
                    if reason is not None:
                        break
                    try:
                        rows, limit = next_read.result()
                    except Exception as exc:  # retries are spent (or a defect): stop, resumable
                        reason = f"page read failed: {error_text(exc)}"  # one line: never the parameters
                        next_read = None
                        break
                    if not rows:
                        next_read = None
                        break
                    end = self.reader.cursor_of(rows[-1])
                    # Keyset: the next page starts after this page's last row, read while workers compute.
                    next_read = prefetch.submit(self._read, end, self.limit) if len(rows) >= limit else None
                    window.append((pool.submit(self._process_page, rows), end))
                    del rows
                    while len(window) >= self.settings.window and reason is None:
                        reason, advance, last_cursor = self._drain_front(window, advance, last_cursor, None)
                deadline = time.monotonic() + self.settings.drain_timeout_s if reason is not None else None
                while window:
                    front_reason, advance, last_cursor = self._drain_front(window, advance, last_cursor, deadline)
                    reason = reason or front_reason
                    if front_reason == "drain timed out":
                        reason = f"{reason}; drain timed out with {len(window) + 1} page(s) in flight"
                        break
            except BaseException:
                # A run termination (Dagster's DagsterExecutionInterruptedError, KeyboardInterrupt) lands
                # here while waiting on a page: drain what is in flight, record the low watermark, re-raise.
                reason = reason or "interrupted"
                self._drain_after_interrupt(window, advance, last_cursor)
                raise
        finally:
            if next_read is not None:
                next_read.cancel()
            prefetch.shutdown(wait=True, cancel_futures=True)
            pool.shutdown(wait=reason is None, cancel_futures=True)
            self._close_reader()
        if reason is None:
            reason = self._after_last_page()
        store = self.checkpoints
        if reason is None and store is not None:
            try:
                self._retrying("completion record", lambda: store.complete(
                    self.definition.name, self.ctx.mode, self.range_key))
            except PageNotDone as exc:
                reason = f"the range finished but its completion was not recorded: {exc}"
        status = SUCCESS if reason is None else FAILURE
        if status == FAILURE and not self._saved and last_cursor is not None:
            # Checkpoints are throttled (checkpoint_every_s); a run that stops leaves the exact low watermark.
            self._save_checkpoint(last_cursor)
        result = self._result(status, reason, resumed_from, last_cursor, time.monotonic() - started)
        log.log(
            logging.INFO if status == SUCCESS else logging.WARNING,
            "sweep %s finished %s: scanned=%d changed=%d unchanged=%d failed=%d pages=%d duration_s=%.1f%s",
            self.definition.name, status, result.scanned, result.changed, result.unchanged, result.failed,
            result.pages, result.duration_s, f" stopped_reason={reason}" if reason else "",
        )
        return result

    def _drain_after_interrupt(
        self,
        window: deque[tuple[Future[tuple[PageCounts, float]], Cursor]],
        advance: bool,
        last_cursor: Cursor | None,
    ) -> None:
        deadline = time.monotonic() + self.settings.drain_timeout_s
        try:
            while window:
                front_reason, advance, last_cursor = self._drain_front(window, advance, last_cursor, deadline)
                if front_reason == "drain timed out":
                    break
        except BaseException:  # a second interrupt: stop draining, keep what is recorded
            log.warning("sweep %s: interrupted again while draining; %d page(s) left in flight",
                        self.definition.name, len(window))
        if not self._saved and last_cursor is not None:
            try:
                self._save_checkpoint(last_cursor)
            except Exception as exc:  # the interrupt is what the caller must see; the older checkpoint stays
                log.warning("sweep %s: low watermark not recorded on interrupt: %s", self.definition.name,
                            type(exc).__name__)
        log.warning("sweep %s interrupted: drained, low watermark %s", self.definition.name,
                    self.reader.display_cursor(last_cursor))

    def _load_checkpoint(self) -> tuple[Cursor | None, bool]:
        """(the cursor to resume after, or None to start at the range's start; whether the range finished)."""
        if self.checkpoints is None:
            return None, False
        checkpoint = self.checkpoints.load(self.definition.name, self.ctx.mode, self.range_key, self.ctx.fingerprint)
        if checkpoint is None:
            return None, False
        if checkpoint.finished:
            return None, True
        cursor = checkpoint.cursor
        if cursor is None:
            return None, False
        if not self.reader.valid_cursor(cursor, self.cursor_range):
            # Resuming after it would fail every read (not a key) or end the range with rows unread (past its
            # end). Not printed: it may hold a derived date.
            log.warning("sweep %s: the checkpoint of mode %s range %s is not a position in the range; "
                        "starting the range over", self.definition.name, self.ctx.mode, self.range_key)
            return None, False
        return cursor, False

    def _stop_reason(self) -> str | None:
        if self.stop is not None and self.stop.is_set():
            return "stop requested"
        if self.guard is not None and not self.guard.alive():
            return "lease lost"
        return None

    def _drain_front(
        self,
        window: deque[tuple[Future[tuple[PageCounts, float]], Cursor]],
        advance: bool,
        last_cursor: Cursor | None,
        deadline: float | None,
    ) -> tuple[str | None, bool, Cursor | None]:
        """Wait for the front page only, merge it, move the low watermark to its cursor."""
        future, end = window[0]
        try:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            page, seconds = future.result(timeout=timeout)
        except FutureTimeout:
            return "drain timed out", advance, last_cursor
        except LeaseLost:
            window.popleft()
            return "lease lost", False, last_cursor
        except PageNotDone as exc:
            window.popleft()
            return f"page not done: {exc}", False, last_cursor
        except Exception as exc:  # a defect or an unreachable database: stop, keep the checkpoint resumable
            window.popleft()
            log.error("sweep %s: page failed: %s", self.definition.name, type(exc).__name__, exc_info=True)
            return f"page failed: {type(exc).__name__}", False, last_cursor
        window.popleft()
        failed = self._hold_or_write_failures(page)
        if failed is not None:
            return failed, False, last_cursor
        self.counters.merge(page)
        reason = None
        unwritten = page.unwritten
        if unwritten and not self.reader.failed_writes_stay_due:
            # Rows whose write failed and that no later run of this mode would select again: the low
            # watermark stays before this page and the run will end FAILURE (resumable from here).
            advance = False
            self.unwritten += unwritten
        if self._over_ratio(page):
            # A systemically failed page never moves the low watermark (nor, FIFO, any page after it), so a
            # resume redoes it; the breaker itself only counts once the run has seen breaker_min_rows rows.
            advance = False
            if self.counters.scanned >= self.settings.breaker_min_rows:
                reason = (
                    f"circuit breaker: {page.systemic} of {page.scanned} rows of a page failed systemically "
                    f"(ratio > {self.settings.breaker_ratio})"
                )
        if advance:
            last_cursor = end
            self._saved = False
            now = time.monotonic()
            if now - self._last_save >= self.settings.checkpoint_every_s:
                self._last_save = now
                self._saved = self._save_checkpoint(end)
        self._after_page(seconds)
        return reason, advance, last_cursor

    def _over_ratio(self, page: PageCounts) -> bool:
        """Whether a page's new systemic failures exceed the breaker ratio.

        A short page (the last one of a range, or of a small delta) is judged as if it held at least
        `min(page_size, MIN_ADAPTIVE_PAGE)` rows: one hostile row among the 4 rows of a last page is not
        "25% of the rows failing", while a wrong key fails every row of every page and still trips it."""
        floor = min(self.settings.page_size, MIN_ADAPTIVE_PAGE)
        return page.systemic > self.settings.breaker_ratio * max(page.scanned, floor)

    def _hold_or_write_failures(self, page: PageCounts) -> str | None:
        """What becomes of failed rows' writes held back by pages over the breaker ratio (`page.deferred`).

        Such a page trips the breaker once the run has seen breaker_min_rows rows (the check of
        `_drain_front`, with this page merged): then its writes and every held one are dropped, so a wrong
        key writes nothing, and none of those pages moved the low watermark, so the resuming run evaluates
        them again. Before that they are held (at most breaker_min_rows rows and one page); once a page
        brings the run to breaker_min_rows without tripping, they are data failures and are written, as at
        the end of a run that never got there. Returns a stop reason when that write could not be done."""
        deferred, page.deferred = page.deferred, None
        over_ratio = self._over_ratio(page)
        judged = self.counters.scanned + page.scanned >= self.settings.breaker_min_rows
        if over_ratio and judged:
            self._held.clear()
            return None
        if deferred:
            self._held.extend(deferred)
        return self._flush_held(page) if self._held and judged else None

    def _after_last_page(self) -> str | None:
        """Why a run whose pages all drained does not succeed after all (None: it does)."""
        if self._held:
            # The run ended under breaker_min_rows rows without tripping: the held failures are data.
            flushed = PageCounts()
            reason = self._flush_held(flushed)
            self.counters.merge(flushed, page_done=False)
            if reason is not None:
                return reason
        if self.unwritten:
            return (f"{self.unwritten} row write(s) failed; the checkpoint stays before the first of them, "
                    "so the next run of this mode retries them")
        return None

    def _flush_held(self, page: PageCounts) -> str | None:
        held, self._held = self._held, []
        try:
            self._write(held, page)
        except LeaseLost:
            return "lease lost"
        except PageNotDone as exc:
            return f"page not done: {exc}"
        return None

    def _save_checkpoint(self, cursor: Cursor) -> bool:
        """Record the low watermark; False (and a warning) when the database does not take it.

        A checkpoint that could not be written leaves the older, lower one in place, which is
        always safe: a resume repeats finished pages, which are no-ops.
        """
        if self.checkpoints is None:
            return True
        store = self.checkpoints

        def save() -> None:
            store.save(
                self.definition.name,
                self.ctx.mode,
                self.range_key,
                cursor=cursor,
                fingerprint=self.ctx.fingerprint,
                run_id=self.ctx.run_id,
                run_date=self.ctx.run_date,
                counters=self.counters.snapshot(),
            )

        try:
            self._retrying("checkpoint", save, retries=1)
        except PageNotDone as exc:
            log.warning("sweep %s: low watermark not recorded (the previous checkpoint stays): %s",
                        self.definition.name, exc)
            return False
        return True

    # Transient failures ----------------------------------------------------------

    def _retrying(
        self,
        what: str,
        work: Callable[[], T],
        *,
        retries: int | None = None,
        retryable: Callable[[BaseException], bool] = is_transient,
    ) -> T:
        """`work()`, retried with exponential backoff while it fails for a `retryable` (transient) reason.

        A failure caused by the statement or its data is raised as it is. A transient one that
        outlasts the retries, or one that happens while the run is stopping, raises PageNotDone.
        """
        retries = self.settings.transient_retries if retries is None else retries
        delay = self.settings.retry_backoff_s
        for attempt in range(retries + 1):
            try:
                return work()
            except Exception as exc:
                if not retryable(exc):
                    raise
                if attempt >= retries or self._stopping():
                    if self.gave_up is None:
                        self.gave_up = (exc, attempt + 1)
                    raise PageNotDone(f"{what}: {error_text(exc)} (after {attempt + 1} attempt(s))") from exc
                self.counters.add_retry()
                log.warning("sweep %s: %s failed (%s); retry %d/%d in %.1fs", self.definition.name, what,
                            error_text(exc), attempt + 1, retries, delay)
                if self._wait(delay):
                    raise PageNotDone(f"{what}: {error_text(exc)} (stopping)") from exc
                delay = min(delay * 2, MAX_RETRY_BACKOFF_S)
        raise AssertionError("unreachable")

    def _stopping(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def _wait(self, seconds: float) -> bool:
        """Sleep `seconds`, or less when the run is asked to stop; True if it was."""
        if self.stop is None:
            time.sleep(seconds)
            return False
        return self.stop.wait(seconds)

    def _after_page(self, seconds: float) -> None:
        snapshot = self.counters.snapshot()
        if snapshot["pages"] % self.settings.summary_every_pages == 0:
            log.info(
                "sweep %s: pages=%d scanned=%d changed=%d unchanged=%d failed=%d",
                self.definition.name, snapshot["pages"], snapshot["scanned"], snapshot["changed"],
                snapshot["unchanged"], snapshot["failed"],
            )
        if self.settings.adaptive_page_size:
            self._adapt(seconds)
        if self.progress is not None:
            self.progress(snapshot)

    def _adapt(self, seconds: float) -> None:
        # Keep a page's work well inside its transaction timeout: halve when slow, grow back when fast.
        budget = self.settings.page_timeout_s
        if seconds > budget / 4:
            self.limit = max(MIN_ADAPTIVE_PAGE, self.limit // 2)
        elif seconds < budget / 40 and self.limit < self.settings.page_size:
            self.limit = min(self.settings.page_size, self.limit * 2)

    def _result(
        self, status: str, reason: str | None, resumed_from: Cursor | None, last_cursor: Cursor | None, seconds: float
    ) -> SweepResult:
        c = self.counters.snapshot()
        shown = self.reader.display_cursor
        gave_up_on, gave_up_after = self.gave_up if self.gave_up is not None else (None, 0)
        return SweepResult(
            status=status,
            run_id=self.ctx.run_id,
            mode=self.ctx.mode,
            run_date=self.ctx.run_date,
            scanned=c["scanned"],
            changed=c["changed"],
            unchanged=c["unchanged"],
            failed=c["failed"],
            failed_by_type=c["failed_by_type"],
            pages=c["pages"],
            decrypted=c["decrypted"],
            triggers=c["triggers"],
            audit_events=c["audit_events"],
            conflicts=c["conflicts"],
            resumed_from=resumed_from if resumed_from == FINISHED else shown(resumed_from),
            duration_s=seconds,
            stopped_reason=reason,
            last_cursor=shown(last_cursor),
            extra=c["extra"],
            retries=c["retries"],
            gave_up_on=gave_up_on,
            gave_up_after=gave_up_after,
        )

    # The prefetch thread ------------------------------------------------------

    def _read(self, cursor: Cursor | None, limit: int) -> tuple[list, int]:
        # Autocommit: the read holds no transaction; one round trip returns the whole (LIMIT-sized) page.
        # A lost connection is replaced (and re-pinned) and the read retried; the page is read again
        # from the same cursor, so nothing is skipped.
        def read() -> list:
            try:
                return self.reader.read_page(self._reader_conn(), cursor, limit, self.cursor_range)
            except Exception as exc:
                if is_transient(exc):
                    self._drop_reader()
                raise

        return self._retrying("page read", read), limit

    def _reader_conn(self) -> sa.Connection:
        if self._reader is None:
            conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                conn.exec_driver_sql(PIN_READ_PLAN_SQL)
            except BaseException:
                conn.invalidate()
                conn.close()
                raise
            self._reader = conn
        return self._reader

    def _drop_reader(self) -> None:
        """Forget a reader whose connection failed (invalidated: never back into the pool)."""
        conn, self._reader = self._reader, None
        if conn is not None:
            _discard(conn)

    def _close_reader(self) -> None:
        """Unpin the reader's session and give it back; a broken one is invalidated instead."""
        conn, self._reader = self._reader, None
        if conn is None:
            return
        try:
            conn.exec_driver_sql(UNPIN_READ_PLAN_SQL)
        except Exception:  # any failure (driver, or SQLAlchemy's state after one): never pool a pinned session
            _discard(conn)
            return
        conn.close()

    # Worker threads --------------------------------------------------------

    def _process_page(self, rows: Sequence[Any]) -> tuple[PageCounts, float]:
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
        if changed and self._over_ratio(page):
            # This page may trip the breaker (a wrong key, a broken dependency): its failed rows' writes (the
            # marker, the cleared date) wait for the drain, which knows whether it trips. If it does, they are
            # never written, so a systemic failure never turns rows into "known bad" ones and a wrong key
            # writes nothing; the page never moves the low watermark and the run that resumes it evaluates
            # those rows again. If it does not (the run has not seen breaker_min_rows rows), they are written.
            page.deferred = [outcome for outcome in changed if outcome.failure is not None]
            changed = [outcome for outcome in changed if outcome.failure is None]
        if changed:
            self._write(changed, page)
        return page, time.monotonic() - started

    def _describe(self, row: Any) -> str:
        """How a row is named in logs: its cursor as shown to people (an id, never a sensitive value)."""
        return str(self.reader.display_cursor(self.reader.cursor_of(row)))

    def _begin(self, conn: sa.Connection, timeouts: dict[str, str]) -> None:
        """First statement of every write transaction: SET LOCAL the timeouts and, when guarded, fence
        the lease in the same round trip, so a zombie that lost its lease commits nothing."""
        if self.guard is not None:
            self.guard.fence(conn, timeouts)
        else:
            conn.execute(SET_LOCAL_TIMEOUTS, timeouts)

    def _write(self, changed: list[RowOutcome], page: PageCounts) -> None:
        """Side effects, then the page write; on a failure caused by the rows, one transaction per row.

        Every transaction is all or nothing and counted only once it committed, so a transaction that
        failed for a transient reason (connection lost, server restarting, timeout) is simply run again
        on a fresh connection (`_retrying`). When the retries are spent, PageNotDone leaves the page
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


def _discard(conn: sa.Connection) -> None:
    """Invalidate and close a connection whose state is unknown after a failure."""
    try:
        conn.invalidate()
    except Exception as exc:  # already invalidated or closed; nothing else to give back
        log.debug("invalidate after a failure: %s", error_text(exc))
    try:
        conn.close()
    except Exception as exc:
        log.debug("close after a failure: %s", error_text(exc))


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

    def transaction(self, run: _Run, what: str, timeouts: dict[str, str], work: Callable[[sa.Connection], T]) -> T:
        """`work(conn)` in one transaction (fenced, with `timeouts`), retried on transient failures."""

        def once() -> T:
            if self.conn is None:
                self.conn = self.engine.connect()
            conn = self.conn
            try:
                with conn.begin():
                    run._begin(conn, timeouts)
                    return work(conn)
            except Exception as exc:
                if is_transient(exc):
                    self.conn = None
                    _discard(conn)
                raise

        return run._retrying(what, once, retryable=run.definition.write_failures.retryable)
