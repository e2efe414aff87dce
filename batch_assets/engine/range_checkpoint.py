"""A run's checkpoint of its range: where it resumes, the low watermark (saved at most every
`checkpoint_every_s`, and exactly when the run stops, in the reader's stored form `seal_cursor`), and the record
that the range finished."""

from __future__ import annotations

import logging
import time

from batch_assets.engine.definition import CheckpointStoreLike, Cursor, CursorRange, RunContext, Sweep
from batch_assets.engine.result import Counters
from batch_assets.engine.retry import PageNotDone, Retrier

log = logging.getLogger("batch_assets.sweep")


class RangeCheckpoint:
    """The checkpoint of one (sweep, mode, range) for one run; a run without a store keeps none."""

    def __init__(
        self,
        store: CheckpointStoreLike | None,
        definition: Sweep,
        ctx: RunContext,
        cursor_range: CursorRange,
        counters: Counters,
        retrying: Retrier,
        every_s: float,
    ) -> None:
        self.store = store
        self.name = definition.name
        self.reader = definition.reader
        self.ctx = ctx
        self.cursor_range = cursor_range
        self.range_key = cursor_range.key
        self.counters = counters
        self.retrying = retrying
        self.every_s = every_s
        self._last_save = float("-inf")
        self.saved = True
        """False while the low watermark has moved past what was last saved (saves are throttled)."""

    def load(self) -> tuple[Cursor | None, bool]:
        """(the cursor to resume after, or None to start at the range's start; whether the range finished)."""
        if self.store is None:
            return None, False
        checkpoint = self.store.load(self.name, self.ctx.mode, self.range_key, self.ctx.fingerprint)
        if checkpoint is None:
            return None, False
        if checkpoint.finished:
            return None, True
        if checkpoint.cursor is None:
            return None, False
        cursor = self.reader.open_cursor(checkpoint.cursor)  # the form `seal_cursor` saved (never shown)
        if cursor is None:
            log.warning("sweep %s: the checkpoint of mode %s range %s cannot be read; starting the range over",
                        self.name, self.ctx.mode, self.range_key)
            return None, False
        if not self.reader.valid_cursor(cursor, self.cursor_range):
            # Resuming after it would fail every read (not a key) or end the range with rows unread (past its
            # end). Not printed: it may hold a derived date.
            log.warning("sweep %s: the checkpoint of mode %s range %s is not a position in the range; "
                        "starting the range over", self.name, self.ctx.mode, self.range_key)
            return None, False
        return cursor, False

    def advance(self, cursor: Cursor) -> None:
        """The low watermark moved to `cursor`: saved now unless the last save is under `every_s` old."""
        self.saved = False
        now = time.monotonic()
        if now - self._last_save >= self.every_s:
            self._last_save = now
            self.saved = self.save(cursor)

    def save(self, cursor: Cursor) -> bool:
        """Record the low watermark; False (and a warning) when the database does not take it.

        A checkpoint that could not be written leaves the older, lower one in place, which is
        always safe: a resume repeats finished pages, which are no-ops.
        """
        if self.store is None:
            return True
        store = self.store
        stored = self.reader.seal_cursor(cursor)  # e.g. encrypted when the cursor holds a derived date

        def save() -> None:
            store.save(
                self.name,
                self.ctx.mode,
                self.range_key,
                cursor=stored,
                fingerprint=self.ctx.fingerprint,
                run_id=self.ctx.run_id,
                run_date=self.ctx.run_date,
                counters=self.counters.snapshot(),
            )

        try:
            self.retrying("checkpoint", save, retries=1)
        except PageNotDone as exc:
            log.warning("sweep %s: low watermark not recorded (the previous checkpoint stays): %s",
                        self.name, exc)
            return False
        return True

    def complete(self) -> str | None:
        """Record that the range finished; a stop reason when that could not be recorded."""
        store = self.store
        if store is None:
            return None
        try:
            self.retrying("completion record", lambda: store.complete(self.name, self.ctx.mode, self.range_key))
        except PageNotDone as exc:
            return f"the range finished but its completion was not recorded: {exc}"
        return None
