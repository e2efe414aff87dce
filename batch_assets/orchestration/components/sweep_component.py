"""`batch_assets.SweepComponent`: a team's own sweep, declared in a defs.yaml (CONTRACT §9).

    type: batch_assets.SweepComponent
    attributes: {name, table, key, columns, where?, due?, compute, writes, sensitive?, event?, schedules?}

The attributes are checked in two steps, each failure a ConfigError naming the attribute (exit 2):

* when the file is loaded (`SweepComponent` is a pydantic model, unknown attributes forbidden): the name, the
  lists (writes and sensitive among columns), the function's form, the schedules and their time zone;
* against the database (`target(engine)`): the table and every column exist, the key is uuid, bigint or
  integer and unique, `due` is a date column, `where` is a valid condition, the function can be imported.

`build_defs` gives the same shape as the customer-status sweep (orchestration.sweep_job): the graph asset over
cursor ranges, its job, schedules, checks, progress, metadata, lock, lease and checkpoints.
"""

# No `from __future__ import annotations`: pydantic and Dagster read the annotations at runtime.

import hashlib
import importlib
import json
import re
from collections.abc import Callable
from datetime import date
from typing import Any

import dagster as dg
import sqlalchemy as sa
from pydantic import field_validator

from batch_assets.engine.ranges import plan_ranges
from batch_assets.engine.table import KEY_TYPES, Table, has_unique_index, read_table, split_name
from batch_assets.engine.table_sweep import Compute, DeclaredSweep, SweepTarget
from batch_assets.errors import ConfigError, error_text
from batch_assets.orchestration.spec import JobSpec

NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,40}")
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
TABLE_RE = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_$]{0,62}\.)?[A-Za-z_][A-Za-z0-9_$]{0,62}")
FUNCTION_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
EVENT_RE = re.compile(r"[a-z][a-z0-9_.]{0,60}")


class Schedules(dg.Model):
    """When the sweep runs: cron expressions per mode and their time zone (default BATCH_ASSETS_TIMEZONE)."""

    delta: str | None = None
    full: str | None = None
    timezone: str | None = None

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


def _identifiers(values: list[str], what: str) -> list[str]:
    for value in values:
        if not isinstance(value, str) or not IDENT_RE.fullmatch(value):
            raise ValueError(f"{what} must be column names, got {value!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{what} must not repeat a column")
    return values


class SweepComponent(dg.Component, dg.Resolvable, dg.Model):
    """A declared sweep of a team's own table (CONTRACT §9): one job and one asset named `name`."""

    name: str
    table: str
    key: str
    columns: list[str]
    compute: str
    writes: list[str]
    where: str | None = None
    due: str | None = None
    sensitive: list[str] = []
    event: str | None = None
    schedules: Schedules | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise ValueError(f"must match [a-z][a-z0-9_]{{0,40}}, got {value!r}")
        return value

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
        return value

    @field_validator("compute")
    @classmethod
    def _function(cls, value: str) -> str:
        if not FUNCTION_RE.fullmatch(value):
            raise ValueError(f"must be module:function, got {value!r}")
        return value

    @field_validator("where")
    @classmethod
    def _where(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or ";" in value):
            raise ValueError("must be one SQL condition (no ';')")
        return value

    @field_validator("event")
    @classmethod
    def _event(cls, value: str | None) -> str | None:
        if value is not None and not EVENT_RE.fullmatch(value):
            raise ValueError(f"must match [a-z][a-z0-9_.]{{0,60}}, got {value!r}")
        return value

    def check_static(self) -> None:
        """What needs both the attributes and no database: a delta schedule needs `due`."""
        if self.schedules is not None and self.schedules.delta is not None and self.due is None:
            raise ConfigError("a delta schedule needs `due` (delta selects the rows that are due)",
                              field="schedules.delta")

    # --- against the database ---------------------------------------------------------------------

    def function(self) -> Compute:
        """The declared compute function, imported (the defs folder is first on sys.path)."""
        module_name, _, attribute = self.compute.partition(":")
        try:
            module = importlib.import_module(module_name)
            function = getattr(module, attribute)
        except Exception as exc:  # noqa: BLE001 — any import failure of the team's module is this one error
            raise ConfigError(f"{self.compute} cannot be imported: {error_text(exc)}", field="compute") from None
        if not callable(function):
            raise ConfigError(f"{self.compute} is not a function", field="compute")
        return function

    def target(self, engine: sa.Engine) -> SweepTarget:
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
            if not has_unique_index(conn, table, self.key):
                raise ConfigError(f"{self.key} must be unique and indexed (a primary key or a unique index)",
                                  field="key")
            due = None
            if self.due is not None:
                due = table.columns.get(self.due)
                if due is None:
                    raise ConfigError(f"{self.table} has no column {self.due!r}", field="due")
                if due.base_type != "date":
                    raise ConfigError(f"must be a date column, {self.due} is {due.sql_type}", field="due")
            if self.where is not None:
                _check_where(conn, table, self.where)
        return SweepTarget(
            name=self.name, table=table, key=key, kind=kind, columns=tuple(self.columns), due=due,
            writes=tuple(self.writes), sensitive=frozenset(self.sensitive), where=self.where, event=self.event,
            compute=compute,
        )

    def check_database(self, engine: sa.Engine) -> None:
        """What `jobs list` and `jobs run` check before anything runs (ConfigError naming the attribute)."""
        self.target(engine)

    def fingerprint(self) -> str:
        """What a checkpoint of this sweep must match: the declaration (a changed one starts over)."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # --- Dagster ----------------------------------------------------------------------------------

    def job_specs(self) -> list[JobSpec]:
        """The declared job (the registry adds it to the product's)."""
        from batch_assets.orchestration.sweep_job import Prepared, SweepJob, build_sweep_job

        self.check_static()
        schema, table = split_name(self.table)

        def prepare(engine: sa.Engine) -> Prepared:
            target = self.target(engine)
            return Prepared(
                definition=lambda mode, run_date: DeclaredSweep(target, mode, run_date),
                plan_ranges=_range_planner(target, self.where),
                fingerprint=self.fingerprint(),
                overdue=_overdue_counter(target) if target.due is not None else None,
            )

        modes = ("delta", "full") if self.due is not None else ("full",)
        schedules = {m: c for m, c in (("delta", self.schedules.delta), ("full", self.schedules.full))
                     if c is not None} if self.schedules is not None else {}
        description = (f"Declared sweep of {self.table}: {self.compute} computes {', '.join(self.writes)}"
                       + (f" for rows due by {self.due}" if self.due else "") + ".")
        return [build_sweep_job(SweepJob(
            name=self.name, description=description, modes=modes, prepare=prepare,
            source=dg.AssetKey([schema, table]), schedules=schedules,
            timezone=self.schedules.timezone if self.schedules is not None else None,
        ))]

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from batch_assets.orchestration.sweep_job import definitions_of

        return definitions_of(self.job_specs())


def _check_where(conn: sa.Connection, table: Table, where: str) -> None:
    try:
        with conn.begin_nested():
            conn.execute(sa.text(f"EXPLAIN SELECT 1 FROM {table.relation} WHERE (\n{where}\n)"))  # noqa: S608
    except sa.exc.DBAPIError as exc:
        raise ConfigError(f"not a valid condition on {table.name}: {error_text(exc)}", field="where") from None


def _range_planner(target: SweepTarget, where: str | None) -> Callable[[sa.Connection, int], list[Any]]:
    def planner(conn: sa.Connection, count: int) -> list[Any]:
        return plan_ranges(conn, table=target.table.name, schema=target.table.schema, key=target.key.name,
                           kind=target.kind, count=count, where=where)

    return planner


def _overdue_counter(target: SweepTarget) -> Callable[[sa.Connection, date], int]:
    assert target.due is not None
    relation = target.table.relation
    where = f"(\n{target.where}\n) AND " if target.where else ""
    sql = sa.text(f"SELECT count(*) FROM {relation} WHERE {where}{target.due.ident} <= :run_date")  # noqa: S608

    def overdue(conn: sa.Connection, run_date: date) -> int:
        return int(conn.execute(sql, {"run_date": run_date}).scalar_one())

    return overdue
