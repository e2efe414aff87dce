"""A row another service edits while the sweep writes it shows as `conflicts` in the Dagster output metadata of its
range op and of the summary, in the asset's materialization and in the run's summary (docs/reference/cli.md,
docs/reference/tables.md)."""

from __future__ import annotations

import threading
import uuid

import dagster as dg
import pytest
import sqlalchemy as sa
from helpers import wait_for

from batch_assets import run_history
from batch_assets.orchestration.launch import LaunchResult, launch_job
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.dagster import SweepConfig
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]


def _page_write_waits(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND query LIKE '%UPDATE customers AS c%'")).scalar())


def test_conflict_is_in_range_and_summary_metadata(dagster_env: Settings, engine: sa.Engine, cipher: DobCipher) -> None:
    """One row held, rewritten and committed by another connection while its page write waits: conflicts = 1 in the
    range op's output metadata, the summary op's, the customer_status materialization and run history."""
    ids = [uuid.UUID(int=(i + 1) << 120) for i in range(20)]  # spread over both halves of the key space
    with engine.begin() as conn:
        for i, cid in enumerate(ids):
            conn.exec_driver_sql("INSERT INTO customers (id, status, encrypted_dob) VALUES (%(id)s, 'ACTIVE', %(b)s)",
                                 {"id": cid, "b": cipher.encrypt_text(cid, f"19{60 + i}-05-06")})
    target = ids[0]
    launched: list[LaunchResult] = []
    config = SweepConfig(mode="full", run_date="2025-06-01", ranges=2, workers=1)
    with engine.connect() as writer:
        writer.begin()
        writer.exec_driver_sql("SELECT 1 FROM customers WHERE id = %(id)s FOR UPDATE", {"id": target})
        sweep = threading.Thread(
            target=lambda: launched.append(launch_job("customer_status_sweep_job", config, settings=dagster_env)))
        sweep.start()
        try:
            wait_for(lambda: _page_write_waits(engine) or not sweep.is_alive(), timeout=90,
                     what="the page write waiting on the held row")
            writer.exec_driver_sql("UPDATE customers SET encrypted_dob = %(b)s WHERE id = %(id)s",
                                   {"b": cipher.encrypt_text(target, "2011-11-11"), "id": target})
            writer.commit()
        finally:
            if writer.in_transaction():
                writer.rollback()
            sweep.join(timeout=120)
    [result] = launched
    assert result.dagster_status == "SUCCESS"
    assert (result.summary["changed"], result.summary["conflicts"]) == (19, 1)
    assert run_history.latest(engine, result.run_id)["conflicts"] == 1
    with dg.DagsterInstance.get() as instance:
        outputs = [e.dagster_event for e in instance.all_logs(result.run_id, of_type=dg.DagsterEventType.STEP_OUTPUT)]
        by_step = {e.step_key: e.step_output_data.metadata for e in outputs}
        ranges = {k: m["conflicts"].value for k, m in by_step.items() if k.startswith("sweep_range")}
        assert sorted(ranges.values()) == [0, 1], by_step.keys()
        assert by_step["summarise_sweep"]["conflicts"].value == 1
        event = instance.get_latest_materialization_event(dg.AssetKey("customer_status"))
        assert event.asset_materialization.metadata["conflicts"].value == 1
