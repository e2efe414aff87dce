"""Sweep settings: every knob in one validated, frozen object.

Zero or None means "the documented default" (tests and callers that build the
engine outside any config system get safe values); anything else that is out
of range is a `ConfigError` naming the field, raised before any read or write.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from batch_assets.errors import ConfigError

MAX_PAGE_SIZE = 1000
"""Upper bound of a page: an IN list / unnest array stays within the classic 1,000 limit."""

ABSOLUTE_MAX_PAGE_SIZE = 10_000
"""The largest page any sweep may allow (`SweepDefinition.max_page_size`; the default is MAX_PAGE_SIZE)."""

MAX_WORKERS = 32
MAX_POOL_SIZE = 64
"""A range's connection budget: with several ranges in parallel (multiprocess) the server's
max_connections is the real bound, checked before launch (orchestration.preflight)."""

MAXIMA: dict[str, float] = {
    "page_size": MAX_PAGE_SIZE,
    "workers": MAX_WORKERS,
    "window": 4 * MAX_WORKERS,
    "pool_size": MAX_POOL_SIZE,
    "breaker_min_rows": 10_000_000,
    "summary_every_pages": 1_000_000,
    "transient_retries": 20,
    "page_timeout_s": 3600,
    "row_timeout_s": 3600,
    "lock_timeout_s": 3600,
    "heartbeat_s": 3600,
    "lease_ttl_s": 86_400,
    "lock_ttl_s": 86_400,
    "lock_min_s": 86_400,
    "drain_timeout_s": 3600,
    "checkpoint_every_s": 3600,
    "retry_backoff_s": 60,
}
"""Upper bound of every numeric knob (a mistyped value fails before the run, never halfway)."""

PREFETCH_CONNECTIONS = 1
SIDE_EFFECT_CONNECTIONS = 1
HEARTBEAT_CONNECTIONS = 1


ZERO_ALLOWED = frozenset({"lock_min_s"})
"""Knobs for which 0 is a value (no minimum hold), not "the default"."""


@dataclass(frozen=True)
class SweepSettings:
    """Validated when built (`__post_init__`), so a SweepSettings object is valid wherever it travels;
    nothing downstream validates it again."""

    page_size: int = 1000
    workers: int = 4
    window: int = 3
    page_timeout_s: float = 30
    row_timeout_s: float = 5
    lock_timeout_s: float = 5
    breaker_ratio: float = 0.2
    breaker_min_rows: int = 100
    summary_every_pages: int = 50
    checkpoint_every_s: float = 1.0  # low watermark saved at most this often, and always at the end
    heartbeat_s: float = 10
    lease_ttl_s: float = 60
    lock_ttl_s: float = 120
    lock_min_s: float = 0
    lock_fail_open: bool = False
    drain_timeout_s: float = 30
    adaptive_page_size: bool = False
    pool_size: int = 10
    transient_retries: int = 5
    """Retries of a read or write transaction that failed for a transient reason (connection lost, server
    restarting, timeout), with exponential backoff from retry_backoff_s; then the run stops, resumable."""
    retry_backoff_s: float = 0.5

    @classmethod
    def build(cls, **kwargs: Any) -> SweepSettings:
        """Settings from keyword values; 0/None means the default; invalid values raise `ConfigError`."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, value in kwargs.items():
            if name not in known:
                raise ConfigError("unknown sweep setting", field=name)
            if value is None or (value == 0 and not isinstance(value, bool) and name not in ZERO_ALLOWED):
                continue
            values[name] = value
        return cls(**values)

    def __post_init__(self) -> None:
        # The page bound of a particular sweep (SweepDefinition.max_page_size) is checked by run_sweep.
        self.validate(max_page_size=ABSOLUTE_MAX_PAGE_SIZE)

    def validate(self, *, max_page_size: int = MAX_PAGE_SIZE) -> None:
        """Raise `ConfigError(field=...)` for the first invalid value.

        `max_page_size` replaces MAX_PAGE_SIZE for a sweep whose write statement carries more keys.
        """
        for name in ("page_size", "workers", "window", "breaker_min_rows", "summary_every_pages", "pool_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"must be a positive integer, got {value!r}", field=name)
        if isinstance(self.transient_retries, bool) or not isinstance(self.transient_retries, int) or (
            self.transient_retries < 0
        ):
            raise ConfigError(f"must be a whole number >= 0, got {self.transient_retries!r}", field="transient_retries")
        for name in (
            "page_timeout_s",
            "row_timeout_s",
            "lock_timeout_s",
            "heartbeat_s",
            "lease_ttl_s",
            "lock_ttl_s",
            "drain_timeout_s",
            "checkpoint_every_s",
            "retry_backoff_s",
        ):
            _positive_number(name, getattr(self, name))
        if isinstance(self.lock_min_s, bool) or not isinstance(self.lock_min_s, int | float) or not (
            math.isfinite(self.lock_min_s) and self.lock_min_s >= 0
        ):
            raise ConfigError(f"must be a number >= 0, got {self.lock_min_s!r}", field="lock_min_s")
        for name, maximum in {**MAXIMA, "page_size": max_page_size}.items():
            value = getattr(self, name)
            if value > maximum:
                raise ConfigError(f"must be at most {maximum}, got {value!r}", field=name)
        ratio = self.breaker_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not (0 < ratio <= 1):
            raise ConfigError(f"must be in (0, 1], got {ratio!r}", field="breaker_ratio")
        for name in ("lock_fail_open", "adaptive_page_size"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError("must be a boolean", field=name)
        if self.heartbeat_s >= self.lease_ttl_s:
            raise ConfigError("must be shorter than lease_ttl_s", field="heartbeat_s")
        if self.heartbeat_s >= self.lock_ttl_s:
            raise ConfigError("must be shorter than lock_ttl_s", field="heartbeat_s")
        if self.row_timeout_s > self.page_timeout_s:
            raise ConfigError("must not exceed page_timeout_s", field="row_timeout_s")
        needed = self.connections_needed
        if needed > self.pool_size:
            raise ConfigError(
                f"connection budget exceeded: workers ({self.workers}) + prefetch ({PREFETCH_CONNECTIONS}) "
                f"+ side-effect ({SIDE_EFFECT_CONNECTIONS}) + heartbeat ({HEARTBEAT_CONNECTIONS}) = {needed} "
                f"> pool_size ({self.pool_size})",
                field="pool_size",
            )

    @property
    def connections_needed(self) -> int:
        return self.workers + PREFETCH_CONNECTIONS + SIDE_EFFECT_CONNECTIONS + HEARTBEAT_CONNECTIONS

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _positive_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"must be a positive number, got {value!r}", field=name)
