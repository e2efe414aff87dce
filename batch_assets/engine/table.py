"""What a declared job's table really is: its columns and their types, read from the database's catalog.

A declaration names columns; only columns that exist are ever put in a statement, and every name
that goes into SQL is a quoted identifier (`quote`) of a column found here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal

import sqlalchemy as sa

from batch_assets.engine.ranges import quote

COLUMNS_SQL = sa.text("""
SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS sql_type, t.typname AS base_type
  FROM pg_attribute AS a
  JOIN pg_type AS t ON t.oid = a.atttypid
 WHERE a.attrelid = CAST(:relation AS regclass) AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum
""")

TABLE_EXISTS_SQL = sa.text("""
SELECT 1 FROM information_schema.tables WHERE table_schema = :schema AND table_name = :table
""")

KEY_TYPES = {"uuid": "uuid", "int8": "bigint", "int4": "integer"}
"""pg_type.typname of a key column → its key kind (engine.ranges.KEY_SPACES)."""

_TEXT = frozenset({str})
_WHOLE = frozenset({int})
_NUMBER = frozenset({int, float, Decimal})
PYTHON_TYPES: dict[str, frozenset[type]] = {
    "text": _TEXT, "varchar": _TEXT, "bpchar": _TEXT, "citext": _TEXT, "name": _TEXT,
    "int2": _WHOLE, "int4": _WHOLE, "int8": _WHOLE,
    "numeric": _NUMBER, "float4": _NUMBER, "float8": _NUMBER,
    "bool": frozenset({bool}),
    "date": frozenset({date}),
    "timestamp": frozenset({datetime}), "timestamptz": frozenset({datetime}),
    "time": frozenset({time}), "timetz": frozenset({time}),
    "interval": frozenset({timedelta}),
    "uuid": frozenset({uuid.UUID}),
    "bytea": frozenset({bytes, bytearray, memoryview}),
}
"""pg_type.typname → the Python types (exactly: bool is no int, datetime no date) a value written to such a column
may have, so none is cast on the way in (an int stored as '7' in a text column). A type not listed here (json,
jsonb, arrays, enums, domains, ...) is left to PostgreSQL."""


@dataclass(frozen=True)
class Column:
    name: str
    sql_type: str
    """format_type(): the column's type as it is written in SQL, e.g. numeric(10,2), text, date."""
    base_type: str
    """pg_type.typname: int4, int8, uuid, date, json, jsonb, ..."""

    @property
    def ident(self) -> str:
        return quote(self.name)

    @property
    def is_json(self) -> bool:
        return self.base_type in ("json", "jsonb")

    @property
    def python_types(self) -> frozenset[type] | None:
        """The Python types a value written to this column may have (None: any, PostgreSQL decides)."""
        return PYTHON_TYPES.get(self.base_type)


@dataclass(frozen=True)
class Table:
    schema: str
    name: str
    columns: dict[str, Column]

    @property
    def relation(self) -> str:
        """The table as a quoted SQL name: "schema"."table"."""
        return f"{quote(self.schema)}.{quote(self.name)}"


def split_name(spec: str) -> tuple[str, str]:
    """`[schema.]table` → (schema, table); the schema defaults to public."""
    schema, dot, table = spec.rpartition(".")
    return (schema if dot else "public"), table


def read_table(conn: sa.Connection, spec: str) -> Table | None:
    """The table named `spec` with its columns, or None when there is no such table."""
    schema, name = split_name(spec)
    if conn.execute(TABLE_EXISTS_SQL, {"schema": schema, "table": name}).first() is None:
        return None
    relation = f"{quote(schema)}.{quote(name)}"
    rows = conn.execute(COLUMNS_SQL, {"relation": relation}).all()
    return Table(schema, name, {r.name: Column(r.name, r.sql_type, r.base_type) for r in rows})
