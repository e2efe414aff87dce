"""Migrations: two sets (the library's and the reference project's), idempotent, safe concurrently, each equal to
its declared schema, and the library's alone touching nothing of a team's."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from db_catalog import catalog, contents, filenodes

from batch_assets.db import schema as library_schema
from batch_assets.db.engine import create_engine
from batch_assets.db.migrate import (
    LIBRARY,
    MigrationSet,
    applied_versions,
    migrate,
    pending_migrations,
    require_migrated,
)
from batch_assets.errors import ConfigError
from batch_assets.reference import schema as reference_schema
from batch_assets.reference.migrations import REFERENCE

pytestmark = pytest.mark.integration

BOTH = (LIBRARY, REFERENCE)


def _labels(*sets: MigrationSet) -> list[str]:
    return [m.label for s in sets for m in s.migrations()]


def _described(engine: sa.Engine) -> dict[str, dict[str, object]]:
    insp = sa.inspect(engine)
    out: dict[str, dict[str, object]] = {}
    for table in insp.get_table_names():
        out[table] = {
            "columns": {c["name"]: (type(c["type"]).__name__, c["nullable"]) for c in insp.get_columns(table)},
            "indexes": sorted(i["name"] for i in insp.get_indexes(table)),
            "pk": insp.get_pk_constraint(table)["constrained_columns"],
        }
    return out


def _declared(*metadatas: sa.MetaData) -> dict[str, dict[str, object]]:
    reflected_names = {
        sa.Text: "TEXT", sa.Date: "DATE", sa.BigInteger: "BIGINT", sa.Integer: "INTEGER",
        sa.SmallInteger: "SMALLINT", sa.Double: "DOUBLE_PRECISION",
    }
    out: dict[str, dict[str, object]] = {}
    for metadata in metadatas:
        for table in metadata.sorted_tables:
            cols = {}
            for c in table.columns:
                name = next((v for k, v in reflected_names.items() if type(c.type) is k), None)
                if name is None:
                    name = {"UUID": "UUID", "BYTEA": "BYTEA", "JSONB": "JSONB", "DateTime": "TIMESTAMP"}[
                        type(c.type).__name__
                    ]
                cols[c.name] = (name, c.nullable)
            assert table.name not in out, f"{table.name} is declared twice"
            out[table.name] = {
                "columns": cols,
                "indexes": sorted(i.name for i in table.indexes),
                "pk": [c.name for c in table.primary_key.columns],
            }
    return out


def test_migrations_twice_match_declared_schema(empty_db_url: str) -> None:
    """Applying both sets twice is a no-op the second time and yields the declared schema of both."""
    engine = create_engine(empty_db_url, pool_size=2)
    try:
        first = migrate(engine, BOTH)
        assert [m.label for m in first] == _labels(LIBRARY, REFERENCE)
        before = _described(engine)
        with engine.connect() as conn:
            objects = catalog(conn)
        assert migrate(engine, BOTH) == []
        assert _described(engine) == before
        with engine.connect() as conn:
            assert catalog(conn) == objects
        assert applied_versions(engine, BOTH) == {s.name: [m.version for m in s.migrations()] for s in BOTH}
        assert before == _declared(library_schema.metadata, reference_schema.metadata)
    finally:
        engine.dispose()


def test_each_set_matches_its_schema_module(empty_db_url: str) -> None:
    """The library's set alone makes exactly the tables of db/schema.py; the reference set then adds exactly those
    of reference/schema.py. The library's set is applied first even when only the reference set is listed."""
    engine = create_engine(empty_db_url, pool_size=2)
    try:
        assert [m.label for m in migrate(engine, ())] == _labels(LIBRARY)
        assert _described(engine) == _declared(library_schema.metadata)
        assert all(t.startswith("ba_") for t in _described(engine))
        assert [m.label for m in migrate(engine, (REFERENCE,))] == _labels(REFERENCE)
        assert _described(engine) == _declared(library_schema.metadata, reference_schema.metadata)
    finally:
        engine.dispose()


def test_the_library_set_is_applied_first_whatever_the_order(empty_db_url: str) -> None:
    """`migrate(REFERENCE, LIBRARY)` still applies the library's files first; a second set named like the library's
    is refused before anything is written."""
    engine = create_engine(empty_db_url, pool_size=2)
    try:
        impostor = MigrationSet(LIBRARY.name, REFERENCE.package)
        with pytest.raises(ValueError, match="share a name"):
            migrate(engine, (impostor,))
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").scalar() == 0
        assert [m.migration_set for m in migrate(engine, (REFERENCE, LIBRARY))] == ["batch_assets", "reference"]
    finally:
        engine.dispose()


# A team's own tables, named like the reference project's, of another shape and with rows, an index, a trigger,
# a function and a view of the team's.
TEAM_TABLES = """
CREATE TABLE customers (customer_no bigint PRIMARY KEY, full_name text NOT NULL, tier int);
CREATE INDEX customers_name_idx ON customers (full_name);
CREATE TABLE payments (ref text PRIMARY KEY, cents numeric(12, 2), state char(1) DEFAULT 'N',
                       customer_no bigint REFERENCES customers);
CREATE TABLE outbox_events (event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), topic text, body jsonb);
CREATE FUNCTION team_touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.state := 'T'; RETURN NEW; END $$;
CREATE TRIGGER payments_touched BEFORE UPDATE ON payments FOR EACH ROW EXECUTE FUNCTION team_touch();
CREATE VIEW payment_totals AS SELECT customer_no, sum(cents) AS total FROM payments GROUP BY customer_no;
INSERT INTO customers VALUES (1, 'Ada', 3), (2, 'Grace', NULL);
INSERT INTO payments VALUES ('p-1', 12.50, 'N', 1), ('p-2', 99.99, 'D', 2);
INSERT INTO outbox_events (topic, body) VALUES ('order_placed', '{"order": 7}'), ('order_shipped', '{}');
"""


def test_the_library_set_alone_touches_nothing_of_the_teams(empty_db_url: str) -> None:
    """In a database of a team's own, with tables named customers, payments and outbox_events of another shape, the
    library's set makes only ba_* tables and functions and leaves every object and row of the team's as it was."""
    engine = create_engine(empty_db_url, pool_size=2)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(TEAM_TABLES)
        with engine.connect() as conn:
            objects, nodes, rows = catalog(conn), filenodes(conn), contents(conn)
        assert [m.label for m in migrate(engine, ())] == _labels(LIBRARY)
        assert migrate(engine, ()) == []
        with engine.connect() as conn:
            after, after_nodes, after_rows = catalog(conn), filenodes(conn), contents(conn)
            assert pending_migrations(conn, ()) == []
            assert [m.label for m in pending_migrations(conn, (REFERENCE,))] == _labels(REFERENCE)
        for section, found in after.items():
            assert {name: d for name, d in found.items() if name in objects[section]} == objects[section], section
        assert {name: n for name, n in after_nodes.items() if name in nodes} == nodes
        assert {name: r for name, r in after_rows.items() if name in rows} == rows
        new_tables = {n for n, d in after["relations"].items() if d.startswith("r")} - set(objects["relations"])
        assert new_tables == {t.name for t in library_schema.metadata.sorted_tables}
        assert all(name.startswith("ba_") for name in new_tables)
        assert all(name.startswith("ba_") for name in set(after["functions"]) - set(objects["functions"]))
        assert all(name.startswith("ba_") for name in set(after["relations"]) - set(objects["relations"]))
        assert set(after["schemas"]) == set(objects["schemas"])
        require_migrated(engine, ())
        with pytest.raises(ConfigError, match=r"database: migrations pending \(reference/0001_tables\): run "
                                              r"`batch-assets db migrate` first"):
            require_migrated(engine, (REFERENCE,))
    finally:
        engine.dispose()


def test_concurrent_migrations_apply_each_file_once(empty_db_url: str) -> None:
    """Three processes migrating at once apply every file exactly once (advisory lock)."""
    engines = [create_engine(empty_db_url, pool_size=1) for _ in range(3)]
    results: list[list[str]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(engines))

    def run(engine: sa.Engine) -> None:
        try:
            barrier.wait(timeout=10)
            results.append([m.label for m in migrate(engine, BOTH)])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for e in engines:
        e.dispose()
    assert not errors
    assert sorted(label for r in results for label in r) == sorted(_labels(LIBRARY, REFERENCE))


def test_dob_write_clears_next_review_date(engine: sa.Engine) -> None:
    """Writing encrypted_dob clears next_review_date in the same statement (trigger)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO customers (id, status, encrypted_dob, age_category, next_review_date) "
                "VALUES (gen_random_uuid(), 'ACTIVE', '\\x00', 'ADULT', '2030-01-01')"
            )
        )
        conn.execute(sa.text("UPDATE customers SET age_category = 'SENIOR'"))
        assert conn.execute(sa.text("SELECT next_review_date FROM customers")).scalar() is not None
        conn.execute(sa.text("UPDATE customers SET encrypted_dob = '\\x01'"))
        assert conn.execute(sa.text("SELECT next_review_date FROM customers")).scalar() is None


@pytest.mark.parametrize("migration_set", BOTH, ids=lambda s: s.name)
def test_every_set_is_numbered_from_one_without_a_gap(migration_set: MigrationSet) -> None:
    """Each set's numbers start at 1 and only grow by one: a file added later gets the next number."""
    versions = [m.version for m in migration_set.migrations()]
    assert versions == list(range(1, len(versions) + 1))


def test_db_migrate_names_what_it_applied(cli_env: dict[str, str], empty_db_url: str) -> None:
    """`db migrate` on an empty database lists the files by set and name (`reference/0001_tables`), on stderr and
    in its JSON; run again it applies nothing and lists what the database has had."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
    from _cli import ok, run_cli

    env = {**cli_env, "BATCH_ASSETS_DATABASE_URL": empty_db_url}
    result = run_cli(env, "db", "migrate")
    assert result.returncode == 0, result.describe()
    expected = _labels(LIBRARY, REFERENCE)
    summary = result.summary
    assert summary is not None and summary["applied_names"] == summary["applied"] == expected
    assert summary["schema_versions"] == expected
    assert summary["sets"] == {"batch_assets": [1], "reference": [1]}
    assert summary["queues"] == ["payments"]
    assert [line.removeprefix("applied migration ") for line in result.stderr.splitlines()
            if line.startswith("applied migration ")] == expected
    again = ok(env, "db", "migrate")
    assert again["applied_names"] == again["applied"] == []
    assert again["schema_versions"] == expected


def test_db_migrate_in_a_teams_project_makes_only_the_librarys_objects(
    cli_env: dict[str, str], empty_db_url: str, tmp_path: Path
) -> None:
    """`batch-assets db migrate` run in a team's own Dagster project (its pyproject.toml names its code location),
    on a database with tables of the team's named customers, payments and outbox_events: only the library's set is
    applied, and every object and row of the team's is as it was."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
    from _cli import cli_command

    (tmp_path / "pyproject.toml").write_text('[tool.dagster]\nmodule_name = "team_defs"\n')
    (tmp_path / "team_defs.py").write_text("import dagster as dg\n\ndefs = dg.Definitions()\n")
    engine = create_engine(empty_db_url, pool_size=2)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(TEAM_TABLES)
        with engine.connect() as conn:
            objects, rows = catalog(conn), contents(conn)
        env = {**cli_env, "BATCH_ASSETS_DATABASE_URL": empty_db_url}
        result = subprocess.run(cli_command("db", "migrate"), env=env, cwd=tmp_path, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["applied"] == _labels(LIBRARY) and summary["sets"] == {"batch_assets": [1]}, summary
        with engine.connect() as conn:
            after, after_rows = catalog(conn), contents(conn)
        for section, found in after.items():
            assert {name: d for name, d in found.items() if name in objects[section]} == objects[section], section
        assert {name: r for name, r in after_rows.items() if name in rows} == rows
        assert all(name.startswith("ba_") for name in set(after["relations"]) - set(objects["relations"]))
    finally:
        engine.dispose()
