"""Sweep settings: every engine knob in one typed, frozen model (`SweepSettings`).

Each knob's type, bounds, default and description live on its field, the cross-field rules (heartbeat
below the lease, the connection budget) on the model; a value out of range is a `ConfigError` naming the
field, raised before any read or write. A job's run config and CLI options derive from these fields.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator

from batch_assets.errors import ConfigError
from batch_assets.settings_model import MAX_CALL_TIMEOUT_S, SettingsModel

MAX_PAGE_SIZE = 1000
"""Upper bound of a page: an IN list / unnest array stays within the classic 1,000 limit."""

ABSOLUTE_MAX_PAGE_SIZE = 10_000
"""The largest page any sweep may allow (`Reader.max_page_size`; the default is MAX_PAGE_SIZE)."""

MIN_ADAPTIVE_PAGE = 50
"""The smallest page `adaptive_page_size` shrinks to, and the fewest rows the breaker judges a short page on."""

MAX_WORKERS = 32
MAX_POOL_SIZE = 64
"""A range's connection budget: with several ranges in parallel (multiprocess) the server's
max_connections is the real bound, checked before launch (orchestration.preflight)."""

PREFETCH_CONNECTIONS = 1
SIDE_EFFECT_CONNECTIONS = 1
HEARTBEAT_CONNECTIONS = 1


def _count(default: int, maximum: int, description: str, *, minimum: int = 1) -> Any:
    return Field(default=default, ge=minimum, le=maximum, description=description)


def _seconds(default: float, maximum: float, description: str) -> Any:
    return Field(default=default, gt=0, le=maximum, description=description)


class SweepSettings(SettingsModel):
    """Every engine knob: type, bounds, default, description and the cross-field rules. Frozen and validated when
    built, so a SweepSettings is valid wherever it travels; nothing downstream validates it again. A sweep's own
    page bound (`Reader.max_page_size`) is checked by run_sweep."""

    page_size: int = _count(1000, ABSOLUTE_MAX_PAGE_SIZE,
                            f"Rows per page (a sweep allows at most {MAX_PAGE_SIZE} unless its reader says more).")
    workers: int = _count(4, MAX_WORKERS, "Worker threads per range.")
    window: int = _count(3, 4 * MAX_WORKERS, "Pages in flight per range.")
    page_timeout_s: float = _seconds(30.0, 3600, "statement_timeout of a page transaction (s).")
    row_timeout_s: float = _seconds(5.0, 3600, "statement_timeout of a per-row fallback transaction (s).")
    lock_timeout_s: float = _seconds(5.0, 3600, "lock_timeout of write transactions (s).")
    breaker_ratio: float = Field(default=0.2, gt=0, le=1,
                                 description="Circuit breaker: systemic failures / rows of a page, in (0, 1].")
    breaker_min_rows: int = _count(100, 10_000_000, "Rows before the breaker may trip.")
    summary_every_pages: int = _count(50, 1_000_000, "Log a progress line every N pages.")
    checkpoint_every_s: float = _seconds(
        1.0, 3600, "Save the low-watermark checkpoint at most this often (s); always at the end.")
    heartbeat_s: float = _seconds(10.0, 3600, "Lease/lock heartbeat interval (s), below lease_ttl_s and lock_ttl_s.")
    lease_ttl_s: float = _seconds(60.0, 86_400, "Run lease expiry (s).")
    lock_ttl_s: float = _seconds(120.0, 86_400, "Job lock lock-at-most-for (s), renewed by heartbeats.")
    lock_min_s: float = Field(default=0.0, ge=0, le=86_400, description="Job lock lock-at-least-for (s); 0 = none.")
    lock_fail_open: bool = Field(default=False,
                                 description="Continue on the lease alone when the lock store is down.")
    drain_timeout_s: float = _seconds(30.0, 3600, "On a stop, wait at most this long for the pages in flight (s).")
    call_timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_CALL_TIMEOUT_S,
        description="The longest one compute call may take (s): past it the row counts as compute_timeout and the run "
        "goes on without it. Default: the sweep's own bound (a declared sweep's call_timeout_s, 30 s unless it says "
        "otherwise; none for the product's own sweeps).")
    adaptive_page_size: bool = Field(default=False, description="Shrink/grow pages on timeouts.")
    pool_size: int = Field(  # type: ignore[assignment]  # None: resolved from workers by _default_pool_size
        default=None, ge=1, le=MAX_POOL_SIZE,
        description="Connection budget per range process: workers + prefetch + side-effect + heartbeat at most. "
        "Default max(10, workers + 3).",
    )
    transient_retries: int = _count(
        5, 20, "Retries of a read or write transaction that failed for a transient reason (connection lost, "
        "server restarting, timeout), with exponential backoff from retry_backoff_s; then the run stops, resumable.",
        minimum=0)
    retry_backoff_s: float = _seconds(0.5, 60, "First backoff of a transient retry (s), doubled up to 8 s.")

    @model_validator(mode="before")
    @classmethod
    def _default_pool_size(cls, values: Any) -> Any:
        """The pool follows the workers unless it is given: max(10, workers + prefetch + side-effect + heartbeat)."""
        if isinstance(values, dict) and values.get("pool_size") is None:
            workers = values.get("workers", cls.model_fields["workers"].default)
            if isinstance(workers, int) and not isinstance(workers, bool):
                values = {**values, "pool_size": max(10, workers + PREFETCH_CONNECTIONS + SIDE_EFFECT_CONNECTIONS
                                                     + HEARTBEAT_CONNECTIONS)}
        return values

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Self:
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
        return self

    @property
    def connections_needed(self) -> int:
        return self.workers + PREFETCH_CONNECTIONS + SIDE_EFFECT_CONNECTIONS + HEARTBEAT_CONNECTIONS
