"""Upgrading a database of the previous release (one combined set of migrations, recorded in ba_schema_versions) to
the two sets: every row and every object is kept, nothing is rewritten, and the result is the database a new
deployment gets (plus the old ledger, left as it was)."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import date
from pathlib import Path

import pytest
import sqlalchemy as sa
from db_catalog import (
    added,
    catalog,
    contents,
    filenodes,
    migrate_as_previous_release,
    missing_or_changed,
    previous_release_files,
    table_columns,
)

from batch_assets.db.engine import create_engine
from batch_assets.db.migrate import LIBRARY, migrate, pending_migrations
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.rules import DEFAULT_RULES
from batch_assets.reference.migrations import REFERENCE

pytestmark = pytest.mark.integration

BOTH = (LIBRARY, REFERENCE)
PREVIOUS_VERSIONS = [version for version, _, _ in previous_release_files()]
CUSTOMER = uuid.UUID("00000000-0000-4000-8000-000000000001")

# Rows for every table of the previous release, in the columns its first version already had; a table a version
# had not made yet is skipped. Values differ from the defaults where they can, so a changed default shows.
ROWS = {
    "customers": """
        INSERT INTO customers (id, status, encrypted_dob, age_category, next_review_date, updated_at, review_failure)
        VALUES ('00000000-0000-4000-8000-000000000001', 'ACTIVE', '\\x0102', 'ADULT', '2031-05-01',
                '2026-01-02 03:04:05+00', NULL),
               ('00000000-0000-4000-8000-000000000002', 'CLOSED', NULL, NULL, NULL, NULL, 'missing_data')""",
    "review_triggers": """
        INSERT INTO review_triggers (customer_id, from_category, to_category, effective_date, created_at)
        VALUES ('00000000-0000-4000-8000-000000000001', 'YOUNG_ADULT', 'ADULT', '2025-05-01', '2025-05-01 00:00+00')""",
    "outbox_events": """
        INSERT INTO outbox_events (aggregate_id, event_type, payload, status, created_at, sent_at)
        VALUES ('00000000-0000-4000-8000-000000000001', 'age_category_changed', '{"old": "YOUNG_ADULT"}', 'SENT',
                '2025-05-01 00:00+00', '2025-05-01 00:01+00'),
               ('00000000-0000-4000-8000-000000000002', 'age_category_changed', '{"old": null}', 'PENDING',
                '2025-06-01 00:00+00', NULL)""",
    "subscriptions": """
        INSERT INTO subscriptions (customer_id, expiry_date, status, retry_count, last_error)
        VALUES ('00000000-0000-4000-8000-000000000001', '2025-01-01', 'ACTIVE', 0, NULL),
               (NULL, '2024-01-01', 'FAILED', 2, 'boom')""",
    "enrollments": """
        INSERT INTO enrollments (subscription_id, course_id) SELECT id, id * 10 FROM subscriptions""",
    "payments": """
        INSERT INTO payments (id, amount_cents, status, attempts, next_attempt_at, claimed_until, last_error,
                              created_at, processed_at)
        VALUES ('00000000-0000-4000-8000-00000000000a', 1250, 'NEW', 0, '2026-01-01 00:00+00', NULL, NULL,
                '2026-01-01 00:00+00', NULL),
               ('00000000-0000-4000-8000-00000000000b', 999, 'FAILED', 5, '2026-01-01 00:00+00', NULL, 'declined',
                '2026-01-01 00:00+00', '2026-01-01 00:05+00'),
               ('00000000-0000-4000-8000-00000000000c', 5, 'PROCESSING', 1, '2026-01-01 00:00+00',
                '2026-01-01 00:10+00', NULL, '2026-01-01 00:00+00', NULL)""",
    "ba_rules": """
        INSERT INTO ba_rules (rules, fingerprint, created_at)
        VALUES (CAST(:rules AS jsonb), :fingerprint, '2025-01-01 00:00+00')""",
    "ba_job_locks": """
        INSERT INTO ba_job_locks (name, owner, locked_at, lock_until, min_until)
        VALUES ('subscription_expiry', 'host:1:abc', '2026-01-01 00:00+00', '2026-01-01 00:30+00',
                '2026-01-01 00:01+00')""",
    "ba_leases": """
        INSERT INTO ba_leases (name, owner, acquired_at, heartbeat_at, expires_at)
        VALUES ('customer_status_sweep', 'host:1:abc', '2026-01-01 00:00+00', '2026-01-01 00:00+00',
                '2026-01-01 00:02+00')""",
    "ba_checkpoints": """
        INSERT INTO ba_checkpoints (sweep, mode, range_key, cursor, rules_fingerprint, run_id, run_date, status,
                                    counters, updated_at)
        VALUES ('customer_status', 'full', '0', '{"id": "00000000-0000-4000-8000-000000000001"}', 'abc', 'run-1',
                '2026-01-01', 'DONE', '{"scanned": 2}', '2026-01-01 00:00+00')""",
    "ba_run_history": """
        INSERT INTO ba_run_history (run_id, job, mode, run_date, status, started_at, finished_at, summary)
        VALUES ('run-1', 'customer_status_sweep', 'full', '2026-01-01', 'SUCCESS', '2026-01-01 00:00+00',
                '2026-01-01 00:01+00', '{"changed": 1}')""",
    "ba_queue_state": """
        INSERT INTO ba_queue_state (queue, breaker, breaker_since, cooldown_s, failures_in_row, recorded_by,
                                    updated_at)
        VALUES ('payments', 'open', '2026-01-01 00:00+00', 30, 5, 'host:1', '2026-01-01 00:00+00')""",
    "ba_queue_rate": """
        INSERT INTO ba_queue_rate (queue, next_slot, updated_at)
        VALUES ('payments', '2026-01-01 00:00+00', '2026-01-01 00:00+00')""",
    "ba_queue_slots": """
        INSERT INTO ba_queue_slots (queue, slot, holder, lease_until)
        VALUES ('payments', 0, '00000000-0000-4000-8000-0000000000ff', '2026-01-01 00:00+00'),
               ('payments', 1, NULL, NULL)""",
}
# Values in the columns later versions added, where the version has them.
LATER_COLUMNS = {
    ("payments", "priority"): "UPDATE payments SET priority = 7 WHERE status = 'NEW'",
    ("outbox_events", "claimed_by"): "UPDATE outbox_events SET claimed_by = 'relay-1', claimed_until = "
                                     "'2025-06-01 00:05+00', attempts = 2 WHERE status = 'PENDING'",
    ("ba_checkpoints", "generation"): "UPDATE ba_checkpoints SET generation = 'g-1'",
}


def _fill(engine: sa.Engine) -> None:
    """A few rows in every table the database has (ba_schema_versions holds its own already)."""
    with engine.begin() as conn:
        for table, statement in ROWS.items():
            if conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": table}).scalar():
                conn.execute(sa.text(statement), {"rules": _rules_json(), "fingerprint": DEFAULT_RULES.fingerprint})
        for (table, column), statement in LATER_COLUMNS.items():
            has = conn.execute(sa.text("SELECT 1 FROM information_schema.columns WHERE table_schema = 'public' "
                                       "AND table_name = :t AND column_name = :c"), {"t": table, "c": column}).scalar()
            if has:
                conn.exec_driver_sql(statement)


def _rules_json() -> str:
    return json.dumps(DEFAULT_RULES.to_json())


def _expected_changes(version: int) -> set[tuple[str, str]]:
    """The objects of a database of `version` that the upgrade changes on purpose, so that every database ends like
    a new one: the partial copy of customers' key is dropped (the previous release's 0009), the payments' wake-up
    function notifies lapsed claims too (its 0006), and outbox_events gets fillfactor 50 (its 0008)."""
    changes = set()
    if version < 9:
        changes |= {("relations", "customers_active_id_idx"), ("indexes", "customers_active_id_idx")}
    if 2 <= version < 6:  # made by 0002
        changes.add(("functions", "payments_notify_due()"))
    if version < 8:
        changes.add(("relations", "outbox_events"))
    return changes


@pytest.mark.parametrize("version", PREVIOUS_VERSIONS, ids=lambda v: f"previous_release_at_{v:04d}")
def test_upgrade_keeps_every_row_and_object(version: int, empty_db_url: str, engine: sa.Engine) -> None:
    """A database of the previous release at `version`, with rows in every table, migrated to both sets: every row,
    table, column, index, constraint, trigger and function it had is still there, unchanged (but for the three
    changes that make it converge), no table or index is rewritten, the old ledger is kept, and the result is what
    a new database gets. A second migrate applies nothing."""
    old = create_engine(empty_db_url, pool_size=2)
    try:
        assert migrate_as_previous_release(old, up_to=version) == [v for v in PREVIOUS_VERSIONS if v <= version]
        _fill(old)
        with old.connect() as conn:
            before, nodes = catalog(conn), filenodes(conn)
            columns = table_columns(before)
            rows = contents(conn, columns)
        assert all(rows[t] for t in columns if before["relations"][t].startswith("r")), "a table without rows"

        applied = migrate(old, BOTH)
        assert [m.label for m in applied] == [m.label for s in BOTH for m in s.migrations()]
        with old.connect() as conn:
            after, after_nodes, after_rows = catalog(conn), filenodes(conn), contents(conn, columns)
            assert pending_migrations(conn, BOTH) == []
        changed = missing_or_changed(before, after)
        assert {(section, name) for section, names in changed.items() for name in names} == _expected_changes(version)
        assert {name: after_rows[name] for name in rows} == rows
        dropped = {name for section, name in _expected_changes(version) if section == "indexes"}
        assert {name: after_nodes.get(name) for name in nodes if name not in dropped} == {
            name: node for name, node in nodes.items() if name not in dropped}

        # The result is a new deployment's database, plus the old ledger.
        with engine.connect() as conn:
            fresh = catalog(conn)
        assert missing_or_changed(fresh, after) == {}
        assert added(fresh, after) == {
            "relations": ["ba_schema_versions", "ba_schema_versions_pkey"],
            "columns": ["ba_schema_versions.applied_at", "ba_schema_versions.name", "ba_schema_versions.version"],
            "indexes": ["ba_schema_versions_pkey"],
            "constraints": ["ba_schema_versions.ba_schema_versions_pkey"],
        }

        assert migrate(old, BOTH) == []
        with old.connect() as conn:
            assert catalog(conn) == after
            assert filenodes(conn) == after_nodes
    finally:
        old.dispose()


def test_upgrade_gives_columns_added_since_their_defaults(empty_db_url: str) -> None:
    """Upgrading a database of the previous release's first version gives the rows already there the defaults of the
    columns added since: priority 0, attempts 0, no claim, no generation."""
    old = create_engine(empty_db_url, pool_size=2)
    try:
        migrate_as_previous_release(old, up_to=1)
        _fill(old)
        migrate(old, BOTH)
        with old.connect() as conn:
            assert set(conn.exec_driver_sql("SELECT priority FROM payments").scalars()) == {0}
            assert set(conn.exec_driver_sql("SELECT (claimed_by, claimed_until, attempts)::text FROM outbox_events")
                       .scalars()) == {"(,,0)"}
            assert conn.exec_driver_sql("SELECT generation FROM ba_checkpoints").scalar_one() is None
    finally:
        old.dispose()


def test_a_job_on_a_database_of_the_previous_release_asks_for_db_migrate(
    cli_env: dict[str, str], empty_db_url: str, cipher: DobCipher
) -> None:
    """After an upgrade of the package, before `db migrate`: a job run is refused with one line saying to run
    `batch-assets db migrate`, and writes nothing; after `db migrate` the same job runs on the rows already there."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
    from _cli import EXIT_USAGE, ok, run_cli

    old = create_engine(empty_db_url, pool_size=2)
    try:
        migrate_as_previous_release(old)
        _fill(old)
        with old.begin() as conn:  # one customer due, with a date of birth the sweep can read
            conn.execute(sa.text("UPDATE customers SET encrypted_dob = :dob, next_review_date = NULL WHERE id = :id"),
                         {"dob": cipher.encrypt_text(CUSTOMER, "1960-02-03"), "id": CUSTOMER})
        with old.connect() as conn:
            rows = contents(conn)

        env = {**cli_env, "BATCH_ASSETS_DATABASE_URL": empty_db_url}
        args = ("sweep", "customer-status", "--mode", "delta", "--run-date", "2026-01-05")
        refused = run_cli(env, *args)
        assert refused.returncode == EXIT_USAGE, refused.describe()
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "run `batch-assets db migrate` first" in lines[0], refused.describe()
        assert "batch_assets/0001_library" in lines[0] and "reference/0001_tables" in lines[0], lines[0]
        with old.connect() as conn:
            assert contents(conn) == rows
            assert conn.execute(sa.text("SELECT to_regclass('ba_migrations')")).scalar() is None

        migrated = ok(env, "db", "migrate")
        assert migrated["applied"] == [m.label for s in (LIBRARY, REFERENCE) for m in s.migrations()]
        summary = ok(env, *args)
        assert summary["status"] == "SUCCESS" and summary["changed"] == 1, summary
        with old.connect() as conn:
            category, due = conn.execute(sa.text("SELECT age_category, next_review_date FROM customers WHERE id = :id"),
                                         {"id": CUSTOMER}).one()
            events = conn.exec_driver_sql("SELECT count(*) FROM outbox_events").scalar()
        assert (category, due) == ("SENIOR", date(9999, 12, 31)), (category, due)
        assert events == len(rows["outbox_events"]) + 1
    finally:
        old.dispose()
