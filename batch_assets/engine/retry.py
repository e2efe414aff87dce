"""A sweep's transient failures: a read or write transaction is retried with backoff, then PageNotDone.

A failure caused by the statement or its data is raised as it is. A transient one (connection lost, server
restarting, timeout) that outlasts the retries, or one that happens while the run is stopping, leaves its page
unfinished: the low watermark never passes it and the run ends FAILURE, resumable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa

from batch_assets.db.engine import is_transient
from batch_assets.engine.result import Counters
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import error_text

log = logging.getLogger("batch_assets.sweep")

MAX_RETRY_BACKOFF_S = 8.0

T = TypeVar("T")


class PageNotDone(Exception):
    """A page could not be read or written for a reason that is not the rows' own (the database went
    away and did not come back within the retries, or the run was asked to stop while retrying).
    The page is not done: the low watermark stays before it and the run ends FAILURE, resumable."""


class Retrier:
    """One run's retries: its backoff and stop event, the retry counter, and the first failure it gave up on."""

    def __init__(
        self, name: str, settings: SweepSettings, counters: Counters, stop: threading.Event | None,
        describe: Callable[[BaseException], str] = error_text,
    ) -> None:
        self.name = name
        self.describe = describe
        """How a failure is named in logs and in PageNotDone (the sweep's `describe_error`)."""
        self.settings = settings
        self.counters = counters
        self.stop = stop
        self.gave_up: tuple[BaseException, int] | None = None
        """The first failure whose retries were spent, and after how many attempts (the result's gave_up_*)."""

    def __call__(
        self,
        what: str,
        work: Callable[[], T],
        *,
        retries: int | None = None,
        retryable: Callable[[BaseException], bool] = is_transient,
    ) -> T:
        """`work()`, retried with exponential backoff while it fails for a `retryable` (transient) reason."""
        retries = self.settings.transient_retries if retries is None else retries
        delay = self.settings.retry_backoff_s
        for attempt in range(retries + 1):
            try:
                return work()
            except Exception as exc:
                if not retryable(exc):
                    raise
                if attempt >= retries or self.stopping():
                    if self.gave_up is None:
                        self.gave_up = (exc, attempt + 1)
                    raise PageNotDone(f"{what}: {self.describe(exc)} (after {attempt + 1} attempt(s))") from exc
                self.counters.add_retry()
                log.warning("sweep %s: %s failed (%s); retry %d/%d in %.1fs", self.name, what,
                            self.describe(exc), attempt + 1, retries, delay)
                if self.wait(delay):
                    raise PageNotDone(f"{what}: {self.describe(exc)} (stopping)") from exc
                delay = min(delay * 2, MAX_RETRY_BACKOFF_S)
        raise AssertionError("unreachable")

    def stopping(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep `seconds`, or less when the run is asked to stop; True if it was."""
        if self.stop is None:
            time.sleep(seconds)
            return False
        return self.stop.wait(seconds)


def discard(conn: sa.Connection) -> None:
    """Invalidate and close a connection whose state is unknown after a failure."""
    try:
        conn.invalidate()
    except Exception as exc:  # already invalidated or closed; nothing else to give back
        log.debug("invalidate after a failure: %s", error_text(exc))
    try:
        conn.close()
    except Exception as exc:
        log.debug("close after a failure: %s", error_text(exc))
