"""Run configuration of every job, as `dg.Config` classes.

Zero or a missing value means the documented default (named in each field's
description). Validation happens in three places, all with the same messages
that name the field:

* `to_engine_settings()` — the CLI calls it before launching (ConfigError, exit 2);
* pydantic field validators — when the op's config object is built;
* the first op of every job calls `to_engine_settings()` again before any read or
  write and turns a ConfigError into a non-retriable `dg.Failure` (the launchpad and
  GraphQL only type-check config before the run starts).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import dagster as dg
from pydantic import Field, field_validator

from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import ConfigError
from batch_assets.settings import TIMEZONE_VAR, load_settings

SWEEP_MODES = ("delta", "full", "config-change")
DEFAULT_RANGES = 4
MAX_RANGES = 256
DEFAULT_RELAY_BATCH_SIZE = 500
MAX_RELAY_BATCH_SIZE = 10_000


RUN_DATE_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)
"""Exactly YYYY-MM-DD in ASCII digits: `date.fromisoformat` alone also takes 20261130 and 2026-W48-1."""


def parse_run_date(value: str | None, *, field: str = "run_date") -> date | None:
    """`YYYY-MM-DD` → date; None/empty → None; anything else is a ConfigError naming the field."""
    if value is None or not str(value).strip():
        return None
    text = str(value).strip()
    try:
        if not RUN_DATE_RE.fullmatch(text):
            raise ValueError
        return date.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"must be a date YYYY-MM-DD, got {text!r}", field=field) from None


def check_run_date_window(run_date: date | None, *, allow_distant: bool, field: str = "run_date") -> None:
    """A run date more than BATCH_ASSETS_RUN_DATE_WINDOW_DAYS (default 366) from today needs `allow_distant`.

    A mistyped year (2070, 1926) would otherwise rewrite every category as of that day.
    """
    if run_date is None or allow_distant:
        return
    settings = load_settings()
    today = today_in(settings.timezone)
    window = settings.run_date_window_days
    if abs((run_date - today).days) > window:
        raise ConfigError(
            f"{run_date.isoformat()} is more than {window} days from today ({today.isoformat()}); "
            f"pass allow_distant_run_date (CLI: --allow-distant-run-date) if that is really meant",
            field=field,
        )


def zone(name: str) -> ZoneInfo:
    """The configured time zone, or a ConfigError naming BATCH_ASSETS_TIMEZONE."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"unknown time zone {name!r}", field=TIMEZONE_VAR) from None


def today_in(timezone: str) -> date:
    """Today's date in `timezone` (the default run date; computed once per run)."""
    return datetime.now(zone(timezone)).date()


MAX_COUNT = 10_000_000
"""Upper bound of any count knob that has no tighter one of its own."""
MAX_SECONDS = 7 * 86_400
"""Upper bound of any duration knob (seconds) that has no tighter one: a week."""
MAX_RETRIES = 1000


def _non_negative_int(name: str, value: Any, *, maximum: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"must be a whole number >= 0 (0 = default), got {value!r}", field=name)
    if value > maximum:
        raise ConfigError(f"must be at most {maximum}, got {value}", field=name)
    return value


def _non_negative_number(name: str, value: Any, *, maximum: float = MAX_SECONDS) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"must be a number >= 0 (0 = default), got {value!r}", field=name)
    if value > maximum:
        raise ConfigError(f"must be at most {maximum:g}, got {value:g}", field=name)
    return float(value)


def _pydantic_check(fn: Any, name: str, value: Any) -> Any:
    """Run a ConfigError check inside a pydantic validator (ValueError keeps the field in the message)."""
    try:
        fn(name, value)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return value


# --- customer-status sweep -----------------------------------------------------


@dataclass(frozen=True)
class SweepPlanSettings:
    """What the sweep job needs besides the engine's SweepSettings."""

    mode: str
    run_date: date | None
    ranges: int
    engine: SweepSettings


class SweepConfig(dg.Config):
    """Customer-status sweep (CONTRACT §2 `sweep customer-status`). 0 or missing = the documented default."""

    mode: str = Field(default="delta", description="delta | full | config-change. Default delta.")
    run_date: str | None = Field(
        default=None,
        description="Run date YYYY-MM-DD, fixed for every row of the run. Default: today in BATCH_ASSETS_TIMEZONE.",
    )
    allow_distant_run_date: bool = Field(
        default=False,
        description="Allow a run date further from today than BATCH_ASSETS_RUN_DATE_WINDOW_DAYS (default 366).",
    )
    ranges: int = Field(
        default=0,
        description=f"Cursor ranges (UUID key ranges, one mapped op each) for full/config-change; delta is "
        f"always one range. 0 = {DEFAULT_RANGES}; at most {MAX_RANGES}.",
    )
    workers: int = Field(default=0, description="Worker threads per range. 0 = 4.")
    window: int = Field(default=0, description="Pages in flight per range. 0 = 3.")
    page_size: int = Field(default=0, description="Rows per page, 1..1000. 0 = 1000.")
    page_timeout_s: float = Field(default=0, description="statement_timeout of a page transaction (s). 0 = 30.")
    row_timeout_s: float = Field(
        default=0, description="statement_timeout of a per-row fallback transaction (s). 0 = 5."
    )
    lock_timeout_s: float = Field(default=0, description="lock_timeout of write transactions (s). 0 = 5.")
    breaker_ratio: float = Field(
        default=0, description="Circuit breaker: systemic failures / rows of a page, in (0, 1]. 0 = 0.2."
    )
    breaker_min_rows: int = Field(default=0, description="Rows before the breaker may trip. 0 = 100.")
    summary_every_pages: int = Field(default=0, description="Log a progress line every N pages. 0 = 50.")
    checkpoint_every_s: float = Field(
        default=0, description="Save the low-watermark checkpoint at most this often (s); always at the end. 0 = 1."
    )
    heartbeat_s: float = Field(default=0, description="Lease/lock heartbeat interval (s). 0 = 10.")
    lease_ttl_s: float = Field(default=0, description="Run lease expiry (s). 0 = 60.")
    lock_ttl_s: float = Field(default=0, description="Job lock lock-at-most-for (s), renewed by heartbeats. 0 = 120.")
    lock_min_s: float = Field(default=0, description="Job lock lock-at-least-for (s). 0 = none.")
    lock_fail_open: bool = Field(
        default=False, description="Continue on the lease alone when the lock store is down. Default false."
    )
    adaptive_page_size: bool = Field(default=False, description="Shrink/grow pages on timeouts. Default false.")
    pool_size: int = Field(
        default=0, description="Connection budget per range process. 0 = max(10, workers + 3)."
    )

    @field_validator("mode")
    @classmethod
    def _mode(cls, value: str) -> str:
        if value not in SWEEP_MODES:
            raise ValueError(f"mode: must be one of {', '.join(SWEEP_MODES)}, got {value!r}")
        return value

    @field_validator("run_date")
    @classmethod
    def _run_date(cls, value: str | None) -> str | None:
        try:
            parse_run_date(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("ranges")
    @classmethod
    def _ranges(cls, value: int) -> int:
        return _pydantic_check(lambda n, v: _non_negative_int(n, v, maximum=MAX_RANGES), "ranges", value)

    @field_validator("workers", "window", "page_size", "breaker_min_rows", "summary_every_pages", "pool_size")
    @classmethod
    def _counts(cls, value: int, info: Any) -> int:
        return _pydantic_check(_non_negative_int, info.field_name, value)

    @field_validator(
        "page_timeout_s", "row_timeout_s", "lock_timeout_s", "breaker_ratio", "heartbeat_s", "lease_ttl_s",
        "lock_ttl_s", "lock_min_s", "checkpoint_every_s",
    )
    @classmethod
    def _numbers(cls, value: float, info: Any) -> float:
        return _pydantic_check(_non_negative_number, info.field_name, value)

    def to_engine_settings(self) -> SweepPlanSettings:
        """Validate everything (ConfigError naming the field) and return the plan + engine settings."""
        if self.mode not in SWEEP_MODES:
            raise ConfigError(f"must be one of {', '.join(SWEEP_MODES)}, got {self.mode!r}", field="mode")
        run_date = parse_run_date(self.run_date)
        check_run_date_window(run_date, allow_distant=self.allow_distant_run_date)
        ranges = _non_negative_int("ranges", self.ranges, maximum=MAX_RANGES) or DEFAULT_RANGES
        if self.mode == "delta":
            ranges = 1
        for name in ("workers", "window", "page_size", "breaker_min_rows", "summary_every_pages", "pool_size"):
            _non_negative_int(name, getattr(self, name))
        for name in ("page_timeout_s", "row_timeout_s", "lock_timeout_s", "breaker_ratio", "heartbeat_s",
                     "lease_ttl_s", "lock_ttl_s", "lock_min_s", "checkpoint_every_s"):
            _non_negative_number(name, getattr(self, name))
        workers = self.workers or SweepSettings.workers
        pool_size = self.pool_size or max(SweepSettings.pool_size, workers + 3)
        engine = SweepSettings.build(
            workers=self.workers,
            window=self.window,
            page_size=self.page_size,
            page_timeout_s=self.page_timeout_s,
            row_timeout_s=self.row_timeout_s,
            lock_timeout_s=self.lock_timeout_s,
            breaker_ratio=self.breaker_ratio,
            breaker_min_rows=self.breaker_min_rows,
            summary_every_pages=self.summary_every_pages,
            checkpoint_every_s=self.checkpoint_every_s,
            heartbeat_s=self.heartbeat_s,
            lease_ttl_s=self.lease_ttl_s,
            lock_ttl_s=self.lock_ttl_s,
            lock_min_s=self.lock_min_s,
            lock_fail_open=self.lock_fail_open,
            adaptive_page_size=self.adaptive_page_size,
            pool_size=pool_size,
        )
        return SweepPlanSettings(mode=self.mode, run_date=run_date, ranges=ranges, engine=engine)

    def validate_config(self) -> None:
        """Raise ConfigError (naming the field) if anything is invalid."""
        self.to_engine_settings()


# --- subscription expiry ----------------------------------------------------------


@dataclass(frozen=True)
class ExpiryPlanSettings:
    run_date: date | None
    retry_failed: bool
    engine: Any
    """batch_assets.domains.subscriptions.expiry.ExpirySettings"""


class ExpiryConfig(dg.Config):
    """Nightly subscription expiry (CONTRACT §6). 0 or missing = the documented default."""

    run_date: str | None = Field(
        default=None,
        description="Expire ACTIVE subscriptions with expiry_date before this date (YYYY-MM-DD). "
        "Default: today in BATCH_ASSETS_TIMEZONE.",
    )
    retry_failed: bool = Field(
        default=False, description="Retry FAILED subscriptions whose retry_count is under max_retries. Default false."
    )
    allow_distant_run_date: bool = Field(
        default=False,
        description="Allow a run date further from today than BATCH_ASSETS_RUN_DATE_WINDOW_DAYS (default 366).",
    )
    batch_size: int = Field(default=0, description="Subscriptions per batch. 0 = the engine default (500).")
    max_retries: int = Field(default=0, description="Maximum retry_count retried by retry_failed. 0 = 3.")

    @field_validator("run_date")
    @classmethod
    def _run_date(cls, value: str | None) -> str | None:
        try:
            parse_run_date(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("batch_size", "max_retries")
    @classmethod
    def _counts(cls, value: int, info: Any) -> int:
        return _pydantic_check(_non_negative_int, info.field_name, value)

    def to_engine_settings(self) -> ExpiryPlanSettings:
        from batch_assets.domains.subscriptions.expiry import ExpirySettings

        run_date = parse_run_date(self.run_date)
        check_run_date_window(run_date, allow_distant=self.allow_distant_run_date)
        _non_negative_int("batch_size", self.batch_size)
        _non_negative_int("max_retries", self.max_retries, maximum=MAX_RETRIES)
        engine = ExpirySettings.build(batch_size=self.batch_size or None, max_retries=self.max_retries or None)
        return ExpiryPlanSettings(run_date=run_date, retry_failed=bool(self.retry_failed), engine=engine)

    def validate_config(self) -> None:
        self.to_engine_settings()


# --- payment queue ---------------------------------------------------------------------


@dataclass(frozen=True)
class QueueDrainPlanSettings:
    max_seconds: float | None
    drain: bool
    engine: Any
    """batch_assets.domains.payments.queue.QueueSettings"""


class QueueDrainConfig(dg.Config):
    """The payment worker (CONTRACT §7): a drain, or the resident worker. 0 or missing = the default."""

    concurrency: int = Field(default=0, description="Handler calls in flight, at most 256. 0 = 8.")
    max_seconds: float = Field(
        default=0, description="Stop claiming new work after this many seconds. 0 = no limit."
    )
    batch_size: int = Field(
        default=0, description="First claim batch (it adapts within 1..1000), at most 1000. 0 = 50."
    )
    drain: bool = Field(
        default=True,
        description="Exit once nothing is due. False = the resident worker: it waits for notifications "
        "and runs until stopped (SIGTERM, run termination) or max_seconds.",
    )
    db_outage_s: float = Field(
        default=0, description="Seconds a lost database connection is retried (backoff) before the worker fails, "
        "at most 600. 0 = 60.",
    )

    @field_validator("concurrency", "batch_size")
    @classmethod
    def _counts(cls, value: int, info: Any) -> int:
        return _pydantic_check(_non_negative_int, info.field_name, value)

    @field_validator("max_seconds", "db_outage_s")
    @classmethod
    def _seconds(cls, value: float, info: Any) -> float:
        return _pydantic_check(_non_negative_number, info.field_name, value)

    def to_engine_settings(self) -> QueueDrainPlanSettings:
        from batch_assets.domains.payments.queue import QueueSettings

        _non_negative_int("concurrency", self.concurrency)
        _non_negative_int("batch_size", self.batch_size)
        max_seconds = _non_negative_number("max_seconds", self.max_seconds)
        db_outage_s = _non_negative_number("db_outage_s", self.db_outage_s)
        engine = QueueSettings.build(concurrency=self.concurrency or None, batch_size=self.batch_size or None,
                                     db_outage_s=db_outage_s or None)
        return QueueDrainPlanSettings(max_seconds=max_seconds or None, drain=bool(self.drain), engine=engine)

    def validate_config(self) -> None:
        self.to_engine_settings()


# --- outbox relay ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RelayPlanSettings:
    batch_size: int
    follow: bool
    follow_seconds: float | None
    engine: Any
    """batch_assets.outbox.relay.RelaySettings"""


MAX_FOLLOW_SECONDS = 7 * 24 * 3600


class OutboxRelayConfig(dg.Config):
    """The outbox relay (PENDING → sink → SENT). 0 or missing = the documented default."""

    batch_size: int = Field(
        default=0,
        description=f"Events per batch, at most {MAX_RELAY_BATCH_SIZE}. 0 = {DEFAULT_RELAY_BATCH_SIZE}.",
    )
    follow: bool = Field(
        default=False,
        description="Keep relaying, woken by a PostgreSQL notification on every new event, until stopped "
        "(or follow_seconds pass). Default false: one pass until nothing is pending.",
    )
    follow_seconds: float = Field(
        default=0, description=f"With follow: stop after this many seconds. 0 = until stopped; at most "
        f"{MAX_FOLLOW_SECONDS}."
    )
    claim_lease_s: float = Field(
        default=0, description="Claim lease of a batch (s); another relay may take it after. 0 = 60."
    )
    send_timeout_s: float = Field(
        default=0, description="Timeout of one send to the sink (s), below claim_lease_s. 0 = 10."
    )

    @field_validator("batch_size")
    @classmethod
    def _batch_size(cls, value: int) -> int:
        return _pydantic_check(
            lambda n, v: _non_negative_int(n, v, maximum=MAX_RELAY_BATCH_SIZE), "batch_size", value
        )

    @field_validator("follow_seconds", "claim_lease_s", "send_timeout_s")
    @classmethod
    def _seconds(cls, value: float, info: Any) -> float:
        return _pydantic_check(_non_negative_number, info.field_name, value)

    def to_engine_settings(self) -> RelayPlanSettings:
        from batch_assets.outbox.relay import RelaySettings

        size = _non_negative_int("batch_size", self.batch_size, maximum=MAX_RELAY_BATCH_SIZE)
        follow_seconds = _non_negative_number("follow_seconds", self.follow_seconds)
        if follow_seconds > MAX_FOLLOW_SECONDS:
            raise ConfigError(f"must be at most {MAX_FOLLOW_SECONDS}, got {follow_seconds}", field="follow_seconds")
        lease = _non_negative_number("claim_lease_s", self.claim_lease_s) or RelaySettings.claim_lease_s
        timeout = _non_negative_number("send_timeout_s", self.send_timeout_s) or RelaySettings.send_timeout_s
        engine = RelaySettings(
            batch_size=size or DEFAULT_RELAY_BATCH_SIZE, claim_lease_s=lease, send_timeout_s=timeout
        ).check()
        return RelayPlanSettings(
            batch_size=engine.batch_size, follow=bool(self.follow), follow_seconds=follow_seconds or None,
            engine=engine,
        )

    def validate_config(self) -> None:
        self.to_engine_settings()


CONFIG_CLASSES: dict[str, type[dg.Config]] = {
    "customer_status_sweep_job": SweepConfig,
    "customer_status_sweep_celery_job": SweepConfig,
    "subscription_expiry_job": ExpiryConfig,
    "payment_queue_drain_job": QueueDrainConfig,
    "outbox_relay_job": OutboxRelayConfig,
}
