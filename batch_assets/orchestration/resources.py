"""Resources: the database, the job lock, the checkpoint store, the alert sink and the calendar.

Each is a `ConfigurableResource` set up once per process (per step process under
the multiprocess and celery executors) and disposed at teardown. Secrets reach
them only through `dg.EnvVar`, never through run config; neither the key nor a
decrypted value is ever logged or put in metadata.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import date
from typing import Any

import dagster as dg
import sqlalchemy as sa
from pydantic import Field, PrivateAttr

from batch_assets.alerts import send_alert
from batch_assets.db.engine import (
    DEFAULT_POOL_SIZE,
    create_engine,
    normalize_url,
    resolve_database_url,
    run_application_name,
)
from batch_assets.errors import ConfigError
from batch_assets.locking.checkpoint import CheckpointStore
from batch_assets.locking.lock import JobLock, make_job_lock
from batch_assets.run_dates import today_in
from batch_assets.settings import (
    ALERT_WEBHOOK_VAR,
    DATABASE_URL_VAR,
    DEFAULT_RUN_DATE_WINDOW_DAYS,
    REDIS_URL_VAR,
    RUN_DATE_WINDOW_VAR,
    TIMEZONE_VAR,
    load_settings,
)
from batch_assets.settings_model import check_run_date


class DatabaseResource(dg.ConfigurableResource):
    """PostgreSQL with the business tables: BATCH_ASSETS_DATABASE_URL, or the embedded server when unset (this
    repository's code location only; a team's declaration needs a URL)."""

    url: str | None = Field(
        default=None,
        description="SQLAlchemy URL, set through EnvVar (BATCH_ASSETS_DATABASE_URL, or the variable a declaration's "
        "database_url names). Unset: BATCH_ASSETS_DATABASE_URL, else the embedded PostgreSQL where allowed.",
    )
    url_ref: str | None = Field(
        default=None,
        description="The declaration whose database_url was written as a value rather than {{ env.NAME }}: the "
        "value is kept in this process only, never in the resource's config.",
    )
    embedded: bool = Field(default=True, description="Whether no URL at all starts the embedded PostgreSQL.")
    pool_size: int = Field(default=0, description=f"Connections in the pool. 0 = {DEFAULT_POOL_SIZE}.")

    _engines: dict[int, sa.Engine] = PrivateAttr(default_factory=dict)
    _run_id: str | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._engines = {}
        # Every connection of a run carries its run id in application_name: the backends one run holds are
        # countable in pg_stat_activity (the connection budget, docs/production.md).
        self._run_id = context.run.run_id if context.run is not None else None

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.dispose()

    def resolved_url(self) -> str:
        if self.url:
            return normalize_url(self.url)
        if self.url_ref:
            return normalize_url(secret_url(self.url_ref))
        settings = load_settings()
        if settings.database_url is None and not self.embedded:
            raise ConfigError("no database: set the declaration's database_url (e.g. \"{{ env.APP_DATABASE_URL }}\") "
                              f"or {DATABASE_URL_VAR}", field="database_url")
        return resolve_database_url(settings)

    def get_engine(self, min_pool_size: int = 0) -> sa.Engine:
        """This process's engine; a second, larger pool only when a caller needs more connections."""
        base = self.pool_size or DEFAULT_POOL_SIZE
        size = max(base, min_pool_size)
        engine = self._engines.get(size)
        if engine is None:
            engine = self._engines[size] = create_engine(
                self.resolved_url(), pool_size=size, application_name=run_application_name(self._run_id))
        return engine

    @property
    def engine(self) -> sa.Engine:
        return self.get_engine()

    def dispose(self) -> None:
        for engine in self._engines.values():
            engine.dispose()
        self._engines = {}


class JobLockResource(dg.ConfigurableResource):
    """The job lock store: Redis when BATCH_ASSETS_REDIS_URL is set, else the PostgreSQL lock table."""

    redis_url: str | None = Field(
        default=None, description="Redis URL for the lock (EnvVar BATCH_ASSETS_REDIS_URL). Unset: PostgreSQL."
    )

    _locks: list[Any] = PrivateAttr(default_factory=list)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._locks = []

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        for lock in self._locks:
            close = getattr(lock, "close", None)
            if close is not None:
                close()
        self._locks = []

    def lock_for(self, engine: sa.Engine) -> JobLock:
        """A lock client on `engine` (or Redis), closed at teardown."""
        lock = make_job_lock(engine, self.redis_url)
        self._locks.append(lock)
        return lock


class AlertsResource(dg.ConfigurableResource):
    """Where alerts go: an error log entry, plus a JSON POST to BATCH_ASSETS_ALERT_WEBHOOK when it is set (its value
    reaches the resource only through EnvVar and is never logged). Payloads hold ids, names and counts only."""

    webhook: str | None = Field(
        default=None, description="Alert webhook URL (EnvVar BATCH_ASSETS_ALERT_WEBHOOK). Unset: log entries only.",
    )

    def send(self, text: str, payload: Mapping[str, Any]) -> bool:
        """Log the alert; POST it when a webhook is set. Returns whether a POST succeeded."""
        return send_alert(text, payload, self.webhook or None)


class CalendarResource(dg.ConfigurableResource):
    """The run date's calendar: the time zone of the default run date (BATCH_ASSETS_TIMEZONE), with which an op
    fixes "today" once per run, and how far from that day a run date may lie (BATCH_ASSETS_RUN_DATE_WINDOW_DAYS)."""

    timezone: str = Field(default="UTC", description="IANA time zone (EnvVar BATCH_ASSETS_TIMEZONE). Default UTC.")
    run_date_window_days: int = Field(
        default=DEFAULT_RUN_DATE_WINDOW_DAYS,
        description="A run date further than this many days from today needs allow_distant_run_date "
        f"(EnvVar BATCH_ASSETS_RUN_DATE_WINDOW_DAYS). Default {DEFAULT_RUN_DATE_WINDOW_DAYS}.",
    )

    def today(self) -> date:
        """Today in the time zone; an unknown zone is a ConfigError naming BATCH_ASSETS_TIMEZONE."""
        return today_in(self.timezone)

    def check_run_date(self, settings: object) -> None:
        """A dated job's run date within this calendar's window of today (unless allow_distant_run_date): a
        ConfigError naming run_date; settings without a run date pass."""
        check_run_date(settings, window_days=self.run_date_window_days, timezone=self.timezone)


class CheckpointsResource(dg.ConfigurableResource):
    """Low-watermark checkpoints (ba_checkpoints), one per sweep, mode and cursor range."""

    def store(self, engine: sa.Engine) -> CheckpointStore:
        return CheckpointStore(engine)


_SECRET_URLS: dict[str, str] = {}
"""Database URLs a declaration wrote as values, by the declaration's name: kept in the process that loaded the
declaration (every process of a run loads the code location again), never in a resource's config."""


def keep_secret_url(ref: str, url: str) -> None:
    _SECRET_URLS[ref] = url


def secret_url(ref: str) -> str:
    try:
        return _SECRET_URLS[ref]
    except KeyError:
        raise ConfigError(f"the database_url of {ref!r} is not loaded in this process", field="database_url") from None


def env_if_set(name: str) -> Any:
    """`dg.EnvVar(name)` when the variable is set, else None (a resource field's "unset" default).

    Only the *presence* is read here, never the value: the value is resolved by Dagster through EnvVar when
    the resource is initialised (and shown in the UI by name only)."""
    return dg.EnvVar(name) if os.environ.get(name, "").strip() else None


_env = env_if_set


def default_resources() -> dict[str, Any]:
    """The resources of the code location, keyed by the op parameter names."""
    return {
        "database": DatabaseResource(url=_env(DATABASE_URL_VAR)),
        "job_lock": JobLockResource(redis_url=_env(REDIS_URL_VAR)),
        "checkpoints": CheckpointsResource(),
        "alerts": AlertsResource(webhook=_env(ALERT_WEBHOOK_VAR)),
        "calendar": CalendarResource(**{
            **({"timezone": _env(TIMEZONE_VAR)} if _env(TIMEZONE_VAR) else {}),
            # checked by load_settings (1..36500, ASCII digits) when the code location or the CLI starts
            **({"run_date_window_days": dg.EnvVar.int(RUN_DATE_WINDOW_VAR)} if _env(RUN_DATE_WINDOW_VAR) else {}),
        }),
    }
