"""The exceptions a queue handler raises to steer its row (CONTRACT §7, §10)."""

from __future__ import annotations

import math


class PermanentFailure(Exception):
    """Raised by a payment handler: the payment is FAILED at once (no retry). Any other exception is transient."""


class RetryAfter(Exception):
    """Raised by a handler: a transient failure, tried again after `seconds` instead of the backoff.

    The attempt is spent as for any transient failure (FAILED at max_attempts); the delay is clamped
    to 0..the queue's `backoff.max_s`. `RetryAfter(30)` or `RetryAfter(30, "quota exhausted")`.
    """

    def __init__(self, seconds: float, message: str = "") -> None:
        try:
            value = float(seconds)
        except (TypeError, ValueError):
            value = math.nan
        # A delay that is not a finite number falls back to the queue's backoff (None).
        self.seconds: float | None = value if math.isfinite(value) else None
        super().__init__(message or f"retry after {seconds}s")
