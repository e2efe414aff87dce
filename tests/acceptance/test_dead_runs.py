"""Dead runs with real processes (docs/production/operations.md): kill -9 of a sweep's run worker, then the
watchdog's tick.

The killed process is the run worker of a CLI run (the in_process executor: the run's lock and lease
name it). Dagster alone leaves that run STARTED for ever; the watchdog fails it with the alert, the
`batch_assets/kind: sweep` limit stops counting it, and the next run resumes from the checkpoints.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from _cli import CliProcess, run_cli, scalar, seed_customers, summary_run_date, wait_for
from helpers import sensor_resources

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 60_000


def _tick(defs: dg.Definitions, name: str, instance: dg.DagsterInstance, db_url: str,
          cursor: str | None = None) -> dg.SensorResult:
    with dg.build_sensor_context(instance=instance, cursor=cursor,
                                 resources=sensor_resources(db_url)) as context:
        return defs.resolve_sensor_def(name).evaluate_tick(context)


def _sweeps_in_progress(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(
        tags={"batch_assets/kind": "sweep"},
        statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.CANCELING])))


def test_kill_9_of_the_run_worker_fails_the_run_with_the_alert_and_the_next_run_resumes(
    cli_env: dict[str, str], engine: sa.Engine, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """kill -9 mid-sweep: STARTED until the watchdog's tick, then FAILURE with the alert, lock and lease given
    back, no sweep counted in progress, and the next run resumes (SUCCESS, not SKIPPED)."""
    for name, value in cli_env.items():
        if name.startswith("BATCH_ASSETS_"):
            monkeypatch.setenv(name, value)
    home = Path(cli_env["BATCH_ASSETS_HOME"]) / "dagster_home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    run_date = summary_run_date(seed_customers(cli_env, ROWS, "--seed", "16"))
    args = ["sweep", "customer-status", "--mode", "full", "--run-date", run_date.isoformat(),
            "--page-size", "200", "--workers", "1"]
    with CliProcess(cli_env, args, tmp_path) as proc:
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM outbox_events") >= 2000, timeout=90,
                 what="the sweep to have written part of the table", alive=proc)
        proc.kill_group()  # kill -9 of the run worker (the CLI process and anything it started)
    assert proc.popen.returncode == -signal.SIGKILL

    from batch_assets.definitions import defs as load_defs

    defs = load_defs()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        [dead] = _sweeps_in_progress(instance)
        assert dead.status == dg.DagsterRunStatus.STARTED  # what Dagster alone leaves behind
        with caplog.at_level(logging.ERROR):
            assert "dead run(s) marked failed" in (_tick(defs, "dead_run_watchdog_sensor", instance, db_url)
                                                   .skip_message or "")
            failed = instance.get_run_by_id(dead.run_id)
            assert failed.status == dg.DagsterRunStatus.FAILURE
            assert _sweeps_in_progress(instance) == []  # the sweep limit no longer counts it: queued runs start
            # The failure event is what run_failure_alert_sensor reacts to on the daemon: its alert names the cause.
            [failure] = instance.get_records_for_run(dead.run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
            alert = defs.resolve_sensor_def("run_failure_alert_sensor")
            with dg.build_run_status_sensor_context(
                sensor_name=alert.name, dagster_event=failure.event_log_entry.dagster_event,
                dagster_instance=instance, dagster_run=failed, resources=sensor_resources(db_url)) as context:
                alert(context.for_run_failure())
        alerts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ALERT")]
        assert any(dead.run_id in a and "is dead" in a for a in alerts), alerts
    assert scalar(engine, "SELECT count(*) FROM ba_leases") == 0
    assert scalar(engine, "SELECT count(*) FROM ba_job_locks") == 0

    result = run_cli(cli_env, *args, timeout=180)
    summary = result.summary
    assert result.returncode == 0 and summary is not None, result.describe()
    assert summary["status"] == "SUCCESS" and summary["resumed_from"] is not None, summary
    assert summary["scanned"] < ROWS, summary
