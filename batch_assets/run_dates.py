"""Run dates: parsed strictly, kept within a window of today, in the configured time zone.

No Dagster here: the CLI parses `--run-date` with these before it loads anything heavy, and the
jobs' Config classes (orchestration.config) use the same functions.
"""

from __future__ import annotations

import re
from datetime import date, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from batch_assets.errors import ConfigError
from batch_assets.settings import TIMEZONE_VAR

RUN_DATE_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)
"""Exactly YYYY-MM-DD in ASCII digits: `date.fromisoformat` alone also takes 20261130 and 2026-W48-1."""


def parse_run_date(value: str | None, *, field: str = "run_date") -> date | None:
    """`YYYY-MM-DD` → date; None (not given) → None; anything else is a ConfigError naming the field.

    An empty value is refused, not read as "today": it is what an unset shell variable gives
    (`--run-date "$RUN_DATE"`), and running today's sweep instead is not what was meant. So is any
    space around the date: the text must be exactly ten ASCII characters.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"must be a date YYYY-MM-DD, got {type(value).__name__}", field=field)
    if not value.strip():
        raise ConfigError(f"must be a date YYYY-MM-DD, got an empty value {value!r}", field=field)
    if not RUN_DATE_RE.fullmatch(value):
        shown = repr(value) if len(value) <= 40 else f"{value[:40]!r}..."
        raise ConfigError(f"must be a date YYYY-MM-DD in ASCII digits, got {shown}", field=field)
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ConfigError(f"{value!r} is not a real date (YYYY-MM-DD)", field=field) from None


def check_run_date_window(run_date: date | None, *, allow_distant: bool, window_days: int, timezone: str,
                          field: str = "run_date") -> None:
    """A run date more than `window_days` from today in `timezone` needs `allow_distant`.

    A mistyped year (2070, 1926) would otherwise rewrite every category as of that day. The window and the
    zone are given, never read here: an op passes its calendar resource's, the command line its settings'
    (BATCH_ASSETS_RUN_DATE_WINDOW_DAYS, default 366, and BATCH_ASSETS_TIMEZONE).
    """
    if run_date is None or allow_distant:
        return
    today = today_in(timezone)
    if abs((run_date - today).days) > window_days:
        raise ConfigError(
            f"{run_date.isoformat()} is more than {window_days} days from today ({today.isoformat()}); "
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
