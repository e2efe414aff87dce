# ruff: noqa: S608 — statements are built from quoted identifiers of catalog columns; every value is bound.
"""A declared sweep's target (its declaration checked against the catalog) and its five statements: the full and
delta reads (first page and after a cursor) and the page write, built once per sweep from quoted catalog columns.

`where` is in the reads only; the write is fenced by the values read (see `table_sweep`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

import sqlalchemy as sa

from batch_assets.engine.ranges import quote
from batch_assets.engine.table import Column, Table

Compute = Callable[[Mapping[str, Any], date], Mapping[str, Any]]


@dataclass(frozen=True)
class SweepTarget:
    """A declaration checked against the database: everything a DeclaredSweep needs."""

    name: str
    table: Table
    key: Column
    kind: str
    """The key's type: uuid, bigint or integer (engine.ranges.KEY_SPACES)."""
    columns: tuple[str, ...]
    due: Column | None
    writes: tuple[str, ...]
    sensitive: frozenset[str]
    where: str | None
    event: str | None
    compute: Compute
    outbox: str = "outbox_events"
    """The outbox table its events go to (this repository's, or the library's own in a team's project)."""
    call_timeout_s: float | None = None
    """The longest one `compute` call may take (s); None: not bounded."""
    where_columns: tuple[str, ...] = ()
    """The table's columns `where` names (those with an equality): read with every page so the write fences them."""

    @property
    def modes(self) -> tuple[str, ...]:
        return ("delta", "full") if self.due is not None else ("full",)


def _array_type(column: Column) -> str:
    return "text[]" if column.is_json else f"{column.sql_type}[]"


def _as_stored(column: Column, ref: str) -> str:
    """`ref` (a value of the write arrays) as a value of the column."""
    return f"CAST({ref} AS {column.sql_type})" if column.is_json else ref


def _same(column: Column, stored: str, read: str) -> str:
    """SQL: the stored value is still the value read (json compared as jsonb)."""
    if column.is_json:
        return f"CAST({stored} AS jsonb) IS NOT DISTINCT FROM CAST({read} AS jsonb)"
    return f"{stored} IS NOT DISTINCT FROM {read}"


def statements(target: SweepTarget, read: tuple[Column, ...], by_due: bool) -> dict[str, sa.TextClause]:
    """The five statements of a declared sweep (read: full first/after, delta first/after; the page write)."""
    relation = target.table.relation
    key = f"{relation}.{target.key.ident}"
    select = ", ".join(f"{relation}.{c.ident}" for c in read)
    where = f"(\n{target.where}\n) AND " if target.where else ""
    sql = {
        "full_first": f"SELECT {select} FROM {relation} WHERE {where}{key} >= :lo AND {key} <= :hi "
                      f"ORDER BY {key} LIMIT :limit",
        "full_after": f"SELECT {select} FROM {relation} WHERE {where}{key} > :after AND {key} <= :hi "
                      f"ORDER BY {key} LIMIT :limit",
    }
    if target.due is not None:
        due = f"coalesce({relation}.{target.due.ident}, '-infinity'::date)"
        if by_due:
            sql["delta_first"] = (f"SELECT {select} FROM {relation} WHERE {where}{due} <= :run_date "
                                  f"ORDER BY {due}, {key} LIMIT :limit")
            sql["delta_after"] = (f"SELECT {select} FROM {relation} WHERE {where}{due} <= :run_date "
                                  f"AND ({due}, {key}) > (CAST(:after_date AS date), :after) "
                                  f"ORDER BY {due}, {key} LIMIT :limit")
        else:
            sql["delta_first"] = (f"SELECT {select} FROM {relation} WHERE {where}{due} <= :run_date "
                                  f"ORDER BY {key} LIMIT :limit")
            sql["delta_after"] = (f"SELECT {select} FROM {relation} WHERE {where}{due} <= :run_date "
                                  f"AND {key} > :after ORDER BY {key} LIMIT :limit")
    sql["write"] = write_statement(target, read)
    return {name: sa.text(text) for name, text in sql.items()}


def write_statement(target: SweepTarget, read: tuple[Column, ...]) -> str:
    relation = target.table.relation
    columns = target.table.columns
    arrays = [f"CAST(:k AS {target.kind}[])"]
    names = ["__ba_k"]
    for i, column in enumerate(read[1:], start=1):
        arrays.append(f"CAST(:o{i} AS {_array_type(column)})")
        names.append(f"__ba_o{i}")
    for j, name in enumerate(target.writes):
        arrays.append(f"CAST(:n{j} AS {_array_type(columns[name])})")
        names.append(f"__ba_n{j}")
    assignments = ", ".join(f"{columns[name].ident} = {_as_stored(columns[name], f'__ba_v.__ba_n{j}')}"
                            for j, name in enumerate(target.writes))
    still = " AND ".join(
        _same(column, f"{relation}.{column.ident}", f"__ba_v.__ba_o{i}") for i, column in enumerate(read[1:], start=1)
    )
    position = {c.name: i for i, c in enumerate(read)}
    returned = ", ".join(
        [f"{relation}.{target.key.ident} AS __ba_k"]
        + [f"__ba_v.__ba_o{position[name]} AS __ba_old{j}, __ba_v.__ba_n{j} AS __ba_new{j}"
           for j, name in enumerate(target.writes)]
    )
    statement = f"""
WITH __ba_v AS (
    SELECT * FROM unnest({', '.join(arrays)}) AS __ba_v({', '.join(names)})
), __ba_updated AS (
    UPDATE {relation} SET {assignments}
      FROM __ba_v
     WHERE {relation}.{target.key.ident} = __ba_v.__ba_k{' AND ' + still if still else ''}
    RETURNING {returned}
)"""
    events = "0"
    if target.event:
        shown = [(j, name) for j, name in enumerate(target.writes) if name not in target.sensitive]
        old = ", ".join(f"{_literal(name)}, {_as_stored(columns[name], f'u.__ba_old{j}')}" for j, name in shown)
        new = ", ".join(f"{_literal(name)}, {_as_stored(columns[name], f'u.__ba_new{j}')}" for j, name in shown)
        aggregate = "u.__ba_k" if target.kind == "uuid" else \
            f"CAST(md5({_literal(target.table.schema + '.' + target.table.name + ':')} || u.__ba_k) AS uuid)"
        statement += f""", __ba_events AS (
    INSERT INTO {quote(target.outbox)} (aggregate_id, event_type, payload)
    SELECT {aggregate}, {_literal(target.event)},
           jsonb_build_object('table', {_literal(target.table.name)}, 'key', u.__ba_k,
                              'old', jsonb_build_object({old}), 'new', jsonb_build_object({new}))
      FROM __ba_updated AS u
    RETURNING 1
)"""
        events = "(SELECT count(*) FROM __ba_events)"
    statement += f"""
SELECT (SELECT count(*) FROM __ba_updated), {events},
       (SELECT count(*) FROM __ba_v) - (SELECT count(*) FROM __ba_updated)
"""
    return statement


def _literal(text: str) -> str:
    """A SQL string literal of a checked name (names are [a-z0-9_.]; quotes are doubled all the same)."""
    return "'" + text.replace("'", "''") + "'"
