"""A daemon thread that renews a run's lease and lock every few seconds.

A beat is a callable returning True while we still own what it renews. The first
False is fatal: the thread records why, sets `lost` and stops, and the run must
stop writing (a run that keeps going after losing its lease is a zombie
dual-writer). An exception (the store did not answer: a dropped connection, a
restarting server) is fatal too, unless `grace_s` is set: then the beat is
retried every second while less than `grace_s` has passed since the last
successful round, a margin the caller sets below the lease's and lock's TTLs, so
a brief outage never costs the lease and the run never holds on past an expiry.

Rounds are due `interval_s` after the start of the last successful one, not after
its end, so a slow renewal does not stretch the cadence. With `grace_s` set the
run also notices a renewal that is late rather than failed: `overdue` is True
once `grace_s` passed since the start of the last successful round (the store
renewed no later than that start plus the TTL), even while a renewal is still
waiting, so the run stops writing before its lease could lapse (RunGuard.alive).
Renewals run on their own connection (locking.guard), never a page's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from batch_assets.errors import error_text

log = logging.getLogger(__name__)

Beat = Callable[[], bool]
RETRY_INTERVAL_S = 1.0


def _beat_name(beat: Beat) -> str:
    return getattr(beat, "__qualname__", None) or getattr(beat, "__name__", None) or repr(beat)


class Heartbeat:
    """Calls every beat each `interval_s`; sets `lost` (with `lost_reason`) on the first failure and stops."""

    def __init__(
        self,
        interval_s: float,
        beats: Sequence[Beat],
        on_lost: Callable[[str], None] | None = None,
        *,
        name: str = "batch-assets-heartbeat",
        grace_s: float = 0.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = float(interval_s)
        self.beats = list(beats)
        self.on_lost = on_lost
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self.last_failure: str | None = None
        """Why the last round failed, while the rounds since the last success failed (None once one renews)."""
        self.beats_done = 0
        self.grace_s = max(0.0, float(grace_s))
        self.last_ok = time.monotonic()
        """monotonic start of the last round in which every beat renewed (the start: the store renewed after it)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Heartbeat:
        """Start the thread (the first beat is one interval from now)."""
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread and wait for it: an in-flight round finishes, no new one starts."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def overdue(self) -> bool:
        """True once `grace_s` (when set) passed since the start of the last successful round."""
        return self.grace_s > 0 and time.monotonic() - self.last_ok >= self.grace_s

    def _run(self) -> None:
        wait = self.interval_s
        while not self._stop.wait(wait):
            started = time.monotonic()
            reason, raised = self._beat_once()
            if reason is None:
                self.last_ok = started
                self.last_failure = None
                self.beats_done += 1
                # Due one interval after this round's start: a slow round does not delay the next one.
                wait = max(0.0, started + self.interval_s - time.monotonic())
                continue
            self.last_failure = reason
            left = self.grace_s - (time.monotonic() - self.last_ok)
            if not raised or left <= 0:
                self._lose(reason)
                return
            log.warning("heartbeat failed (%s); retrying, %.0fs left before giving up", reason, left)
            wait = min(self.interval_s, RETRY_INTERVAL_S, left)

    def _beat_once(self) -> tuple[str | None, bool]:
        """(None, False) when every beat renewed; else (why, whether it raised rather than answered False)."""
        for beat in self.beats:
            try:
                ok = beat()
            except Exception as exc:  # the store did not answer: a loss unless within the grace period
                return f"{_beat_name(beat)} raised {error_text(exc)}", True  # one line, never the parameters
            if not ok:
                return f"{_beat_name(beat)} returned False", False
        return None, False

    def _lose(self, reason: str) -> None:
        self.lost_reason = reason
        self.lost.set()
        log.error("heartbeat lost: %s", reason)
        if self.on_lost is not None:
            try:
                self.on_lost(reason)
            except Exception:  # the callback must not hide the loss, which `lost` already records
                log.exception("heartbeat on_lost callback failed")

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
