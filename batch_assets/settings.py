"""Process settings read from the environment (docs/reference/environment.md).

Nothing here is read at import time: callers ask for `load_settings()` when they
need it, so a missing variable surfaces as a clear error at the point of use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

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
TEST_LAUNCHER_VAR = "BATCH_ASSETS_TEST_LAUNCHER"
"""`off`: the test suite runs each CLI call in a process of its own, not through its resident launcher."""
AUTOMATION_VAR = "BATCH_ASSETS_AUTOMATION"
RUN_DATE_WINDOW_VAR = "BATCH_ASSETS_RUN_DATE_WINDOW_DAYS"
OUTBOX_SINK_VAR = "BATCH_ASSETS_OUTBOX_SINK"
LAUNCHER_VAR = "BATCH_ASSETS_LAUNCHER"
"""The resident launcher's socket path (cli/launcher.py): the client uses the launcher when it is set."""

PRODUCT_VAR_PREFIX = "BATCH_ASSETS_"


def environ_without_product() -> dict[str, str]:
    """This process's environment without a batch_assets variable or DAGSTER_HOME: the base of a child process that
    gets its own settings (the bench's commands, the fault campaign's hosts, the tests' CLI calls), so that nothing
    of the caller's product settings reaches it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(PRODUCT_VAR_PREFIX) and k != "DAGSTER_HOME"}


DEFAULT_RUN_DATE_WINDOW_DAYS = 366
MAX_RUN_DATE_WINDOW_DAYS = 36_500
REDIS_SCHEMES = ("redis", "rediss", "unix")
HTTP_SCHEMES = ("http", "https")
OUTBOX_SINK_SCHEMES = {"redis": "redis", "rediss": "redis", "unix": "redis", "amqp": "amqp", "amqps": "amqp",
                       "nats": "nats", "tls": "nats"}
"""URL scheme → outbox sink kind (besides `file:PATH`)."""


@dataclass(frozen=True)
class OutboxSinkTarget:
    """What BATCH_ASSETS_OUTBOX_SINK names: the kind (file, redis, amqp, nats) and its path or URL."""

    kind: str
    location: str

    def __repr__(self) -> str:  # a URL may carry a password
        shown = f", {self.location!r}" if self.kind == "file" else ""
        return f"OutboxSinkTarget({self.kind!r}{shown})"


@dataclass(frozen=True)
class Settings:
    """What the environment says; `None` means "unset" (docs/reference/environment.md: defaults apply)."""

    database_url: str | None
    encryption_key: str | None
    redis_url: str | None
    limits_url: str | None
    alert_webhook: str | None
    timezone: str
    home: Path
    run_date_window_days: int = DEFAULT_RUN_DATE_WINDOW_DAYS
    """A run date further than this from today needs an explicit `allow_distant_run_date`."""
    outbox_sink: OutboxSinkTarget | None = None
    """The relay's sink (load_settings always sets it; None only in Settings built by hand = the default file)."""
    embedded_allowed: bool = True
    """Whether no database URL starts the embedded server: in a team's own project it never does."""

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
    """The settings of the environment, every URL and number checked (ConfigError naming the variable).

    Checked here, before any command or run starts, so a malformed URL is exit 2 with one line
    instead of a traceback inside a started run.
    """
    env = os.environ if environ is None else environ
    home = Path(_get(env, HOME_VAR) or Path.cwd() / ".batch_assets").resolve()
    return Settings(
        database_url=_get(env, DATABASE_URL_VAR),
        encryption_key=_get(env, ENCRYPTION_KEY_VAR),
        redis_url=check_url(REDIS_URL_VAR, _get(env, REDIS_URL_VAR), REDIS_SCHEMES),
        limits_url=check_url(LIMITS_URL_VAR, _get(env, LIMITS_URL_VAR), HTTP_SCHEMES),
        alert_webhook=check_url(ALERT_WEBHOOK_VAR, _get(env, ALERT_WEBHOOK_VAR), HTTP_SCHEMES),
        timezone=_get(env, TIMEZONE_VAR) or "UTC",
        home=home,
        run_date_window_days=_window_days(_get(env, RUN_DATE_WINDOW_VAR)),
        outbox_sink=check_outbox_sink(env.get(OUTBOX_SINK_VAR), home),
    )


def check_outbox_sink(value: str | None, home: Path) -> OutboxSinkTarget:
    """The sink BATCH_ASSETS_OUTBOX_SINK names (docs/reference/environment.md); unset = `file:<home>/outbox.jsonl`.

    Set but empty, an unknown scheme, a URL without a host or `file:` without a path is a ConfigError
    naming the variable (the message never repeats the value: a URL may carry a password).
    """
    if value is None:
        return OutboxSinkTarget("file", str(home / "outbox.jsonl"))
    text = value.strip()
    if not text:
        raise ConfigError("is empty: unset it for the default file sink, or give file:PATH or a redis://, "
                          "amqp:// or nats:// URL", field=OUTBOX_SINK_VAR)
    if text.startswith("file:"):
        path = text[len("file:"):]
        path = path[2:] if path.startswith("//") else path
        if not path.strip() or "\x00" in path:
            raise ConfigError("file: needs a path (file:PATH)", field=OUTBOX_SINK_VAR)
        return OutboxSinkTarget("file", str(Path(path).expanduser().resolve()))
    try:
        parsed = urlsplit(text)
        port = parsed.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        raise ConfigError("is not a valid URL", field=OUTBOX_SINK_VAR) from None
    kind = OUTBOX_SINK_SCHEMES.get(parsed.scheme.lower())
    if kind is None:
        raise ConfigError(f"must be file:PATH or a redis://, amqp:// or nats:// URL, got scheme "
                          f"{parsed.scheme or '(none)'!r}", field=OUTBOX_SINK_VAR)
    if parsed.scheme == "unix":
        if not parsed.path:
            raise ConfigError("a unix:// URL needs a socket path", field=OUTBOX_SINK_VAR)
    elif not parsed.hostname:
        raise ConfigError("has no host", field=OUTBOX_SINK_VAR)
    if any(ch.isspace() for ch in text) or port == 0:
        raise ConfigError("is not a valid URL", field=OUTBOX_SINK_VAR)
    return OutboxSinkTarget(kind, text)


def check_url(name: str, value: str | None, schemes: tuple[str, ...]) -> str | None:
    """`value` if it is a well-formed URL with one of `schemes` and (but for unix sockets) a host; else ConfigError.

    The message never repeats the URL: it may carry a password.
    """
    if value is None:
        return None
    try:
        parsed = urlsplit(value)
        port = parsed.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        raise ConfigError("is not a valid URL", field=name) from None
    if parsed.scheme not in schemes:
        raise ConfigError(f"must be a {' or '.join(s + '://' for s in schemes)} URL, got scheme "
                          f"{parsed.scheme or '(none)'!r}", field=name)
    if parsed.scheme == "unix":
        if not parsed.path:
            raise ConfigError("a unix:// URL needs a socket path", field=name)
    elif not parsed.hostname:
        raise ConfigError("has no host", field=name)
    if any(ch.isspace() for ch in value) or (port is not None and port == 0):
        raise ConfigError("is not a valid URL", field=name)
    return value


def _window_days(text: str | None) -> int:
    if text is None:
        return DEFAULT_RUN_DATE_WINDOW_DAYS
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_RUN_DATE_WINDOW_DAYS:
        raise ConfigError(f"must be a whole number of days from 1 to {MAX_RUN_DATE_WINDOW_DAYS}, got {text!r}",
                          field=RUN_DATE_WINDOW_VAR)
    return int(text)


_AUTOMATION_VALUES = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def automation_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether schedules and run-starting sensors start RUNNING (docs/production/operations.md):
    BATCH_ASSETS_AUTOMATION=off stops them.

    Read when the code location loads (never at import time); an unknown value is a ConfigError naming the variable.
    """
    env = os.environ if environ is None else environ
    value = (_get(env, AUTOMATION_VAR) or "on").lower()
    if value not in _AUTOMATION_VALUES:
        raise ConfigError(f"must be on or off, got {value!r}", field=AUTOMATION_VAR)
    return _AUTOMATION_VALUES[value]
