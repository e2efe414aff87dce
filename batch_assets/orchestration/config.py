"""What every job's run config shares: the `JobConfig` base and `config_class`.

A job's settings are one typed model (`batch_assets.settings_model.SettingsModel`: type, bounds, default,
description and cross-field rules per field). Its run config is derived from it, `config_class(Model, name,
doc)`: the launchpad fields, defaults and descriptions come from the model, and `to_settings()` builds the
model, the one place a value is validated:

* the CLI builds the config (`JobConfig.from_values`: operator text held to ASCII digits, no empty value)
  and calls `to_settings()` before it launches anything; a bad value is a ConfigError naming the field
  (exit 2);
* the job's first op does the same before any read or write (the launchpad and GraphQL only type-check
  config before the run starts) and turns a ConfigError into a one-line, non-retriable failure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import date
from typing import Any, ClassVar, Self

import dagster as dg
import pydantic
from pydantic import Field

from batch_assets.errors import ConfigError
from batch_assets.run_dates import check_run_date_window, parse_run_date, today_in, zone
from batch_assets.settings_model import SettingsModel, choices, describe, given_value

MAX_COUNT = 10_000_000
"""Upper bound of any count knob that has no tighter one of its own."""
MAX_SECONDS = 7 * 86_400
"""Upper bound of any duration knob (seconds) that has no tighter one: a week."""
MAX_RETRIES = 1000


class JobConfig(dg.Config):
    """Base of every job's run config (see the module docstring)."""

    settings_model: ClassVar[type[SettingsModel] | None] = None
    """The job's settings model when the config was derived from it (`config_class`)."""

    def to_settings(self) -> Any:
        """Validate everything (ConfigError naming the field) and return the job's typed settings."""
        if self.settings_model is None:
            raise NotImplementedError
        return self.settings_model.from_text(
            {name: getattr(self, name) for name in type(self).model_fields})

    @classmethod
    def from_values(cls, values: Mapping[str, Any] | None = None) -> Self:
        """The config from plain values (None = the default), pydantic's errors as a ConfigError naming the field."""
        fields = cls.model_fields
        clean = {
            k: given_value(k, fields[k].annotation, v) if k in fields else v
            for k, v in (values or {}).items() if v is not None
        }
        try:
            return cls(**clean)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first.get("loc", ())) or None
            message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
            if field and message.startswith(f"{field}: "):
                message = message[len(field) + 2:]
            raise ConfigError(message, field=field) from None


def config_class(settings: type[SettingsModel], name: str, doc: str, *, fields: tuple[str, ...] | None = None) -> Any:
    """The run config of a job whose settings are `settings`: one launchpad field per model field, with the model's
    default and its description (bounds and default included); a Literal of modes becomes a config Enum, so the
    launchpad refuses any other value before the run starts. Nothing is validated here beyond Dagster's types:
    `to_settings()` builds the model from the values, and the model holds every bound and cross-field rule.
    `fields` limits the run config to those (the others keep the model's default). (Typed Any: its fields exist
    only at runtime.)"""
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__module__": settings.__module__, "__doc__": doc, "settings_model": settings}
    own = _own_fields(settings)  # the job's own fields (mode, ...) first on the launchpad
    ordered = sorted(settings.model_fields.items(), key=lambda item: item[0] not in own)
    for field_name, info in ordered:
        if fields is not None and field_name not in fields:
            continue
        annotation: Any = info.annotation
        default = info.default
        allowed = choices(annotation)
        if allowed is not None:
            enum_name = name.removesuffix("Config") + "".join(p.title() for p in field_name.split("_"))
            modes: Any = enum.Enum(enum_name, [(v, v) for v in allowed], type=str)  # type: ignore[misc]
            annotation = modes
            default = None if default is None else modes(str(getattr(default, "value", default)))
        elif annotation in (date, date | None):
            annotation = str | None
            default = None if default is None else default.isoformat()
        elif default is None and annotation in (int, float):
            annotation = annotation | None  # a default the model derives from other fields (e.g. pool_size)
        annotations[field_name] = annotation
        namespace[field_name] = Field(default=default, description=describe(info))
    namespace["__annotations__"] = annotations
    return type(name, (JobConfig,), namespace)


def _own_fields(settings: type[SettingsModel]) -> set[str]:
    """The fields a job's settings declare (mode, ...): the class's own annotations or, when it only narrows inherited
    fields (a tighter page_size bound), those of its nearest ancestor that adds a field of its own."""
    for klass in settings.__mro__:
        declared = set(vars(klass).get("__annotations__", {}))
        inherited = {name for base in klass.__bases__ for name in getattr(base, "model_fields", {})}
        if declared - inherited:
            return declared
    return set()


__all__ = [
    "MAX_COUNT",
    "MAX_RETRIES",
    "MAX_SECONDS",
    "JobConfig",
    "check_run_date_window",
    "parse_run_date",
    "today_in",
    "zone",
]
