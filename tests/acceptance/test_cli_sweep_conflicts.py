"""Acceptance: a row another service edits while `batch-assets sweep customer-status` works on it is counted in the
JSON's `conflicts` (docs/reference/cli.md, docs/reference/tables.md) and in run history, is not overwritten, and the
next delta computes it."""

from __future__ import annotations

import json
import uuid
from datetime import date

import pytest
import sqlalchemy as sa
from _cli import CliProcess, ok, oracle, rows, scalar, today_utc, wait_for

from batch_assets.reference.customer_status.crypto import DobCipher

pytestmark = pytest.mark.integration

RUN_DATE = today_utc()


def _page_write_waits(engine: sa.Engine) -> bool:
    """The sweep's page write is waiting for a row lock held by another transaction."""
    return bool(scalar(engine, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock' AND query LIKE '%UPDATE customers AS c%'"))


def test_json_counts_a_row_edited_while_the_sweep_writes_it(engine: sa.Engine, cipher: DobCipher, cli_env,
                                                             tmp_path) -> None:
    """Another service holds a row, rewrites its dob and commits while the page write waits: conflicts = 1 in the
    JSON and in ba_run_history, the row is left due, and the next delta computes it from the new dob."""
    dobs = {uuid.uuid4(): f"19{50 + i}-0{1 + i % 9}-1{i % 10}" for i in range(30)}
    with engine.begin() as conn:
        for cid, dob in dobs.items():
            conn.exec_driver_sql("INSERT INTO customers (id, status, encrypted_dob) VALUES (%(id)s, 'ACTIVE', %(b)s)",
                                 {"id": cid, "b": cipher.encrypt_text(cid, dob)})
    target = next(iter(dobs))
    args = ["sweep", "customer-status", "--mode", "full", "--run-date", RUN_DATE.isoformat(), "--workers", "1"]
    with engine.connect() as writer, CliProcess(cli_env, args, tmp_path / "cli") as sweep:
        writer.begin()
        writer.exec_driver_sql("SELECT 1 FROM customers WHERE id = %(id)s FOR UPDATE", {"id": target})
        wait_for(lambda: _page_write_waits(engine), timeout=90, what="the page write waiting on the row",
                 alive=sweep)
        writer.exec_driver_sql("UPDATE customers SET encrypted_dob = %(b)s WHERE id = %(id)s",
                               {"b": cipher.encrypt_text(target, "2012-12-12"), "id": target})
        writer.commit()
        result = sweep.wait(timeout=120)
    assert result.returncode == 0, result.describe()
    summary = result.summary
    assert summary is not None, result.describe()
    assert (summary["status"], summary["scanned"], summary["changed"], summary["conflicts"]) == (
        "SUCCESS", 30, 29, 1)
    [recorded] = [r.summary for r in rows(engine, "SELECT summary FROM ba_run_history WHERE run_id = :id",
                                          id=summary["run_id"]) if "range" not in r.summary]
    assert recorded["conflicts"] == 1
    assert rows(engine, "SELECT age_category, next_review_date FROM customers WHERE id = :id", id=target) == [
        (None, None)]
    assert scalar(engine, "SELECT count(*) FROM outbox_events WHERE aggregate_id = :id", id=target) == 0
    delta = ok(cli_env, "sweep", "customer-status", "--mode", "delta", "--run-date", RUN_DATE.isoformat())
    assert (delta["scanned"], delta["changed"], delta["conflicts"]) == (1, 1, 0)
    expected = oracle(date(2012, 12, 12), RUN_DATE)
    assert rows(engine, "SELECT age_category, next_review_date FROM customers WHERE id = :id", id=target) == [
        (expected.category, expected.next_review_date)]
    assert "2012-12-12" not in json.dumps(summary) + result.stderr
