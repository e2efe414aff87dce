"""The outage breaker of a queue worker (docs/guide/payment-queue.md): stop calling a failing service, then probe it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
BREAKER_CODES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}
"""The breaker state as a number (Dagster plots numeric metadata)."""


class Breaker:
    """The outage breaker: transient failures of `failures` distinct rows in a row open it.

    Open: no call is made and claimed rows go back without spending an attempt. After the
    cool-down it is half-open and lets one probe through: an answer closes it, a transient
    failure opens it again with the cool-down doubled (up to `max_cooldown_s`). Distinct
    rows, so one row that keeps failing on its own does not open it. Every call that was
    made and failed (one that opened it, one in flight when it opened, a probe) spends its attempt
    and is backed off (`executor.Executor.settle`), so such a row reaches the DLQ as usual.
    """

    def __init__(
        self, failures: int, cooldown_s: float, max_cooldown_s: float, clock: Callable[[], float] = time.monotonic,
        *, label: str = "queue",
    ) -> None:
        self.label = label
        self.failures = failures
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.clock = clock
        self.state = CLOSED
        self.cooldown_s = cooldown_s
        self.opened_at = 0.0
        self.failing: set[Any] = set()
        self.probing = False
        self.changes = 0  # bumped on every state change (the worker records the state)
        self.opened = 0

    def _set(self, state: str) -> None:
        if state != self.state:
            log.warning("%s breaker %s -> %s (cool-down %.0fs)", self.label, self.state, state, self.cooldown_s)
            self.state = state
            self.changes += 1

    def remaining_s(self) -> float:
        """Seconds until the next probe (0 unless open)."""
        if self.state != OPEN:
            return 0.0
        return max(0.0, self.opened_at + self.cooldown_s - self.clock())

    def poll(self) -> str:
        """The state now; an open breaker whose cool-down passed becomes half-open."""
        if self.state == OPEN and self.remaining_s() <= 0:
            self.probing = False
            self._set(HALF_OPEN)
        return self.state

    def allow_call(self) -> bool:
        """Whether a claimed row may be called now (half-open: one probe at a time)."""
        state = self.poll()
        if state == CLOSED:
            return True
        if state == HALF_OPEN and not self.probing:
            self.probing = True
            return True
        return False

    def on_answer(self) -> None:
        """The service answered (DONE or a permanent rejection): close, reset the cool-down."""
        self.failing.clear()
        self.probing = False
        self.cooldown_s = self.base_cooldown_s
        self._set(CLOSED)

    def on_transient(self, row_id: Any) -> None:
        """A transient failure: count it when closed; a failed probe reopens with a longer cool-down."""
        if self.state == HALF_OPEN:
            self.probing = False
            self.cooldown_s = min(self.cooldown_s * 2, self.max_cooldown_s)
            self._open()
        elif self.state == CLOSED:
            self.failing.add(row_id)
            if len(self.failing) >= self.failures:
                self._open()

    def _open(self) -> None:
        self.opened_at = self.clock()
        self.failing.clear()
        self.opened += 1
        self._set(OPEN)

