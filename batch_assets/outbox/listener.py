"""Follow mode's wake-up: a dedicated connection LISTENing for the notification a statement trigger sends on
every insert into outbox_events, so an event is relayed well under a second after its page commits."""

from __future__ import annotations

import logging
import threading
import time

import sqlalchemy as sa
from sqlalchemy.pool import PoolProxiedConnection

from batch_assets.db.engine import driver_connection

log = logging.getLogger("batch_assets.outbox.relay")

NOTIFY_CHANNEL = "batch_assets_outbox"


class Listener:
    """A dedicated autocommit connection LISTENing on NOTIFY_CHANNEL (no transaction stays open)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self._raw: PoolProxiedConnection | None = None

    def __enter__(self) -> Listener:
        self._connect()
        return self

    def _connect(self) -> None:
        try:
            raw = self.engine.raw_connection()
            driver = driver_connection(raw)
            driver.autocommit = True
            driver.execute(f"LISTEN {NOTIFY_CHANNEL}")  # a constant identifier, never input
            self._raw = raw
        except Exception as exc:  # noqa: BLE001 - without LISTEN the loop still polls every poll_s
            log.warning("outbox relay: LISTEN unavailable (%s); polling", type(exc).__name__)
            self._raw = None

    def wait(self, timeout_s: float, stop: threading.Event) -> None:
        """Return on a notification, after timeout_s, or soon after `stop` is set."""
        if self._raw is None:
            stop.wait(timeout_s)
            self._connect()
            return
        deadline = time.monotonic() + timeout_s
        try:
            # Short slices, so a stop request is seen within half a second.
            while not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for _ in driver_connection(self._raw).notifies(timeout=min(left, 0.5), stop_after=1):
                    return
        except Exception as exc:  # noqa: BLE001 - connection lost: reconnect on the next wait
            log.warning("outbox relay: notification connection lost (%s)", type(exc).__name__)
            self._close()

    def _close(self) -> None:
        if self._raw is not None:
            try:
                self._raw.invalidate()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self._raw = None

    def __exit__(self, *exc: object) -> None:
        # Closed rather than returned to the pool: it is in autocommit mode and LISTENing.
        self._close()
