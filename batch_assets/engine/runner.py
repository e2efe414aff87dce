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

A stop (SIGTERM, run termination, a lost lease) is seen within a fraction of a second even while the front page
is stuck (a compute call that does not return): the run stops reading, gives the pages in flight `drain_timeout_s`,
then gives up on the rest (no page it gave up on writes any more), records its low watermark and returns. Its
threads are daemons, so a call that never returns does not keep the process alive either.

The parts: the reader connection (`page_reader`), a page on a worker thread (`page_worker`), the circuit
breaker (`breaker`), the range's checkpoint (`range_checkpoint`) and transient retries (`retry`); this module
runs the loop that ties them together.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import sqlalchemy as sa

from batch_assets.engine.breaker import Breaker, over_ratio
from batch_assets.engine.definition import (
    FULL_RANGE,
    CheckpointStoreLike,
    Cursor,
    CursorRange,
    RunContext,
    RunGuardLike,
    Sweep,
    check_page_size,
)
from batch_assets.engine.page_reader import PinnedReader
from batch_assets.engine.page_worker import PageWorker
from batch_assets.engine.range_checkpoint import RangeCheckpoint
from batch_assets.engine.result import FAILURE, SUCCESS, Counters, PageCounts, SweepResult
from batch_assets.engine.retry import PageNotDone, Retrier
from batch_assets.engine.settings import MIN_ADAPTIVE_PAGE, SweepSettings
from batch_assets.errors import ConfigError, LeaseLost
from batch_assets.shutdown import DaemonThreadPool

log = logging.getLogger("batch_assets.sweep")

FINISHED = "finished"
"""`resumed_from` of a range that had finished in the run's checkpoint generation (it reads nothing)."""
STOP_WATCH_S = 0.25
"""How often the main loop, waiting for a page, looks whether the run must stop."""
DRAIN_TIMED_OUT = "drain timed out"

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
        self.definition = definition
        self.reader = definition.reader
        self.settings = settings
        self.ctx = ctx
        self.guard = guard
        self.stop = stop
        self.range_key = cursor_range.key
        self.progress = progress
        self.counters = Counters()
        self.retrying = Retrier(definition.name, settings, self.counters, stop, definition.describe_error)
        self.checkpoint = RangeCheckpoint(checkpoints, definition, ctx, cursor_range, self.counters,
                                          self.retrying, settings.checkpoint_every_s)
        self.pages = PinnedReader(engine, definition.reader, cursor_range, self.retrying)
        self.worker = PageWorker(engine, definition, settings, guard, self.retrying)
        self.breaker = Breaker(settings, self.counters, self.worker.write)
        self.unwritten = 0
        self.limit = settings.page_size

    # The main loop (caller's thread) ----------------------------------------

    def run(self) -> SweepResult:
        started = time.monotonic()
        cursor, finished = self.checkpoint.load()
        if finished:
            log.info("sweep %s: range %s finished earlier in this run's checkpoint generation; not read again",
                     self.definition.name, self.range_key)
            return self._result(SUCCESS, None, FINISHED, None, time.monotonic() - started)
        resumed_from = last_cursor = cursor
        window: deque[tuple[Future[tuple[PageCounts, float]], Cursor]] = deque()
        reason: str | None = None
        advance = True  # False once the breaker tripped: later pages must not move the low watermark
        prefetch = ThreadPoolExecutor(1, thread_name_prefix=f"{self.definition.name}-prefetch")
        # Daemon threads: a page whose compute never returns must not keep a stopped process alive.
        pool = DaemonThreadPool(self.settings.workers, f"{self.definition.name}-worker")
        log.info(
            "sweep %s started: run_id=%s mode=%s run_date=%s range=%s resumed_from=%s",
            self.definition.name, self.ctx.run_id, self.ctx.mode, self.ctx.run_date, self.range_key,
            self.reader.display_cursor(resumed_from),
        )
        next_read: Future[tuple[list[Any], int]] | None = prefetch.submit(self.pages.read, cursor, self.limit)
        try:
            try:
                while next_read is not None and reason is None:
                    reason = self._stop_reason()
                    if reason is not None:
                        break
                    try:
                        rows, limit = next_read.result()
                    except Exception as exc:  # retries are spent (or a defect): stop, resumable
                        # One line, never the parameters, and as the sweep shows errors (never a value it read).
                        reason = f"page read failed: {self.definition.describe_error(exc)}"
                        next_read = None
                        break
                    if not rows:
                        next_read = None
                        break
                    end = self.reader.cursor_of(rows[-1])
                    # Keyset: the next page starts after this page's last row, read while workers compute.
                    next_read = prefetch.submit(self.pages.read, end, self.limit) if len(rows) >= limit else None
                    window.append((pool.submit(self.worker.process, rows), end))
                    del rows
                    while len(window) >= self.settings.window and reason is None:
                        reason, advance, last_cursor = self._drain_front(window, advance, last_cursor, None)
                deadline = time.monotonic() + self.settings.drain_timeout_s if reason is not None else None
                while window:
                    front_reason, advance, last_cursor = self._drain_front(window, advance, last_cursor, deadline)
                    reason = reason or front_reason
                    if front_reason == DRAIN_TIMED_OUT:
                        reason = f"{reason}; drain timed out with {len(window)} page(s) in flight"
                        break
            except BaseException:
                # A run termination (Dagster's DagsterExecutionInterruptedError, KeyboardInterrupt) lands
                # here while waiting on a page: drain what is in flight, record the low watermark, re-raise.
                reason = reason or "interrupted"
                self._drain_after_interrupt(window, advance, last_cursor)
                raise
        finally:
            if reason is not None:
                # Pages still in flight are given up on: none of them writes after the run returns.
                self.worker.abandon()
            if next_read is not None:
                next_read.cancel()
            prefetch.shutdown(wait=True, cancel_futures=True)
            pool.shutdown(wait=reason is None, cancel_futures=True)
            self.worker.close()
            self.pages.close()
        if reason is None:
            reason = self._after_last_page()
        if reason is None:
            reason = self.checkpoint.complete()
        status = SUCCESS if reason is None else FAILURE
        if status == FAILURE and not self.checkpoint.saved and last_cursor is not None:
            # Checkpoints are throttled (checkpoint_every_s); a run that stops leaves the exact low watermark.
            self.checkpoint.save(last_cursor)
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
                if front_reason == DRAIN_TIMED_OUT:
                    break
        except BaseException:  # a second interrupt: stop draining, keep what is recorded
            log.warning("sweep %s: interrupted again while draining; %d page(s) left in flight",
                        self.definition.name, len(window))
        if not self.checkpoint.saved and last_cursor is not None:
            try:
                self.checkpoint.save(last_cursor)
            except Exception as exc:  # the interrupt is what the caller must see; the older checkpoint stays
                log.warning("sweep %s: low watermark not recorded on interrupt: %s", self.definition.name,
                            type(exc).__name__)
        log.warning("sweep %s interrupted: drained, low watermark %s", self.definition.name,
                    self.reader.display_cursor(last_cursor))

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
        """Wait for the front page only, merge it, move the low watermark to its cursor.

        Without a deadline (the window is full) the wait ends early, leaving the page in the window, when the run must
        stop (its stop reason is returned); with one (draining), at the deadline (DRAIN_TIMED_OUT)."""
        future, end = window[0]
        try:
            if deadline is not None:
                page, seconds = future.result(timeout=max(0.0, deadline - time.monotonic()))
            else:
                while True:
                    try:
                        page, seconds = future.result(timeout=STOP_WATCH_S)
                        break
                    except FutureTimeout:
                        stop = self._stop_reason()
                        if stop is not None:
                            return stop, advance, last_cursor
        except FutureTimeout:
            return DRAIN_TIMED_OUT, advance, last_cursor
        except LeaseLost:
            window.popleft()
            return "lease lost", False, last_cursor
        except PageNotDone as exc:
            window.popleft()
            return f"page not done: {exc}", False, last_cursor
        except Exception as exc:  # a defect or an unreachable database: stop, keep the checkpoint resumable
            window.popleft()
            # The error as the sweep shows it; its traceback (whose last line may echo a value) at DEBUG only.
            log.error("sweep %s: page failed: %s", self.definition.name, self.definition.describe_error(exc))
            log.debug("sweep %s: page failed", self.definition.name, exc_info=True)
            return f"page failed: {type(exc).__name__}", False, last_cursor
        window.popleft()
        failed = self.breaker.hold_or_write_failures(page)
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
        if over_ratio(page, self.settings):
            # A systemically failed page never moves the low watermark (nor, FIFO, any page after it), so a
            # resume redoes it; the breaker itself only counts once the run has seen breaker_min_rows rows.
            advance = False
            reason = self.breaker.tripped_by(page)
        if advance:
            last_cursor = end
            self.checkpoint.advance(end)
        self._after_page(seconds)
        return reason, advance, last_cursor

    def _after_last_page(self) -> str | None:
        """Why a run whose pages all drained does not succeed after all (None: it does)."""
        reason = self.breaker.write_held_at_end()
        if reason is not None:
            return reason
        if self.unwritten:
            return (f"{self.unwritten} row write(s) failed; the checkpoint stays before the first of them, "
                    "so the next run of this mode retries them")
        return None

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
        gave_up = self.retrying.gave_up
        gave_up_on, gave_up_after = gave_up if gave_up is not None else (None, 0)
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
