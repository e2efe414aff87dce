"""Process settings read from the environment (CONTRACT §1).

Nothing here is read at import time: callers ask for `load_settings()` when they
need it, so a missing variable surfaces as a clear error at the point of use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from batch_assets.errors import ConfigError

DATABASE_URL_VAR = "BATCH_ASSETS_DATABASE_URL"
ENCRYPTION_KEY_VAR = "BATCH_ASSETS_ENCRYPTION_KEY"
REDIS_URL_VAR = "BATCH_ASSETS_REDIS_URL"
LIMITS_URL_VAR = "BATCH_ASSETS_LIMITS_URL"
ALERT_WEBHOOK_VAR = "BATCH_ASSETS_ALERT_WEBHOOK"
HOME_VAR = "BATCH_ASSETS_HOME"
TIMEZONE_VAR = "BATCH_ASSETS_TIMEZONE"
DAGSTER_PG_URL_VAR = "BATCH_ASSETS_DAGSTER_PG_URL"
TEST_DATABASE_URL_VAR = "BATCH_ASSETS_TEST_DATABASE_URL"
AUTOMATION_VAR = "BATCH_ASSETS_AUTOMATION"


@dataclass(frozen=True)
class Settings:
    """What the environment says; `None` means "unset" (CONTRACT §1 defaults apply)."""

    database_url: str | None
    encryption_key: str | None
    redis_url: str | None
    limits_url: str | None
    alert_webhook: str | None
    timezone: str
    home: Path

    @property
    def embedded(self) -> bool:
        """True when no database URL is set and the embedded PostgreSQL is used."""
        return self.database_url is None

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster_home"


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    home = Path(_get(env, HOME_VAR) or Path.cwd() / ".batch_assets").resolve()
    return Settings(
        database_url=_get(env, DATABASE_URL_VAR),
        encryption_key=_get(env, ENCRYPTION_KEY_VAR),
        redis_url=_get(env, REDIS_URL_VAR),
        limits_url=_get(env, LIMITS_URL_VAR),
        alert_webhook=_get(env, ALERT_WEBHOOK_VAR),
        timezone=_get(env, TIMEZONE_VAR) or "UTC",
        home=home,
    )


_AUTOMATION_VALUES = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def automation_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether schedules and run-starting sensors start RUNNING (CONTRACT §8): BATCH_ASSETS_AUTOMATION=off stops them.

    Read when the code location loads (never at import time); an unknown value is a ConfigError naming the variable.
    """
    env = os.environ if environ is None else environ
    value = (_get(env, AUTOMATION_VAR) or "on").lower()
    if value not in _AUTOMATION_VALUES:
        raise ConfigError(f"must be on or off, got {value!r}", field=AUTOMATION_VAR)
    return _AUTOMATION_VALUES[value]
