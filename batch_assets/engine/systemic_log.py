"""A run's WARNINGs about its pages with systemic failures (compute defects, timeouts, failed row writes), counted by
kind: the first such page at once, then at most one line every WARN_EVERY_S summing the pages since, and the rest
when the run ends. A table with a bad row in every page logs a few lines per run, not one per page (10,000 lines for
a 10M-row table); the run's summary counts every row, and each row is logged at DEBUG by the page that failed it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from batch_assets.engine.result import PageCounts

log = logging.getLogger("batch_assets.sweep")

WARN_EVERY_S = 10.0
"""How often, at most, a run logs a WARNING about its pages with systemic failures (the first at once)."""


class SystemicWarnings:
    """A run's WARNINGs about pages with systemic failures, summed between two lines (shared by its worker threads)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._next_at: float | None = None  # None: the next page with systemic failures is told at once
        self._pages = self._scanned = 0
        self._by_type: Counter[str] = Counter()

    def add(self, page: PageCounts) -> None:
        with self._lock:
            self._pages += 1
            self._scanned += page.scanned
            self._by_type.update(page.systemic_by_type or {})
            now = time.monotonic()
            if self._next_at is None or now >= self._next_at:
                self._next_at = now + WARN_EVERY_S
                self._tell()

    def flush(self) -> None:
        """The run ended: what was summed since the last line is told (and a later page is told at once)."""
        with self._lock:
            if self._pages:
                self._tell()
            self._next_at = None

    def _tell(self) -> None:
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(self._by_type.items()))
        rows = self._by_type.total()
        if self._pages == 1:
            log.warning("sweep %s: %d of %d rows of a page failed systemically (%s)", self.name, rows, self._scanned,
                        kinds)
        else:
            log.warning("sweep %s: %d of %d rows of %d pages failed systemically (%s)", self.name, rows, self._scanned,
                        self._pages, kinds)
        self._pages = self._scanned = 0
        self._by_type.clear()
