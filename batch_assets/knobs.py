"""Shared rules for the settings dataclasses of the jobs: 0/None means the default, anything else is checked."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any, TypeVar

from batch_assets.errors import ConfigError

T = TypeVar("T")

# A number as a careful operator types it: ASCII digits only. int() and float() alone also take ' 5', '+5',
# '1_000', '１８', 'nan' and 'inf'. At most 18 digits, so int() never meets its own length limit.
WHOLE_NUMBER_RE = re.compile(r"[0-9]{1,18}", re.ASCII)
DECIMAL_NUMBER_RE = re.compile(r"(?:[0-9]{1,18}(?:\.[0-9]{1,18})?|\.[0-9]{1,18})", re.ASCII)


def build_settings(cls: type[T], overrides: dict[str, Any]) -> T:
    """`cls(**overrides)` where a value of 0 or None takes the field's default; unknown names are errors."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    for name in overrides:
        if name not in known:
            raise ConfigError("unknown setting", field=name)
    return cls(**{k: v for k, v in overrides.items() if v is not None and v != 0})


def check_positive_fields(settings: Any, *, may_be_zero: tuple[str, ...] = ()) -> None:
    """Every field must be a finite number > 0 (whole for int fields), or >= 0 for those in `may_be_zero` (0 = off);
    ConfigError names the first bad one."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"must be a number, got {value!r}", field=f.name)
        if value < 0 or (value == 0 and f.name not in may_be_zero):
            raise ConfigError(f"must be > 0, got {value!r}", field=f.name)
        if f.type in ("int", int) and int(value) != value:
            raise ConfigError(f"must be a whole number, got {value!r}", field=f.name)
