"""What both components share: the database a declaration names, its schedules, its asset keys, the resources it
builds for itself, and its Dagster definitions (the one route from a declaration to Dagster)."""

# No `from __future__ import annotations`: Dagster and pydantic read the annotations at runtime.

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import dagster as dg
import sqlalchemy as sa
from pydantic import field_validator

from batch_assets.errors import ConfigError, error_text
from batch_assets.orchestration.automation import schedule_status
from batch_assets.orchestration.defaults import TEAM, LocationDefaults
from batch_assets.orchestration.spec import JobSpec
from batch_assets.settings import DATABASE_URL_VAR

log = logging.getLogger(__name__)

ENV_TEMPLATE_RE = re.compile(
    r"\{\{\s*env(?:\.([A-Za-z_][A-Za-z0-9_]*)|\(\s*['\"]([A-Za-z_][A-Za-z0-9_]*)['\"]\s*\))\s*\}\}")
"""`{{ env.NAME }}` or `{{ env('NAME') }}`, alone: a database URL named by its variable."""
ASSET_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]*(?:/[A-Za-z0-9_][A-Za-z0-9_\-]*)*")


@dataclass(frozen=True)
class DatabaseUrl:
    """A declaration's `database_url`: the name of the variable that holds it (`{{ env.NAME }}`, resolved when a
    run starts), or its value. A secret either way: its repr and str never show a value."""

    env: str | None = None
    value: str | None = None

    def __repr__(self) -> str:
        return f"DatabaseUrl(env={self.env!r})" if self.env else "DatabaseUrl(<value hidden>)"

    __str__ = __repr__

    def resolve(self) -> str | None:
        """The URL now (None when its variable is unset)."""
        import os

        if self.env is not None:
            return os.environ.get(self.env) or None
        return self.value


def resolve_database_url(context: dg.ResolutionContext, raw: Any) -> DatabaseUrl | None:
    """`database_url` as written: `{{ env.NAME }}` is kept as the variable's name, so the value never reaches the
    resource's config (what the UI shows); any other text is resolved as a template and kept as a hidden value."""
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("database_url must be a SQLAlchemy URL or a {{ env.NAME }} template")
    match = ENV_TEMPLATE_RE.fullmatch(raw.strip())
    if match:
        return DatabaseUrl(env=match.group(1) or match.group(2))
    value = context.resolve_value(raw, as_type=str)
    if not isinstance(value, str) or not value.strip():
        raise ValueError("database_url resolved to an empty value")
    return DatabaseUrl(value=value.strip())


DATABASE_URL_RESOLVER = dg.Resolver(
    resolve_database_url, model_field_type=str | None, inject_before_resolve=False,
    description="SQLAlchemy URL of the database, e.g. \"{{ env.APP_DATABASE_URL }}\" (a secret: never printed). "
    f"Unset: {DATABASE_URL_VAR}.",
)


class Schedules(dg.Model):
    """When the sweep runs: cron expressions per mode, their time zone (default BATCH_ASSETS_TIMEZONE), and whether
    they start RUNNING in a team's project (default STOPPED there)."""

    delta: str | None = None
    full: str | None = None
    timezone: str | None = None
    status: Literal["RUNNING", "STOPPED"] | None = None

    @field_validator("delta", "full")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        from dagster._utils.schedules import is_valid_cron_string

        if value is not None and not is_valid_cron_string(value):
            raise ValueError(f"not a cron expression: {value!r}")
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        from batch_assets.run_dates import zone

        if value is not None:
            try:
                zone(value)
            except ConfigError:
                raise ValueError(f"unknown time zone {value!r}") from None
        return value


def checked_asset_key(value: str | None) -> str | None:
    """An asset key as Dagster writes one: path parts separated by '/'."""
    if value is not None and not ASSET_KEY_RE.fullmatch(value):
        raise ValueError(f"must be an asset key like analytics/loyalty_tier, got {value!r}")
    return value


def asset_key_of(value: str) -> dg.AssetKey:
    return dg.AssetKey(value.split("/"))


def schedule_default(status: str | None, defaults: LocationDefaults) -> dg.DefaultScheduleStatus | None:
    """The declaration's schedules' default status: its own `status`, else STOPPED in a team's project; None in this
    repository's location (the code location's automation setting decides)."""
    if status is not None:
        return dg.DefaultScheduleStatus.RUNNING if status == "RUNNING" else dg.DefaultScheduleStatus.STOPPED
    return None if defaults.automation_from_environment else dg.DefaultScheduleStatus.STOPPED


def database_resource(name: str, url: DatabaseUrl | None, defaults: LocationDefaults) -> Any:
    """The declaration's own database resource; with neither `database_url` nor BATCH_ASSETS_DATABASE_URL in a
    team's project, a ConfigError naming `database_url` (never an embedded server there)."""
    from batch_assets.orchestration.resources import DatabaseResource, env_if_set, keep_secret_url

    if url is not None and url.env is not None:
        return DatabaseResource(url=dg.EnvVar(url.env), embedded=defaults.embedded_fallback)
    if url is not None and url.value is not None:
        keep_secret_url(name, url.value)
        return DatabaseResource(url_ref=name, embedded=defaults.embedded_fallback)
    fallback = env_if_set(DATABASE_URL_VAR)
    if fallback is None and not defaults.embedded_fallback:
        raise ConfigError(f"no database: set database_url (e.g. \"{{{{ env.APP_DATABASE_URL }}}}\") or "
                          f"{DATABASE_URL_VAR}", field="database_url")
    return DatabaseResource(url=fallback, embedded=defaults.embedded_fallback)


def own_resources(name: str, url: DatabaseUrl | None, defaults: LocationDefaults) -> dict[str, Any]:
    """The resources a declaration's jobs use, under keys of its own (`<name>__database`, ...)."""
    from batch_assets.orchestration.resources import default_resources

    shared = default_resources()
    return {f"{name}__database": database_resource(name, url, defaults),
            f"{name}__job_lock": shared["job_lock"], f"{name}__checkpoints": shared["checkpoints"],
            f"{name}__calendar": shared["calendar"]}


def declared_url(url: DatabaseUrl | None, defaults: LocationDefaults) -> str | None:
    """The URL a declaration's jobs use now, checked (a ConfigError naming `database_url`): its own, else
    BATCH_ASSETS_DATABASE_URL; None where the location's embedded server is the fallback."""
    import os

    from batch_assets.db.engine import normalize_url

    if url is not None:
        value = url.resolve()
        if not value:
            raise ConfigError(f"the variable {url.env} that database_url names is not set", field="database_url")
        return normalize_url(value, field="database_url")
    value = os.environ.get(DATABASE_URL_VAR, "").strip()
    if value:
        return normalize_url(value)
    if defaults.embedded_fallback:
        return None
    raise ConfigError(f"no database: set database_url (e.g. \"{{{{ env.APP_DATABASE_URL }}}}\") or {DATABASE_URL_VAR}",
                      field="database_url")


def check_when_reachable(component: Any, url: str | None, folder: Path | None) -> None:
    """Check a declaration against its database when the database answers: one that cannot work fails the load with
    one line naming its file and the attribute; a database that is down never stops a code location from loading."""
    from batch_assets.orchestration.components.loader import from_config_error

    if url is None:
        return
    engine = reachable_engine(url)
    if engine is None:
        return
    try:
        component.check_database(engine)
    except ConfigError as exc:
        raise from_config_error((folder or Path.cwd()) / "defs.yaml", exc) from None
    finally:
        engine.dispose()


def url_getter(name: str, url: DatabaseUrl | None) -> Any:
    """The JobSpec's `database_url`: where the CLI finds this declaration's database (None: the location's)."""
    if url is None:
        return None

    def get() -> str:
        from batch_assets.db.engine import normalize_url

        value = url.resolve()
        if not value:
            raise ConfigError(f"the variable {url.env} that database_url names is not set", field="database_url")
        return normalize_url(value, field="database_url")

    return get


def reachable_engine(url: str) -> sa.Engine | None:
    """An engine on `url` when the database answers (within the connect timeout), else None (logged)."""
    from batch_assets.db.engine import create_engine

    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect():
            return engine
    except sa.exc.SQLAlchemyError as exc:
        engine.dispose()
        log.warning("declarations not checked against the database (not reachable now): %s", error_text(exc))
        return None


def definitions_of(specs: Sequence[JobSpec], *, resources: Mapping[str, Any] | None, timezone: str,
                   status: dg.DefaultScheduleStatus) -> dg.Definitions:
    """The Dagster definitions of a declaration's jobs: assets, checks, jobs, schedules and its own resources."""
    return dg.Definitions(
        assets=[a for spec in specs for a in spec.assets],
        asset_checks=[c for spec in specs for c in spec.asset_checks],
        jobs=[j for spec in specs for j in (*spec.op_jobs, *spec.asset_jobs)],
        schedules=[s for spec in specs if spec.schedules for s in spec.schedules(timezone, status)],
        resources=dict(resources or {}),
    )


def location_status() -> tuple[str, dg.DefaultScheduleStatus]:
    """The code location's time zone and the schedules' default status (BATCH_ASSETS_AUTOMATION)."""
    from batch_assets.settings import automation_enabled, load_settings

    return load_settings().timezone, schedule_status(automation_enabled())


def folder_of(context: Any) -> Path | None:
    """The folder of the declaration's defs.yaml (Dagster's load context gives it; None outside a project)."""
    path = getattr(context, "path", None)
    if path is None:
        return None
    path = Path(path)
    return path.parent if path.is_file() else path


class DeclaredComponent:
    """The Dagster definitions of a declaration component (a sweep's, a queue's), built one way: in a team's own
    project self-contained, with resources of its own and checked against the database whenever it answers (a
    declaration that cannot work fails the load naming the attribute; a database that is down never stops the code
    location from loading); in this repository's code location on the location's shared resources. The component
    gives `built_specs`, its jobs as `JobSpec`s."""

    if TYPE_CHECKING:
        name: str
        database_url: DatabaseUrl | None

        def built_specs(self, defaults: LocationDefaults, folder: Path | None) -> list[JobSpec]: ...

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """This declaration's definitions in a team's own project (Dagster calls it when loading defs.yaml)."""
        return self.definitions(TEAM, folder_of(context))

    def definitions(self, defaults: LocationDefaults, folder: Path | None) -> dg.Definitions:
        specs = self.built_specs(defaults, folder)
        resources = None
        if not defaults.shared_resources:
            resources = own_resources(self.name, self.database_url, defaults)
            check_when_reachable(self, declared_url(self.database_url, defaults), folder)
        timezone, status = location_status()
        return definitions_of(specs, resources=resources, timezone=timezone, status=status)
