"""`batch_assets.SweepComponent`: a team's own sweep, declared in a defs.yaml.

    type: batch_assets.SweepComponent
    attributes: {name, table, key, columns, where?, due?, compute, writes, sensitive?, event?, schedules?,
                 database_url?, asset_key?, source_asset_key?, call_timeout_s?}

The attributes are checked in two steps, each failure a ConfigError naming the attribute (exit 2):

* when the file is loaded (`SweepComponent` is a pydantic model, unknown attributes forbidden): the name, the
  lists (writes and sensitive among columns), the function (it must import: beside the defs.yaml first), the
  schedules and their time zone;
* against the database (`target(engine)`): the table and every column exist, the key is uuid, bigint or integer,
  unique and NOT NULL, `due` is a date column, `where` is a valid condition on the table. `jobs list|run` check it;
  so does loading the component in a team's project whenever the database answers.

`where` is SQL and is taken as written: it is no Dagster template (`{{ ... }}` is never rendered into it, so no
variable's value can reach SQL), and it must parse as one condition (`engine.where`). Every other string attribute
is a Dagster template. docs/reference/declarations.md says what a defs.yaml may do and what is refused.

`build_defs` is the one route to Dagster: the one sweep-job builder's graph asset over cursor ranges, its jobs,
schedules, checks and, in a team's project, the resources its jobs need.
"""

# No `from __future__ import annotations`: pydantic and Dagster read the annotations at runtime.

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any

import dagster as dg
import sqlalchemy as sa
from pydantic import Field, PrivateAttr, field_validator

from batch_assets.db.catalog import key_problem
from batch_assets.engine.table import KEY_TYPES, read_table, split_name
from batch_assets.engine.table_statements import Compute, SweepTarget
from batch_assets.engine.table_sweep import DeclaredSweep
from batch_assets.engine.where import parse_where
from batch_assets.errors import ConfigError
from batch_assets.names import checked_function, checked_name
from batch_assets.orchestration.components.common import (
    DATABASE_URL_RESOLVER,
    DatabaseUrl,
    DeclaredComponent,
    Schedules,
    asset_key_of,
    checked_asset_key,
    schedule_default,
    url_getter,
)
from batch_assets.orchestration.components.loader import as_written
from batch_assets.orchestration.components.scaffold import SweepScaffolder
from batch_assets.orchestration.components.sweep_queries import (
    check_where,
    overdue_counter,
    range_planner,
    where_columns,
)
from batch_assets.orchestration.defaults import REPOSITORY, LocationDefaults
from batch_assets.orchestration.spec import JobSpec
from batch_assets.orchestration.sweep_job.definition import DeltaFullSettings, FullSettings
from batch_assets.plugins import load_function
from batch_assets.settings_model import DEFAULT_CALL_TIMEOUT_S, MAX_CALL_TIMEOUT_S

IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
TABLE_RE = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_$]{0,62}\.)?[A-Za-z_][A-Za-z0-9_$]{0,62}")
EVENT_RE = re.compile(r"[a-z][a-z0-9_.]{0,60}")


def _identifiers(values: list[str], what: str) -> list[str]:
    for value in values:
        if not isinstance(value, str) or not IDENT_RE.fullmatch(value):
            raise ValueError(f"{what} must be column names, got {value!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{what} must not repeat a column")
    return values


WHERE_RESOLVER = dg.Resolver(
    as_written, model_field_type=str | None, inject_before_resolve=False,
    description="Optional SQL condition selecting the rows to read, e.g. \"status = 'OPEN'\". Taken as written (no "
    "template), run with the product's database role; one condition by PostgreSQL's grammar.",
)


def _page_size() -> Any:
    return Field(default=DeclaredSweep.max_page_size, ge=1, le=DeclaredSweep.max_page_size,
                 description=f"Rows per page (one page write carries at most {DeclaredSweep.max_page_size} rows).")


class DeclaredDeltaFullSettings(DeltaFullSettings):
    """A declared sweep with `due`: its page bound is its page write's."""

    page_size: int = _page_size()


class DeclaredFullSettings(FullSettings):
    """A declared sweep without `due`: its page bound is its page write's."""

    page_size: int = _page_size()


@dg.scaffold_with(SweepScaffolder)
class SweepComponent(DeclaredComponent, dg.Component, dg.Resolvable, dg.Model):
    """A declared sweep of a team's own table: one job and one asset named `name`."""

    name: str
    table: str
    key: str
    columns: list[str]
    compute: str
    writes: list[str]
    where: Annotated[str | None, WHERE_RESOLVER] = None
    due: str | None = None
    sensitive: list[str] = []
    event: str | None = None
    schedules: Schedules | None = None
    database_url: Annotated[DatabaseUrl | None, DATABASE_URL_RESOLVER] = None
    asset_key: str | None = None
    source_asset_key: str | None = None
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S

    _folder: Path | None = PrivateAttr(default=None)
    _built: dict[LocationDefaults, list[JobSpec]] = PrivateAttr(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return checked_name(value)

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        if not TABLE_RE.fullmatch(value):
            raise ValueError(f"must be [schema.]table, got {value!r}")
        return value

    @field_validator("key", "due")
    @classmethod
    def _column(cls, value: str | None) -> str | None:
        if value is not None and not IDENT_RE.fullmatch(value):
            raise ValueError(f"must be a column name, got {value!r}")
        return value

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("must name at least one column")
        return _identifiers(value, "columns")

    @field_validator("writes", "sensitive")
    @classmethod
    def _among_columns(cls, value: list[str], info: Any) -> list[str]:
        _identifiers(value, info.field_name)
        columns = info.data.get("columns") or []
        outside = [c for c in value if c not in columns]
        if outside:
            raise ValueError(f"{outside[0]!r} is not among columns")
        if info.field_name == "writes":
            if not value:
                raise ValueError("must name at least one column")
            if info.data.get("key") in value:
                raise ValueError("the key is never written")
        elif info.data.get("key") in value:
            raise ValueError(f"may not name the key {info.data['key']!r}: a row's key goes into its events, "
                             "checkpoints, cursor range bounds and the run's output, so a key is never sensitive")
        return value

    @field_validator("compute")
    @classmethod
    def _function(cls, value: str) -> str:
        return checked_function(value)

    @field_validator("where")
    @classmethod
    def _where(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_where(value)
            except ConfigError as exc:
                raise ValueError(str(exc).removeprefix("where: ")) from None
        return value

    @field_validator("event")
    @classmethod
    def _event(cls, value: str | None) -> str | None:
        if value is not None and not EVENT_RE.fullmatch(value):
            raise ValueError(f"must match [a-z][a-z0-9_.]{{0,60}}, got {value!r}")
        return value

    @field_validator("call_timeout_s")
    @classmethod
    def _call_timeout(cls, value: float) -> float:
        if not 0 < value <= MAX_CALL_TIMEOUT_S:
            raise ValueError(f"must be > 0 and <= {MAX_CALL_TIMEOUT_S:g} (seconds), got {value!r}")
        return value

    @field_validator("asset_key", "source_asset_key")
    @classmethod
    def _asset_key(cls, value: str | None) -> str | None:
        return checked_asset_key(value)

    def check_static(self) -> None:
        """What needs both the attributes and no database: a delta schedule needs `due`; the function imports."""
        if self.schedules is not None and self.schedules.delta is not None and self.due is None:
            raise ConfigError("a delta schedule needs `due` (delta selects the rows that are due)",
                              field="schedules.delta")
        self.function()

    # --- against the database ---------------------------------------------------------------------

    def located(self, folder: Path | None) -> "SweepComponent":
        """Where the defs.yaml is: `compute` is looked for beside it first."""
        if folder is not None:
            self._folder = folder
        return self

    def function(self) -> Compute:
        """The declared compute function: beside the defs.yaml first, then on the Python path."""
        return load_function(self.compute, field="compute", beside=self._folder)

    def target(self, engine: sa.Engine, outbox: str = REPOSITORY.outbox_table) -> SweepTarget:
        """The declaration checked against the database (ConfigError naming the attribute)."""
        compute = self.function()
        with engine.connect() as conn:
            table = read_table(conn, self.table)
            if table is None:
                raise ConfigError(f"no table {self.table!r} in the database", field="table")
            missing = [c for c in (self.key, *self.columns) if c not in table.columns]
            if self.key in missing:
                raise ConfigError(f"{self.table} has no column {self.key!r}", field="key")
            if missing:
                raise ConfigError(f"{self.table} has no column {missing[0]!r}", field="columns")
            key = table.columns[self.key]
            kind = KEY_TYPES.get(key.base_type)
            if kind is None:
                raise ConfigError(f"must be of type uuid, bigint or integer, got {key.sql_type}", field="key")
            problem = key_problem(conn, table.relation, self.key)
            if problem is not None:
                raise ConfigError(problem, field="key")
            due = None
            if self.due is not None:
                due = table.columns.get(self.due)
                if due is None:
                    raise ConfigError(f"{self.table} has no column {self.due!r}", field="due")
                if due.base_type != "date":
                    raise ConfigError(f"must be a date column, {self.due} is {due.sql_type}", field="due")
            fenced: tuple[str, ...] = ()
            if self.where is not None:
                check_where(conn, table, self.where)
                read = {self.key, *self.columns, *((self.due,) if self.due else ())}
                fenced = where_columns(conn, table, self.where, read)
        return SweepTarget(
            name=self.name, table=table, key=key, kind=kind, columns=tuple(self.columns), due=due,
            writes=tuple(self.writes), sensitive=frozenset(self.sensitive), where=self.where, event=self.event,
            compute=compute, outbox=outbox, where_columns=fenced, call_timeout_s=self.call_timeout_s,
        )

    def check_database(self, engine: sa.Engine) -> None:
        """What `jobs list` and `jobs run` check before anything runs (ConfigError naming the attribute)."""
        self.target(engine)

    def fingerprint(self) -> str:
        """What a checkpoint of this sweep must match: the declaration (a changed one starts over)."""
        # call_timeout_s bounds how long a row may take, not what it becomes: a changed one keeps the checkpoints.
        dump = self.model_dump(mode="json", exclude={"database_url", "call_timeout_s"})
        # Attributes added since the first release count only when set, so an unchanged declaration keeps its
        # fingerprint (and an interrupted run of it resumes) across the upgrade.
        for added in ("asset_key", "source_asset_key"):
            if dump.get(added) is None:
                dump.pop(added, None)
        if isinstance(dump.get("schedules"), dict) and dump["schedules"].get("status") is None:
            dump["schedules"].pop("status", None)
        text = json.dumps(dump, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # --- Dagster ----------------------------------------------------------------------------------

    def built_specs(self, defaults: LocationDefaults, folder: Path | None = None) -> list[JobSpec]:
        """The declared job for a code location with `defaults` (built once per location kind)."""
        self.located(folder)
        built = self._built.get(defaults)
        if built is None:
            built = self._built[defaults] = [self._build(defaults)]
        return built

    def _build(self, defaults: LocationDefaults) -> JobSpec:
        from batch_assets.orchestration.sweep_job import PrepareContext, Prepared, ResourceKeys, SweepJob, SweepSchedule
        from batch_assets.orchestration.sweep_job import build_sweep_job as build

        self.check_static()
        schema, table = split_name(self.table)

        def prepare(ctx: PrepareContext) -> Prepared:
            target = self.target(ctx.engine, defaults.outbox_table)
            return Prepared(
                definition=lambda mode, run_date: DeclaredSweep(target, mode, run_date),
                plan_ranges=range_planner(target, self.where),
                fingerprint=self.fingerprint(),
                overdue=overdue_counter(target) if target.due is not None else None,
            )

        schedules = self.schedules
        planned = tuple(SweepSchedule(mode, cron) for mode, cron in
                        (("delta", schedules.delta), ("full", schedules.full)) if cron is not None) \
            if schedules is not None else ()
        description = (f"Declared sweep of {self.table}: {self.compute} computes {', '.join(self.writes)}"
                       + (f" for rows due by {self.due}" if self.due else "") + ".")
        source = asset_key_of(self.source_asset_key) if self.source_asset_key else dg.AssetKey([schema, table])
        return build(SweepJob(
            name=self.name, description=description, prepare=prepare, source=source,
            modes=("delta", "full") if self.due is not None else ("full",),
            settings=DeclaredDeltaFullSettings if self.due is not None else DeclaredFullSettings,
            asset_key=asset_key_of(self.asset_key) if self.asset_key else None,
            # One spec per table, whatever sweeps read it: two sweeps over a table share its source asset. In a team's
            # project Dagster stamps each declaration's definitions with its origin, so two specs never match: there
            # the dependency alone makes the table's (external) asset, or the team's own asset of that key.
            source_asset=dg.AssetSpec(source, description=f"The table {self.table} (written by other services).",
                                      group_name="declared"),
            declare_source=defaults.shared_resources,
            keys=ResourceKeys() if defaults.shared_resources else ResourceKeys.prefixed(f"{self.name}__"),
            schedules=planned, timezone=schedules.timezone if schedules is not None else None,
            schedule_status=schedule_default(schedules.status if schedules is not None else None, defaults),
            database_url=url_getter(self.name, self.database_url),
        ))

