"""The sweep's circuit breaker: a page whose rows fail systemically (a wrong key, a broken dependency) stops
the run, and the failed rows' writes of such pages are held until the run is judged, so that a systemic
failure writes nothing."""

from __future__ import annotations

from collections.abc import Callable

from batch_assets.engine.definition import RowOutcome
from batch_assets.engine.result import Counters, PageCounts
from batch_assets.engine.retry import PageNotDone
from batch_assets.engine.settings import MIN_ADAPTIVE_PAGE, SweepSettings
from batch_assets.errors import LeaseLost

WritePage = Callable[[list[RowOutcome], PageCounts], None]


def over_ratio(page: PageCounts, settings: SweepSettings) -> bool:
    """Whether a page's new systemic failures exceed the breaker ratio.

    A short page (the last one of a range, or of a small delta) is judged as if it held at least
    `min(page_size, MIN_ADAPTIVE_PAGE)` rows: one hostile row among the 4 rows of a last page is not
    "25% of the rows failing", while a wrong key fails every row of every page and still trips it."""
    floor = min(settings.page_size, MIN_ADAPTIVE_PAGE)
    return page.systemic > settings.breaker_ratio * max(page.scanned, floor)


class Breaker:
    """Judges each drained page, and holds the failed rows' writes of pages over the ratio until it may."""

    def __init__(self, settings: SweepSettings, counters: Counters, write: WritePage) -> None:
        self.settings = settings
        self.counters = counters
        self.write = write
        self._held: list[RowOutcome] = []

    def tripped_by(self, page: PageCounts) -> str | None:
        """Why a drained (and merged) page stops the run, or None. A page over the ratio never moves the low
        watermark either way (`over_ratio`); the breaker itself only counts once the run has seen
        breaker_min_rows rows."""
        if over_ratio(page, self.settings) and self.counters.scanned >= self.settings.breaker_min_rows:
            return (
                f"circuit breaker: {page.systemic} of {page.scanned} rows of a page failed systemically "
                f"(ratio > {self.settings.breaker_ratio})"
            )
        return None

    def hold_or_write_failures(self, page: PageCounts) -> str | None:
        """What becomes of failed rows' writes held back by pages over the breaker ratio (`page.deferred`).

        Such a page trips the breaker once the run has seen breaker_min_rows rows (the check of
        `tripped_by`, with this page merged): then its writes and every held one are dropped, so a wrong
        key writes nothing, and none of those pages moved the low watermark, so the resuming run evaluates
        them again. Before that they are held (at most breaker_min_rows rows and one page); once a page
        brings the run to breaker_min_rows without tripping, they are data failures and are written, as at
        the end of a run that never got there. Returns a stop reason when that write could not be done."""
        deferred, page.deferred = page.deferred, None
        judged = self.counters.scanned + page.scanned >= self.settings.breaker_min_rows
        if over_ratio(page, self.settings) and judged:
            self._held.clear()
            return None
        if deferred:
            self._held.extend(deferred)
        return self._flush(page) if self._held and judged else None

    def write_held_at_end(self) -> str | None:
        """The run ended under breaker_min_rows rows without tripping: the held failures are data, written
        now. Returns a stop reason when that write could not be done."""
        if not self._held:
            return None
        flushed = PageCounts()
        reason = self._flush(flushed)
        self.counters.merge(flushed, page_done=False)
        return reason

    def _flush(self, page: PageCounts) -> str | None:
        held, self._held = self._held, []
        try:
            self.write(held, page)
        except LeaseLost:
            return "lease lost"
        except PageNotDone as exc:
            return f"page not done: {exc}"
        return None
