"""What a database holds, read from the catalog and the tables, for comparing a database before and after a migration.

`catalog(conn)` describes every object of the `public` schema by name, with its definition as PostgreSQL prints it
back (so two objects made by different statements compare equal when PostgreSQL made the same thing);
`filenodes(conn)` is each table's, index's and sequence's storage file (a rewrite or a rebuild changes it);
`contents(conn)` is every row of every table and every sequence's position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

PREVIOUS_RELEASE = Path(__file__).resolve().parents[1] / "fixtures" / "previous_release"
"""The migration files of the previous release (one combined set, recorded in ba_schema_versions), verbatim."""

# The ledger of the previous release, verbatim from its batch_assets/db/migrate.py (VERSIONS_DDL).
PREVIOUS_LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS ba_schema_versions (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


def previous_release_files() -> list[tuple[int, str, str]]:
    """(version, name, sql) of each file of the previous release, in order."""
    found = []
    for path in sorted(PREVIOUS_RELEASE.glob("[0-9][0-9][0-9][0-9]_*.sql")):
        version, _, name = path.stem.partition("_")
        found.append((int(version), name, path.read_text(encoding="utf-8")))
    return found


def migrate_as_previous_release(engine: sa.Engine, *, up_to: int | None = None) -> list[int]:
    """Apply the previous release's files (those numbered up to `up_to`) as its `migrate` did: its ledger, then
    each file in a transaction of its own with its row in ba_schema_versions. Returns the versions applied."""
    applied = []
    with engine.connect() as conn:
        with conn.begin():
            conn.exec_driver_sql(PREVIOUS_LEDGER_DDL)
        for version, name, sql in previous_release_files():
            if up_to is not None and version > up_to:
                break
            with conn.begin():
                conn.exec_driver_sql(sql)
                conn.execute(sa.text("INSERT INTO ba_schema_versions (version, name) VALUES (:v, :n)"),
                             {"v": version, "n": name})
            applied.append(version)
    return applied


_SECTIONS: dict[str, str] = {
    "relations": """
        SELECT c.relname, c.relkind::text || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public'""",
    "columns": """
        SELECT c.relname || '.' || a.attname,
               format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
               || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm') AND a.attnum > 0 AND NOT a.attisdropped""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'""",
    "constraints": """
        SELECT c.relname || '.' || k.conname, pg_get_constraintdef(k.oid)
          FROM pg_constraint k
          JOIN pg_class c ON c.oid = k.conrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public'""",
    "triggers": """
        SELECT c.relname || '.' || t.tgname, pg_get_triggerdef(t.oid) || CASE WHEN t.tgenabled = 'D'
                                                                          THEN ' (disabled)' ELSE '' END
          FROM pg_trigger t
          JOIN pg_class c ON c.oid = t.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND NOT t.tgisinternal""",
    "functions": """
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')', pg_get_functiondef(p.oid)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'public'""",
    "schemas": """
        SELECT nspname, '' FROM pg_namespace
         WHERE nspname NOT IN ('information_schema', 'pg_catalog', 'pg_toast') AND nspname !~ '^pg_(toast_)?temp_'""",
}


def catalog(conn: sa.Connection) -> dict[str, dict[str, str]]:
    """Section (relations, columns, indexes, constraints, triggers, functions, schemas) → name → definition."""
    return {section: {str(name): str(definition) for name, definition in conn.exec_driver_sql(sql)}
            for section, sql in _SECTIONS.items()}


def filenodes(conn: sa.Connection) -> dict[str, int]:
    """Relation → its storage file: a table rewritten or an index built again gets a new one."""
    rows = conn.exec_driver_sql(
        "SELECT c.relname, pg_relation_filenode(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i', 'S')"
    )
    return {str(name): int(node) for name, node in rows}


def contents(conn: sa.Connection, columns: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Table → its rows, each as PostgreSQL's text of the row, sorted; sequence → (last_value, is_called).

    With `columns`, those tables are read in those columns only (a database before a migration added a column)."""
    out: dict[str, Any] = {}
    relations = conn.exec_driver_sql(
        "SELECT c.relname, c.relkind, array_agg(a.attname ORDER BY a.attnum) FILTER (WHERE a.attnum > 0) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'S') GROUP BY c.relname, c.relkind"
    ).all()
    for name, kind, attributes in relations:
        # Names come from the catalog (or the caller's catalog snapshot) and are quoted.
        if kind == "S":
            out[name] = tuple(conn.exec_driver_sql(f'SELECT last_value, is_called FROM "{name}"').one())
            continue
        listed = ", ".join(f'"{c}"' for c in (columns or {}).get(name, attributes))
        out[name] = sorted(conn.exec_driver_sql(f'SELECT ROW({listed})::text FROM "{name}"').scalars())  # noqa: S608
    return out


def table_columns(objects: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """Table → its columns, from a `catalog` snapshot."""
    found: dict[str, list[str]] = {}
    for qualified in objects["columns"]:
        table, _, column = qualified.partition(".")
        found.setdefault(table, []).append(column)
    return found


def missing_or_changed(before: dict[str, dict[str, str]], after: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Each object of `before` that `after` lacks or defines otherwise: {section: {name: (before, after)}}."""
    found: dict[str, Any] = {}
    for section, objects in before.items():
        for name, definition in objects.items():
            if after.get(section, {}).get(name) != definition:
                found.setdefault(section, {})[name] = (definition, after.get(section, {}).get(name))
    return found


def added(before: dict[str, dict[str, str]], after: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """The names of the objects `after` has and `before` has not, by section (sections with none left out)."""
    return {section: sorted(set(objects) - set(before.get(section, {})))
            for section, objects in after.items() if set(objects) - set(before.get(section, {}))}
