"""The one typed model of a job's settings: every knob's type, bounds, default and description, and the
cross-field rules, in one place.

A job's settings are a `SettingsModel` subclass (the engine's `SweepSettings`, a job's own on top of it).
Everything else derives from it: the Dagster run config (`orchestration.config.config_class`: launchpad
fields, descriptions, defaults) and the CLI options (`cli.args.add_setting`). Nothing validates a value
again downstream: a model is valid wherever it travels (frozen).

Building one raises a `ConfigError` naming the first invalid field (exit 2 on the command line, one line in a
failed run), never a pydantic trace. `from_text` first holds values typed by an operator to what a careful
operator means: ASCII digits only for numbers, no empty value, a flag only true or false.
"""

from __future__ import annotations

import enum
import math
import re
import types
from collections.abc import Mapping
from datetime import date
from typing import Any, Literal, Self, Union, get_args, get_origin

import pydantic
from pydantic import ConfigDict
from pydantic.fields import FieldInfo

from batch_assets.errors import ConfigError
from batch_assets.run_dates import check_run_date_window, parse_run_date

# A number as a careful operator types it: ASCII digits only. int() and float() alone also take ' 5', '+5',
# '1_000', '１８', 'nan' and 'inf'. At most 18 digits, so int() never meets its own length limit.
WHOLE_NUMBER_RE = re.compile(r"[0-9]{1,18}", re.ASCII)
DECIMAL_NUMBER_RE = re.compile(r"(?:[0-9]{1,18}(?:\.[0-9]{1,18})?|\.[0-9]{1,18})", re.ASCII)


DEFAULT_CALL_TIMEOUT_S = 30.0
"""The bound of one call into a team's code (a declared `compute` or `handler`) unless its declaration says more."""
MAX_CALL_TIMEOUT_S = 3600.0
"""Upper bound of a call's bound (s)."""


class SettingsModel(pydantic.BaseModel):
    """Base of every job's settings (see the module docstring). Strict: 2.0 is not a count, 'yes' not a flag."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except pydantic.ValidationError as exc:
            raise config_error(exc) from None

    @classmethod
    def from_text(cls, values: Mapping[str, Any] | None = None) -> Self:
        """The settings from values as given (None = the default; a string is an operator's text, e.g. `--set`)."""
        fields = cls.model_fields
        clean: dict[str, Any] = {}
        for name, value in (values or {}).items():
            if value is None:
                continue
            if name not in fields:
                raise ConfigError("unknown setting", field=name)
            clean[name] = given_value(name, fields[name].annotation, value)
        return cls(**clean)

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump()


class DatedSettings(SettingsModel):
    """A job fixed to one run date (default: today in BATCH_ASSETS_TIMEZONE, resolved when the run starts).

    How far the run date may lie from today is not a rule of the model: "today" and the window belong to where
    the run is checked (`check_run_date`: the op's calendar resource, the command line's settings)."""

    run_date: date | None = pydantic.Field(
        default=None,
        description="Run date YYYY-MM-DD, fixed for every row of the run. Default: today in BATCH_ASSETS_TIMEZONE.",
    )
    allow_distant_run_date: bool = pydantic.Field(
        default=False,
        description="Allow a run date further from today than BATCH_ASSETS_RUN_DATE_WINDOW_DAYS (default 366).",
    )

    @pydantic.field_validator("run_date", mode="before")
    @classmethod
    def _parse_run_date(cls, value: Any) -> Any:
        return parse_run_date(value) if isinstance(value, str) else value


def check_run_date(settings: object, *, window_days: int, timezone: str) -> None:
    """A dated job's run date within `window_days` of today in `timezone`, unless `allow_distant_run_date`
    (a ConfigError naming run_date); settings without a run date pass."""
    if isinstance(settings, DatedSettings):
        check_run_date_window(settings.run_date, allow_distant=settings.allow_distant_run_date,
                              window_days=window_days, timezone=timezone)


_MESSAGES = {
    "less_than_equal": "must be at most {le:g}",
    "less_than": "must be below {lt:g}",
    "greater_than_equal": "must be at least {ge:g}",
    "greater_than": "must be greater than {gt:g}",
    "int_type": "must be a whole number",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "finite_number": "must be a finite number",
    "extra_forbidden": "unknown setting",
    "literal_error": "must be {expected}",
}


def config_error(exc: pydantic.ValidationError) -> ConfigError:
    """pydantic's first error as one ConfigError naming the field (e.g. `workers: must be at most 32, got 100`)."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or None
    template = _MESSAGES.get(first.get("type", ""))
    if template is None:
        return ConfigError(str(first.get("msg", "invalid value")).removeprefix("Value error, "), field=field)
    message = template.format(**(first.get("ctx") or {}))
    if first.get("type") != "extra_forbidden":
        shown = repr(first.get("input"))
        message += f", got {shown if len(shown) <= 40 else shown[:40] + '...'}"
    return ConfigError(message, field=field)


def scalar_type(annotation: Any) -> Any:
    """int, float, bool, str, date, an Enum or a Literal's values tuple; `X | None` is X."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return scalar_type(args[0])
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    return annotation


def choices(annotation: Any) -> tuple[str, ...] | None:
    """The allowed values of a Literal or Enum field, else None."""
    kind = scalar_type(annotation)
    if isinstance(kind, tuple):
        return tuple(str(v) for v in kind)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return tuple(str(m.value) for m in kind)
    return None


def _limits(info: FieldInfo) -> dict[str, float]:
    """A field's ge / gt / le / lt constraints."""
    return {k: getattr(m, k) for m in info.metadata for k in ("ge", "gt", "le", "lt")
            if getattr(m, k, None) is not None}


def bounds(info: FieldInfo) -> tuple[float | None, float | None]:
    """A field's lower and upper bound (ge or gt; le or lt), None where it has none."""
    limits = _limits(info)
    return limits.get("ge", limits.get("gt")), limits.get("le", limits.get("lt"))


def describe(info: FieldInfo) -> str:
    """A field's description with its default and bounds, as the launchpad and `--help` show it."""
    text = (info.description or "").rstrip()
    limits = _limits(info)
    low, high = bounds(info)
    if "gt" in limits and high is not None:
        text += f" Above {low:g}, at most {high:g}."
    elif low is not None and high is not None:
        text += f" {low:g}..{high:g}."
    elif high is not None:
        text += f" At most {high:g}."
    default = info.default
    if default is not None and not isinstance(default, bool) and "Default" not in text:
        shown = default.value if isinstance(default, enum.Enum) else default
        text += f" Default {shown:g}." if isinstance(shown, int | float) else f" Default {shown}."
    return text.strip()


def given_value(name: str, annotation: Any, value: Any) -> Any:
    """A value given for field `name`, held to what an operator means before the model's own validation.

    A string of plain ASCII digits is taken for a number field; ' 5', '+5', '1_000', '' and 'yes' are refused,
    naming the field. A number given for a number field must already be one (2.0 is not a count, nan no number).
    """
    kind = scalar_type(annotation)
    if isinstance(value, dict | list | tuple | set):
        raise ConfigError(f"must be {_one_value(kind)}, got {'an object' if isinstance(value, dict) else 'an array'}",
                          field=name)
    if isinstance(value, str):
        shown = repr(value) if len(value) <= 40 else f"{value[:40]!r}..."
        if not value.strip():
            raise ConfigError(f"must not be empty, got {value!r}", field=name)
        if kind is int:
            if not WHOLE_NUMBER_RE.fullmatch(value):
                raise ConfigError(f"must be a whole number in ASCII digits, got {shown}", field=name)
            return int(value)
        if kind is float:
            if not DECIMAL_NUMBER_RE.fullmatch(value):
                raise ConfigError(f"must be a number in ASCII digits, got {shown}", field=name)
            return float(value)
        if kind is bool:
            raise ConfigError(f"must be true or false, got {shown}", field=name)
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"must be a whole number, got {value!r}", field=name)
    if kind is float and (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)):
        raise ConfigError(f"must be a finite number, got {value!r}", field=name)
    if kind is float:
        return float(value)
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"must be true or false, got {value!r}", field=name)
    return value


def _one_value(kind: Any) -> str:
    """What a field of `kind` takes, in words (for a value of the wrong JSON type)."""
    if isinstance(kind, tuple):
        return "one of " + ", ".join(str(v) for v in kind)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in kind)
    words = {int: "a whole number", float: "a number", bool: "true or false", str: "a text", date: "a date YYYY-MM-DD"}
    return words.get(kind, "a single value")


__all__ = [
    "DECIMAL_NUMBER_RE",
    "WHOLE_NUMBER_RE",
    "DatedSettings",
    "SettingsModel",
    "bounds",
    "check_run_date",
    "choices",
    "config_error",
    "describe",
    "given_value",
    "scalar_type",
]
