"""A run's outcome is the Dagster run's own and every range's, never only what the ops managed to record."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from batch_assets.orchestration.launch import StepOutcomes, launch_job, reconcile
from batch_assets.orchestration.sweep_job import ops as sweep_ops
from batch_assets.reference.customer_status.dagster import SweepConfig
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]


def _uncomputed(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT count(*) FROM customers WHERE status = 'ACTIVE' AND next_review_date IS NULL").scalar_one()


def test_a_range_that_crashed_makes_the_run_failure_and_names_the_range(
    dagster_env: Settings, engine: sa.Engine, seeded: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One of three ranges raises (recording nothing): FAILURE, resumable, the range named, the run id kept."""
    real = sweep_ops.run_sweep

    def crash_in_the_middle_range(*args, **kwargs):
        if str(kwargs["cursor_range"].lo).startswith("55555555"):
            raise RuntimeError("simulated crash of one range")
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_ops, "run_sweep", crash_in_the_middle_range)
    result = launch_job(
        "customer_status_sweep_job", SweepConfig(mode="full", run_date="2025-06-01", ranges=3, page_size=200),
        settings=dagster_env,
    )
    summary = result.summary
    assert result.dagster_status == "FAILURE"
    assert summary["status"] == "FAILURE", summary
    assert summary["run_id"] == result.run_id
    assert summary["unfinished_ranges"] == ["r001_of_003"]
    assert summary["resumable"] is True
    assert "r001_of_003" in summary["error"]
    assert summary["scanned"] < seeded and _uncomputed(engine) > 0


def test_reconcile_trusts_the_dagster_status_over_a_success_summary() -> None:
    """Recorded SUCCESS + a FAILURE run with an unstarted range: FAILURE naming the range."""
    steps = StepOutcomes(("plan_sweep", "sweep_range[r000_of_002]", "sweep_range[r001_of_002]"),
                         frozenset({"plan_sweep", "sweep_range[r000_of_002]"}), mapped_op="sweep_range")
    merged = reconcile({"status": "SUCCESS", "scanned": 10, "run_id": None}, run_id="abc",
                       dagster_status="FAILURE", steps=steps, error="boom")
    assert merged["status"] == "FAILURE" and merged["run_id"] == "abc"
    assert merged["unfinished_ranges"] == ["r001_of_002"] and merged["unfinished_steps"] == ["sweep_range[r001_of_002]"]
    assert merged["error"].startswith("boom") and merged["scanned"] == 10


def test_reconcile_keeps_success_and_skipped_of_a_successful_run() -> None:
    """A SUCCESS run whose every step succeeded keeps its recorded status (SUCCESS or SKIPPED)."""
    steps = StepOutcomes(("plan_sweep",), frozenset({"plan_sweep"}))
    for status in ("SUCCESS", "SKIPPED"):
        merged = reconcile({"status": status}, run_id="r", dagster_status="SUCCESS", steps=steps, error=None)
        assert merged["status"] == status and "unfinished_steps" not in merged


def test_reconcile_without_any_summary_is_failure_with_the_run_id() -> None:
    """No summary could be read (the database was away): FAILURE, with the run id and the reason."""
    merged = reconcile(None, run_id="r9", dagster_status="FAILURE", steps=StepOutcomes((), frozenset()),
                       error="the run's summary could not be read: OperationalError: x")
    assert merged["status"] == "FAILURE" and merged["run_id"] == "r9" and "could not be read" in merged["error"]


def test_a_database_gone_after_the_ranges_still_reports_the_run_with_its_id(
    dagster_env: Settings, engine: sa.Engine, admin_engine: sa.Engine, seeded: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database refuses connections once the range ran: FAILURE with the run id, never an unhandled error."""
    real = sweep_ops.run_sweep
    db = engine.url.database

    def sweep_then_database_gone(*args, **kwargs):
        result = real(*args, **kwargs)
        with admin_engine.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
            conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :db"),
                         {"db": db})
        return result

    monkeypatch.setattr(sweep_ops, "run_sweep", sweep_then_database_gone)
    try:
        result = launch_job("customer_status_sweep_job", SweepConfig(mode="delta", run_date="2025-06-01"),
                            settings=dagster_env)
    finally:
        with admin_engine.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
    assert result.summary["status"] == "FAILURE" and result.summary["run_id"] == result.run_id
    assert result.dagster_status == "FAILURE"
