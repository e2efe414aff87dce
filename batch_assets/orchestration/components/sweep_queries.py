# ruff: noqa: S608 — statements are built from quoted identifiers of catalog columns; every value is bound.
"""What a declared sweep asks of its database: `where` as a condition on its table, the columns `where` names that
the page write can fence, the cursor ranges of a full run and the rows still overdue."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from typing import Any

import sqlalchemy as sa

from batch_assets.engine.ranges import plan_ranges
from batch_assets.engine.table import Column, Table
from batch_assets.engine.table_statements import SweepTarget
from batch_assets.engine.where import parse_where
from batch_assets.errors import ConfigError, error_text


def check_where(conn: sa.Connection, table: Table, where: str) -> None:
    try:
        with conn.begin_nested():
            conn.execute(sa.text(f"EXPLAIN SELECT 1 FROM {table.relation} WHERE (\n{where}\n)"))  # noqa: S608
    except sa.exc.DBAPIError as exc:
        raise ConfigError(f"not a valid condition on {table.name}: {error_text(exc)}", field="where") from None


def where_columns(conn: sa.Connection, table: Table, where: str, read: set[str]) -> tuple[str, ...]:
    """The table's columns `where` names that are not read anyway, in the table's order: read with every page so the
    write fences them. A column whose type has no equality (point, xml, ...) cannot be fenced and is left out."""
    named = parse_where(where).columns
    fenced = []
    for name in table.columns:
        if name not in named or name in read:
            continue
        column = table.columns[name]
        if not column.is_json and not comparable(conn, table, column):
            continue
        fenced.append(name)
    return tuple(fenced)


def comparable(conn: sa.Connection, table: Table, column: Column) -> bool:
    """Whether the page write can compare the column's stored value with the value read (`IS NOT DISTINCT FROM`)."""
    try:
        with conn.begin_nested():
            conn.execute(sa.text(f"EXPLAIN SELECT 1 FROM {table.relation} "  # noqa: S608 — a catalog column, quoted
                                 f"WHERE {column.ident} IS NOT DISTINCT FROM {column.ident}"))
    except sa.exc.DBAPIError:
        return False
    return True


def range_planner(target: SweepTarget, where: str | None) -> Callable[[sa.Connection, int], list[Any]]:
    def planner(conn: sa.Connection, count: int) -> list[Any]:
        return plan_ranges(conn, table=target.table.name, schema=target.table.schema, key=target.key.name,
                           kind=target.kind, count=count, where=where)

    return planner


def overdue_counter(target: SweepTarget) -> Callable[[sa.Connection, date], int]:
    assert target.due is not None
    relation = target.table.relation
    where = f"(\n{target.where}\n) AND " if target.where else ""
    sql = sa.text(f"SELECT count(*) FROM {relation} WHERE {where}{target.due.ident} <= :run_date")  # noqa: S608

    def overdue(conn: sa.Connection, run_date: date) -> int:
        return int(conn.execute(sql, {"run_date": run_date}).scalar_one())

    return overdue
