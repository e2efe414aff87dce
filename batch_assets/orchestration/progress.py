"""Progress of a running op: a Dagster log line every N pages, a heartbeat observation, a terminal bar.

The engines call `progress(snapshot)` after each page (sweep: a counters dict) or
batch (expiry/queue: their result object). This turns that into:

* a log line with the counters every `every_pages` pages (or every `every_s` seconds
  for engines without pages);
* an `AssetObservation` "heartbeat" at least every `heartbeat_s` seconds while running,
  so the UI shows a live run is alive;
* on an interactive stderr (in-process CLI runs), a one-line progress bar.

Callbacks come from engine threads; Dagster's log and event APIs are called only
while holding a lock, and never with secrets (counters only).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import dagster as dg

HEARTBEAT_S = 120.0
"""An observation at least this often while running (the UI's "heartbeat")."""

_COUNTER_KEYS = ("scanned", "changed", "unchanged", "failed", "pages")


def counters_of(snapshot: Any) -> dict[str, Any]:
    """Plain counters from a sweep snapshot dict or an engine result object."""
    if isinstance(snapshot, Mapping):
        data = dict(snapshot)
    elif hasattr(snapshot, "to_summary"):
        data = snapshot.to_summary("")
    else:
        data = {k: getattr(snapshot, k) for k in _COUNTER_KEYS if hasattr(snapshot, k)}
    return {k: v for k, v in data.items() if k in _COUNTER_KEYS + ("claimed", "done", "retried", "expired")}


class OpProgress:
    """A thread-safe progress callback for one op."""

    def __init__(
        self,
        context: dg.OpExecutionContext,
        *,
        label: str,
        asset_key: str | None = None,
        every_pages: int = 50,
        every_s: float = 10.0,
        heartbeat_s: float = HEARTBEAT_S,
        total: int | None = None,
        stream: Any = None,
    ) -> None:
        self.context = context
        self.label = label
        self.asset_key = asset_key
        self.every_pages = max(1, every_pages)
        self.every_s = every_s
        self.heartbeat_s = heartbeat_s
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._last_log = self._started
        self._last_heartbeat = self._started
        self._last_bar = 0.0
        self._last_pages = 0
        self.last: dict[str, Any] = {}

    def __call__(self, snapshot: Any) -> None:
        counters = counters_of(snapshot)
        now = time.monotonic()
        with self._lock:
            self.last = counters
            pages = counters.get("pages")
            due_log = (
                pages // self.every_pages > self._last_pages // self.every_pages
                if isinstance(pages, int)
                else now - self._last_log >= self.every_s
            )
            if due_log:
                self._last_pages = pages if isinstance(pages, int) else self._last_pages
                self._last_log = now
                self.context.log.info(f"{self.label} progress: {self._describe(counters, now)}")
            if self.tty and now - self._last_bar >= 0.2:
                self._last_bar = now
                self._bar(counters, now)

    def heartbeat(self, counters: Mapping[str, Any] | None = None, now: float | None = None) -> None:
        """Log a heartbeat (and an AssetObservation when the op reports an asset)."""
        counters = dict(counters if counters is not None else self.last)
        now = time.monotonic() if now is None else now
        elapsed = round(now - self._started, 1)
        self.context.log.info(f"{self.label} heartbeat: running {elapsed}s, {self._describe(counters, now)}")
        if self.asset_key is not None:
            metadata: dict[str, Any] = {"heartbeat": "RUNNING", "elapsed_s": elapsed}
            metadata.update({k: v for k, v in counters.items() if isinstance(v, int | float)})
            self.context.log_event(
                dg.AssetObservation(asset_key=self.asset_key, description=f"{self.label} heartbeat", metadata=metadata)
            )

    def _describe(self, counters: Mapping[str, Any], now: float) -> str:
        parts = [f"{k}={counters[k]}" for k in counters]
        scanned = counters.get("scanned") or counters.get("claimed")
        elapsed = max(now - self._started, 1e-6)
        if isinstance(scanned, int):
            parts.append(f"rows/s={scanned / elapsed:,.0f}")
        return " ".join(parts)

    def _bar(self, counters: Mapping[str, Any], now: float) -> None:
        scanned = counters.get("scanned") or counters.get("claimed") or 0
        if self.total:
            done = min(1.0, scanned / self.total)
            filled = int(done * 30)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {done:6.1%}"
        else:
            bar = f"[{scanned:,} rows]"
        text = f"\r{self.label} {bar} changed={counters.get('changed', 0)} failed={counters.get('failed', 0)} " \
               f"{now - self._started:5.0f}s"
        self.stream.write(text[:160])
        self.stream.flush()

    def _beat_loop(self) -> None:
        # Independent of page progress, so a run stuck in one long page still shows it is alive.
        while not self._stopped.wait(min(self.heartbeat_s, 5.0)):
            now = time.monotonic()
            if now - self._last_heartbeat >= self.heartbeat_s:
                with self._lock:
                    self._last_heartbeat = now
                    self.heartbeat(self.last, now)

    def __enter__(self) -> OpProgress:
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat_loop, name=f"progress-{self.label}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the heartbeat thread and end the terminal bar line."""
        stopped = getattr(self, "_stopped", None)
        if stopped is not None:
            stopped.set()
            self._thread.join(timeout=10)
        if self.tty and self._last_bar:
            self.stream.write("\n")
            self.stream.flush()
            self._last_bar = 0.0
