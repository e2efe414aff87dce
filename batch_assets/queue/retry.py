"""The retry policy of one queue: exponential backoff with jitter, a cap, max attempts, and a delay the
handler may ask for (an HTTP `Retry-After`, or `batch_assets.RetryAfter(seconds)`).

One object per queue, built from the queue's settings (`backoff: {base_s, max_s, jitter}` and
`max_attempts` in a TableQueueComponent's YAML). The outage breaker is not part of it: while the
breaker is open the worker waits at least the rest of the cool-down (`max(policy delay, breaker)`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from batch_assets.errors import ConfigError

MAX_JITTER = 1.0
"""jitter is a fraction of the delay: 0 (none) .. 1 (anywhere between 0 and twice the delay)."""


@dataclass(frozen=True)
class RetryPolicy:
    """Delay after a transient failure of attempt k: base_s * 2^(k-1), capped at max_s, spread by ±jitter.

    `requested` (the handler's own delay: Retry-After, RetryAfter) replaces the backoff, clamped to
    0..max_s and not spread: a service that says "in 30 s" is asked again in 30 s, and `max_s`
    stays the longest a row ever waits between two attempts. A transient failure on attempt
    `max_attempts` is terminal (FAILED), whatever the delay asked for.
    """

    base_s: float = 60.0
    max_s: float = 3600.0
    jitter: float = 0.1
    max_attempts: int = 5
    random: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("base_s", "max_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"must be a number > 0, got {value!r}", field=f"backoff.{name}")
        if self.max_s < self.base_s:
            raise ConfigError(f"must be >= base_s ({self.base_s:g}), got {self.max_s:g}", field="backoff.max_s")
        jitter = self.jitter
        if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter <= MAX_JITTER:
            raise ConfigError(f"must be a number within 0..{MAX_JITTER:g}, got {jitter!r}", field="backoff.jitter")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigError(f"must be a whole number >= 1, got {self.max_attempts!r}", field="max_attempts")

    def backoff_s(self, attempts: int) -> float:
        """The backoff of attempt `attempts` without jitter: base_s * 2^(attempts-1), capped at max_s."""
        exponent = max(attempts - 1, 0)
        if exponent >= 64:
            return float(self.max_s)
        return float(min(self.base_s * (2**exponent), self.max_s))

    def delay_s(self, attempts: int, requested: float | None = None) -> float:
        """Seconds until the next attempt after a transient failure of attempt `attempts`."""
        if requested is not None and math.isfinite(requested):
            return min(max(float(requested), 0.0), float(self.max_s))
        delay = self.backoff_s(attempts)
        if self.jitter:
            delay *= 1.0 + self.jitter * (2.0 * self.random() - 1.0)
        return min(max(delay, 0.0), float(self.max_s))

    def is_last(self, attempts: int) -> bool:
        """Whether a transient failure of attempt `attempts` is terminal (FAILED)."""
        return attempts >= self.max_attempts
