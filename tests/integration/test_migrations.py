"""Migrations: idempotent, safe concurrently, and equal to the declared schema."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from batch_assets.db import schema
from batch_assets.db.engine import create_engine
from batch_assets.db.migrate import NEVER_SHIPPED, applied_versions, load_migrations, migrate

pytestmark = pytest.mark.integration


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


def _declared() -> dict[str, dict[str, object]]:
    reflected_names = {
        sa.Text: "TEXT", sa.Date: "DATE", sa.BigInteger: "BIGINT", sa.Integer: "INTEGER",
        sa.SmallInteger: "SMALLINT", sa.Double: "DOUBLE_PRECISION",
    }
    out: dict[str, dict[str, object]] = {}
    for table in schema.metadata.sorted_tables:
        cols = {}
        for c in table.columns:
            name = next((v for k, v in reflected_names.items() if type(c.type) is k), None)
            if name is None:
                name = {"UUID": "UUID", "BYTEA": "BYTEA", "JSONB": "JSONB", "DateTime": "TIMESTAMP"}[
                    type(c.type).__name__
                ]
            cols[c.name] = (name, c.nullable)
        out[table.name] = {
            "columns": cols,
            "indexes": sorted(i.name for i in table.indexes),
            "pk": [c.name for c in table.primary_key.columns],
        }
    return out


def test_migrations_twice_match_declared_schema(empty_db_url: str) -> None:
    """Applying the migrations twice is a no-op the second time and yields the declared schema."""
    engine = create_engine(empty_db_url, pool_size=2)
    try:
        first = migrate(engine)
        assert [m.version for m in first] == [m.version for m in load_migrations()]
        before = _described(engine)
        assert migrate(engine) == []
        assert _described(engine) == before
        assert applied_versions(engine) == [m.version for m in load_migrations()]
        assert before == _declared()
    finally:
        engine.dispose()


def test_concurrent_migrations_apply_each_file_once(empty_db_url: str) -> None:
    """Two processes migrating at once apply every file exactly once (advisory lock)."""
    engines = [create_engine(empty_db_url, pool_size=1) for _ in range(3)]
    results: list[list[int]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(engines))

    def run(engine: sa.Engine) -> None:
        try:
            barrier.wait(timeout=10)
            results.append([m.version for m in migrate(engine)])
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
    applied = sorted(v for r in results for v in r)
    assert applied == [m.version for m in load_migrations()]


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


def test_every_absent_number_is_a_documented_one() -> None:
    """Numbers only grow; one below the newest without a file is in NEVER_SHIPPED (with why), and only then."""
    versions = {m.version for m in load_migrations()}
    absent = set(range(1, max(versions) + 1)) - versions
    assert absent == set(NEVER_SHIPPED), f"undocumented gap(s) {sorted(absent - set(NEVER_SHIPPED))}"
    assert all(NEVER_SHIPPED.values())


def test_db_migrate_names_what_it_applied(cli_env: dict[str, str], empty_db_url: str) -> None:
    """`db migrate` on an empty database lists the files by name (`0004_ops`), not a bare list with a hole."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
    from _cli import ok, run_cli

    env = {**cli_env, "BATCH_ASSETS_DATABASE_URL": empty_db_url}
    result = run_cli(env, "db", "migrate")
    assert result.returncode == 0, result.describe()
    expected = [f"{m.version:04d}_{m.name}" for m in load_migrations()]
    assert result.summary is not None and result.summary["applied_names"] == expected
    assert [line.removeprefix("applied migration ") for line in result.stderr.splitlines()
            if line.startswith("applied migration ")] == expected
    assert ok(env, "db", "migrate")["applied_names"] == []
