"""A daemon thread that renews a run's lease and lock every few seconds.

A beat is a callable returning True while we still own what it renews. The first
False or exception is fatal: the thread records why, sets `lost` and stops, and
the run must stop writing (a run that keeps going after losing its lease is a
zombie dual-writer). Renewals happen on the thread's own short transactions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from types import TracebackType

log = logging.getLogger(__name__)

Beat = Callable[[], bool]


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
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = float(interval_s)
        self.beats = list(beats)
        self.on_lost = on_lost
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self.beats_done = 0
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
        while not self._stop.wait(self.interval_s):
            reason = self._beat_once()
            if reason is not None:
                self._lose(reason)
                return
            self.beats_done += 1

    def _beat_once(self) -> str | None:
        for beat in self.beats:
            try:
                ok = beat()
            except Exception as exc:  # any failure to renew is a loss, reported through `lost`
                return f"{_beat_name(beat)} raised {type(exc).__name__}: {exc}"
            if not ok:
                return f"{_beat_name(beat)} returned False"
        return None

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
