"""Process-wide graceful shutdown: SIGTERM/SIGINT stop new pages, in-flight work drains."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

STOP = threading.Event()
"""Set when the process was asked to stop; engines stop taking new work."""

_log = logging.getLogger("batch_assets.shutdown")


def _handle(signum: int, _frame: FrameType | None) -> None:
    if STOP.is_set() and signum == signal.SIGINT:
        raise KeyboardInterrupt  # a second Ctrl-C forces the way out
    _log.warning("received %s: stopping new work, draining in-flight pages", signal.Signals(signum).name)
    STOP.set()


def install_signal_handlers() -> None:
    """Route SIGTERM and SIGINT to `STOP` (main thread only), starting from a clear `STOP`."""
    if threading.current_thread() is threading.main_thread():
        STOP.clear()
        signal.signal(signal.SIGTERM, _handle)
        signal.signal(signal.SIGINT, _handle)
