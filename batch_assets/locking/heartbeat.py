"""A daemon thread that renews a run's lease and lock every few seconds.

A beat is a callable returning True while we still own what it renews. The first
False is fatal: the thread records why, sets `lost` and stops, and the run must
stop writing (a run that keeps going after losing its lease is a zombie
dual-writer). An exception (the store did not answer: a dropped connection, a
restarting server) is fatal too, unless `grace_s` is set: then the beat is
retried every second while less than `grace_s` has passed since the last
successful round, a margin the caller sets below the lease's and lock's TTLs, so
a brief outage never costs the lease and the run never holds on past an expiry.
Renewals happen on the thread's own short transactions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType

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
        self.beats_done = 0
        self.grace_s = max(0.0, float(grace_s))
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

    def _run(self) -> None:
        last_ok = time.monotonic()
        wait = self.interval_s
        while not self._stop.wait(wait):
            reason, raised = self._beat_once()
            if reason is None:
                last_ok, wait = time.monotonic(), self.interval_s
                self.beats_done += 1
                continue
            left = self.grace_s - (time.monotonic() - last_ok)
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
                return f"{_beat_name(beat)} raised {type(exc).__name__}: {exc}", True
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
