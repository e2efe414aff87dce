"""Argument types and the parser class: every value checked, bounded, in ASCII digits; errors exit 2."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import date
from typing import Any

from batch_assets.errors import (
    ConfigError,
)
from batch_assets.settings_model import (
    DECIMAL_NUMBER_RE,
    WHOLE_NUMBER_RE,
    SettingsModel,
    bounds,
    choices,
    describe,
    scalar_type,
)


class UsageError(ConfigError):
    """argparse errors, reported with exit 2 like any configuration error."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def parse_run_date(text: str | None) -> date | None:
    """`--run-date`: exactly YYYY-MM-DD (ASCII digits); the one parser the Config classes use too."""
    from batch_assets.run_dates import parse_run_date as parse

    return parse(text)


def today_in(timezone: str) -> date:
    """Today in the configured time zone: the default run date, computed once per run."""
    from batch_assets.run_dates import today_in as today

    return today(timezone)


MAX_COUNT = 100_000_000
"""Upper bound of a row or item count on the command line (a mistyped extra digit fails at once)."""

MAX_SEED = 2**63 - 1
"""Upper bound of a random seed."""

_SIGNED_RE = re.compile(r"-?[0-9]{1,18}", re.ASCII)
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.ASCII | re.IGNORECASE)


def _not_empty(name: str, text: str) -> None:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{name} must not be empty, got {text!r}")


def _shown(text: str) -> str:
    """The value as an error line shows it: quoted, cut after 40 characters."""
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"


def positive(name: str, maximum: int = MAX_COUNT, *, minimum: int = 0) -> Callable[[str], int]:
    """A whole number minimum..maximum in ASCII digits, nothing else: no sign, space, '_' or other digits."""

    def parse(text: str) -> int:
        _not_empty(name, text)
        if not WHOLE_NUMBER_RE.fullmatch(text):
            raise argparse.ArgumentTypeError(
                f"{name} must be a whole number {minimum}..{maximum} in ASCII digits, got {_shown(text)}")
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be at least {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{name} must be at most {maximum}, got {value}")
        return value

    return parse


def at_least_one(name: str, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """A whole number 1..maximum in ASCII digits."""
    return positive(name, maximum, minimum=1)


def seed_value(text: str) -> int:
    """A random seed: a whole number 0..2**63-1 in ASCII digits."""
    return positive("seed", MAX_SEED)(text)


def priority_value(text: str) -> int:
    """A payment priority: a whole number in ASCII digits (optionally negative) that fits the smallint column."""
    _not_empty("priority", text)
    if not _SIGNED_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"priority must be a whole number -32768..32767 in ASCII digits, got {_shown(text)}")
    value = int(text)
    if not -32768 <= value <= 32767:
        raise argparse.ArgumentTypeError(f"priority must be within -32768..32767, got {value}")
    return value


def decimal(name: str, *, maximum: float | None = None) -> Callable[[str], float]:
    """A non-negative decimal number in ASCII digits (e.g. 2, 0.5, .25): no sign, exponent, space, nan or inf."""

    def parse(text: str) -> float:
        _not_empty(name, text)
        if not DECIMAL_NUMBER_RE.fullmatch(text):
            raise argparse.ArgumentTypeError(
                f"{name} must be a number in ASCII digits (e.g. 30 or 0.5), got {_shown(text)}")
        value = float(text)
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{name} must be at most {maximum:g}, got {text}")
        return value

    return parse


def fraction(name: str) -> Callable[[str], float]:
    """A fraction 0..1 in ASCII digits."""
    return decimal(name, maximum=1.0)


def payment_id(text: str) -> str:
    """A payment id as `queue dlq list` prints it: a UUID in its canonical 8-4-4-4-12 hex form."""
    _not_empty("id", text)
    if not _UUID_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"id must be a UUID (8-4-4-4-12 hex digits), got {_shown(text)}")
    return text


def add_setting(parser: argparse.ArgumentParser, model: type[SettingsModel], name: str, *, flag: str | None = None,
                **extra: Any) -> None:
    """`--NAME` (underscores as dashes; `flag` when the contract names the option otherwise) for field `name` of a
    job's settings model: its type, bounds, choices and help derive from the field. Not given = None (the model's
    default); a flag field is `store_true`."""
    info = model.model_fields[name]
    flag = flag or "--" + name.replace("_", "-")
    options: dict[str, Any] = {"default": None, "help": describe(info)}
    kind = scalar_type(info.annotation)
    low, high = bounds(info)
    allowed = choices(info.annotation)
    if allowed is not None:
        options["choices"] = list(allowed)
    elif kind is bool:
        options["action"] = "store_true"
    elif kind is int:
        options["type"] = positive(name, int(high) if high is not None else MAX_COUNT, minimum=int(low or 0))
    elif kind is float:
        options["type"] = decimal(name, maximum=high)
    parser.add_argument(flag, **{**options, **extra})


DISTANT_HELP = "allow a --run-date further from today than BATCH_ASSETS_RUN_DATE_WINDOW_DAYS (default 366)"

