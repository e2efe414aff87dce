"""The declared sweep in Dagster: its schedule's run request materializes the asset with its metadata and runs
its checks in the same run; a full run maps one step per cursor range (the same shape as the product's sweep)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "loyalty"


@pytest.fixture
def loaded(accounts: sa.Engine, db_url: str, key_text: str, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> dg.Definitions:
    folder = tmp_path / "defs"
    shutil.copytree(EXAMPLE, folder)
    for name in ("BATCH_ASSETS_REDIS_URL", "BATCH_ASSETS_ALERT_WEBHOOK", "BATCH_ASSETS_TIMEZONE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BATCH_ASSETS_DATABASE_URL", db_url)
    monkeypatch.setenv("BATCH_ASSETS_ENCRYPTION_KEY", key_text)
    monkeypatch.setenv("BATCH_ASSETS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.setenv("BATCH_ASSETS_RUN_DATE_WINDOW_DAYS", "36500")
    monkeypatch.setenv("BATCH_ASSETS_DEFS_DIR", str(folder))
    from batch_assets.definitions import defs as load_defs

    return load_defs()


ASSET_RUN = """
import json
from datetime import UTC, datetime
from types import SimpleNamespace

import dagster as dg
from batch_assets.definitions import defs
loaded = defs()
[schedule] = [s for s in loaded.schedules or [] if s.name == "loyalty_tier_delta_schedule"]
tick = datetime(2026, 11, 30, 23, 30, tzinfo=UTC)  # 00:30 on 1 December in Berlin
request = schedule._execution_fn(SimpleNamespace(scheduled_execution_time=tick))
with dg.instance_for_test() as instance:
    result = loaded.resolve_job_def("loyalty_tier_asset_job").execute_in_process(
        run_config=request.run_config, instance=instance)
    [materialized] = result.asset_materializations_for_node("loyalty_tier")
    print(json.dumps({
        "success": result.success, "run_key": request.run_key, "cron": schedule.cron_schedule,
        "timezone": schedule.execution_timezone,
        "metadata": {k: v.value for k, v in materialized.metadata.items()},
        "checks": {e.check_name: e.passed for e in result.get_asset_check_evaluations()}}, default=str))
"""


def test_the_delta_schedule_materializes_the_asset_and_runs_its_checks(loaded: dg.Definitions) -> None:
    """Run in a process of its own: the asset job's run, as the daemon would start it from the schedule's tick."""
    proc = subprocess.Popen([sys.executable, "-c", ASSET_RUN], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    run = json.loads(out.strip().splitlines()[-1])
    assert run["success"] and run["cron"] == "0 2 * * *" and run["timezone"] == "Europe/Berlin"
    assert run["run_key"] == "delta:2026-12-01", "the tick's date in the schedule's own time zone"
    metadata = run["metadata"]
    assert (metadata["scanned"], metadata["changed"], metadata["failed"]) == (1000, 999, 1)
    assert metadata["events"] == 999 and metadata["conflicts"] == 0
    assert "missing_points" in metadata["failed_by_type"] and isinstance(metadata["rows_per_s"], float)
    assert run["checks"] == {"loyalty_tier_rows_overdue": True, "loyalty_tier_failures_by_kind": True}


def test_a_full_run_maps_one_step_per_cursor_range(loaded: dg.Definitions, accounts: sa.Engine) -> None:
    job = loaded.resolve_job_def("loyalty_tier")
    config = {"ops": {"loyalty_tier__plan": {"config": {"mode": "full", "run_date": "2026-12-01", "ranges": 3}}},
              "execution": {"config": {"in_process": {}}}}
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(run_config=config, instance=instance)
        assert result.success
        steps = {e.step_key for e in result.all_events if e.is_step_success}
        [materialized] = [e.event_specific_data.materialization for e in result.all_events
                          if e.event_type_value == "ASSET_MATERIALIZATION"]
    ranges = [s for s in steps if s.startswith("loyalty_tier__sweep_range[")]
    assert len(ranges) == 3
    assert materialized.metadata["cursor_ranges"].value.count("\n") == 4  # header, rule, one row per range
    with accounts.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM accounts WHERE tier IS NOT NULL")).scalar_one() == 999
        locks = conn.execute(sa.text("SELECT count(*) FROM ba_job_locks WHERE name = 'loyalty_tier' "
                                     "AND lock_until > now()")).scalar()
    assert not locks, "the run gave its lock back"


def test_the_plan_op_holds_the_run_date_to_its_calendar_window(loaded: dg.Definitions, accounts: sa.Engine) -> None:
    """The environment allows 36,500 days; the run's calendar resource allows 30: a run on 2025-06-01 fails in the
    plan op naming run_date, with nothing written (the window is the calendar's, not an environment read)."""
    from helpers import job_with_resources

    from batch_assets.orchestration.resources import CalendarResource

    job = job_with_resources("loyalty_tier", calendar=CalendarResource(run_date_window_days=30))
    config = {"ops": {"loyalty_tier__plan": {"config": {"mode": "full", "run_date": "2025-06-01"}}}}
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(run_config=config, instance=instance, raise_on_error=False)
    assert not result.success
    failure = result.failure_data_for_node("loyalty_tier__plan")
    assert failure is not None and "run_date" in failure.error.message
    assert "more than 30 days from today" in failure.error.message
    with accounts.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM accounts WHERE tier IS NOT NULL")).scalar_one() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM ba_job_locks")).scalar_one() == 0
