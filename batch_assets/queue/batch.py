"""The adaptive claim batch of a queue worker (seed 004, pattern 7)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

CLAIM_WAIT_LIMIT_S = 0.25
"""Claimed rows waiting longer than this for a lane shrink the batch."""


class AdaptiveBatch:
    """The claim batch (seed 004, pattern 7): bounded to 1..maximum, every change logged at DEBUG.

    It doubles while claims come back full and the handlers keep up (no claimed row was still
    waiting when the next claim went out); it halves when claimed rows wait too long for a lane,
    and falls to what came back when a claim comes back short (the queue is nearly empty).
    """

    def __init__(self, initial: int, maximum: int, *, wait_limit_s: float = CLAIM_WAIT_LIMIT_S) -> None:
        self.maximum = max(int(maximum), 1)
        self.size = min(max(int(initial), 1), self.maximum)
        self.wait_limit_s = wait_limit_s

    def after_claim(self, wanted: int, got: int, *, waiting: int, oldest_wait_s: float) -> int:
        """Adapt after a claim of `wanted` that returned `got`, when `waiting` claimed rows had not started."""
        old = self.size
        if got < wanted:
            new = max(1, got, old // 2)
            why = f"claim came back short ({got}/{wanted})"
        elif oldest_wait_s > self.wait_limit_s:
            new = max(1, old // 2)
            why = f"claimed rows waited {oldest_wait_s:.3f}s for a handler"
        elif waiting == 0:
            new = min(self.maximum, old * 2)
            why = "claim came back full and the handlers kept up"
        else:
            new, why = old, ""
        if new != old:
            log.debug("claim batch %d -> %d: %s", old, new, why)
            self.size = new
        return self.size

