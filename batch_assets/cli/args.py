"""Argument types and the parser class: every value checked, bounded, in ASCII digits; errors exit 2."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import date

from batch_assets.errors import (
    ConfigError,
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


def positive(name: str, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """A whole number 0..maximum in ASCII digits (int() alone also takes '１８' and '1_000')."""

    def parse(text: str) -> int:
        if not re.fullmatch(r"[+-]?[0-9]+", text.strip(), re.ASCII):
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {text!r}")
        value = int(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} must not be negative, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{name} must be at most {maximum}, got {value}")
        return value

    return parse


def at_least_one(name: str, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = positive(name, maximum)(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {value}")
        return value

    return parse


def priority_value(text: str) -> int:
    """A payment priority: a whole number that fits the smallint column."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"priority must be an integer, got {text!r}") from None
    if not -32768 <= value <= 32767:
        raise argparse.ArgumentTypeError(f"priority must be within -32768..32767, got {value}")
    return value


def fraction(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not 0.0 <= value <= 1.0:
            raise argparse.ArgumentTypeError(f"{name} must be between 0 and 1, got {value}")
        return value

    return parse


DISTANT_HELP = "allow a --run-date further from today than BATCH_ASSETS_RUN_DATE_WINDOW_DAYS (default 366)"

