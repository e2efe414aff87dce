"""The application database's Dagster pool with real processes.

Every step that works on the application database takes a slot of `batch_assets_app_db` (budget.APP_DATABASE_POOL)
while it runs. Here the pool's limit is set to 1 on the test's instance (SQLite storage, the CLI's own), and a
sweep's range is held on its first page write by a gate (a statement trigger that waits while a row of
`ba_test_gate` exists), so it keeps its slot for as long as the test wants:

- a second run's step waits for the slot (Dagster's pending step and its "blocked" event), the CLI says so on
  stderr, and the two runs' pool steps never overlap;
- a run holding the slot is killed -9: once the watchdog marks it failed its slot is free, and the next run's step
  gets one at once (no "blocked" event), not after the daemon's free_slots_after_run_end_seconds.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest
import sqlalchemy as sa
import yaml
from _cli import CliProcess, execute, run_cli, seed_customers, summary_run_date, wait_for
from helpers import sensor_resources

from batch_assets.engine.settings import SweepSettings
from batch_assets.orchestration.budget import APP_DATABASE_POOL, pool_limit
from batch_assets.orchestration.instance_home import TEMPLATES, instance_template
from batch_assets.orchestration.watchdog import waiting_for_slot

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 2_000
POOL_STEPS = ("sweep_range", "expire_subscriptions")
"""The ops of the two jobs used here that are in the pool."""
# The gate: while ba_test_gate has a row, every page write of the sweep waits (a new snapshot per loop: the
# test's DELETE is seen at once).
GATE = """
CREATE TABLE ba_test_gate (held int);
INSERT INTO ba_test_gate VALUES (1);
CREATE FUNCTION ba_test_gated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  WHILE EXISTS (SELECT 1 FROM ba_test_gate) LOOP PERFORM pg_sleep(0.05); END LOOP;
  RETURN NULL;
END $$;
CREATE TRIGGER ba_test_gated AFTER UPDATE ON customers FOR EACH STATEMENT EXECUTE FUNCTION ba_test_gated();
"""
BLOCKED = "Step blocked by limit for pool"


def _sweep_args(run_date: str) -> list[str]:
    # One range (its one step holds the slot), and a page timeout far above the gate's hold.
    return ["jobs", "run", "customer_status_sweep_job", "--set", "mode=full", "--set", f"run_date={run_date}",
            "--set", "ranges=1", "--set", "page_timeout_s=600", "--set", "page_size=200"]


def _instance_with_limit_1(cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """DAGSTER_HOME of the CLI runs (written by the seed), its pool limited to 1 slot; this process points at it."""
    home = Path(cli_env["BATCH_ASSETS_HOME"]) / "dagster_home"
    assert (home / "dagster.yaml").exists()
    for name, value in cli_env.items():
        if name.startswith("BATCH_ASSETS_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.event_log_storage.supports_global_concurrency_limits
        instance.event_log_storage.set_concurrency_slots(APP_DATABASE_POOL, 1)
    return home


def _holders(instance: dg.DagsterInstance) -> set[str]:
    return instance.event_log_storage.get_concurrency_info(APP_DATABASE_POOL).active_run_ids


def _run_of(instance: dg.DagsterInstance, job_name: str) -> dg.DagsterRun | None:
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=job_name), limit=1)
    return runs[0] if runs else None


def _pool_steps(instance: dg.DagsterInstance, run_id: str) -> list[tuple[float, float, str]]:
    """(start, end, step key) of the run's steps in the pool, from its own events."""
    started: dict[str, float] = {}
    spans = []
    for record in instance.get_records_for_run(run_id, limit=10_000).records:
        entry = record.event_log_entry
        event = entry.dagster_event
        if event is None or not (entry.step_key or "").startswith(POOL_STEPS):
            continue
        if event.is_step_start:
            started[entry.step_key] = entry.timestamp
        elif event.is_step_success or event.is_step_failure:
            spans.append((started[entry.step_key], entry.timestamp, entry.step_key))
    return spans


def _cpu_s(process: psutil.Process) -> float:
    """CPU seconds (user + system) a process has used so far."""
    times = process.cpu_times()
    return times.user + times.system


def _blocked_events(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT, limit=1000).records
    return [r.event_log_entry.user_message for r in records if BLOCKED in (r.event_log_entry.user_message or "")]


def test_instance_files_put_the_pool_limit_from_the_budget() -> None:
    """Both instance files limit the pool by the budget's arithmetic (10 at the defaults) at op granularity, and
    tell the daemon to free a finished run's slots."""
    for name in TEMPLATES:
        config = yaml.safe_load(instance_template(name))
        assert config["concurrency"]["pools"] == {"default_limit": pool_limit(SweepSettings()), "granularity": "op"}
        assert config["run_monitoring"]["free_slots_after_run_end_seconds"] > 0
    assert pool_limit(SweepSettings()) == 10


def test_a_step_waits_for_the_slot_and_the_runs_pool_steps_do_not_overlap(
    cli_env: dict[str, str], engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Limit 1: the expiry's step waits while the sweep's range holds the slot (pending step, "blocked" event, a
    line on the CLI's stderr), starts once the range ended, and both runs succeed."""
    run_date = summary_run_date(seed_customers(cli_env, ROWS, "--seed", "16")).isoformat()
    home = _instance_with_limit_1(cli_env, monkeypatch)
    with engine.begin() as conn:
        conn.exec_driver_sql(GATE)
    with dg.DagsterInstance.from_config(str(home)) as instance, \
            CliProcess(cli_env, _sweep_args(run_date), tmp_path) as sweep:
        wait_for(lambda: _holders(instance), timeout=120, what="the sweep's range to hold the slot", alive=sweep)
        [sweep_run_id] = _holders(instance)
        with CliProcess(cli_env, ["subscriptions", "expire"], tmp_path) as expiry:
            expiry_run = wait_for(lambda: _run_of(instance, "subscription_expiry_job"), timeout=120,
                                  what="the expiry's run", alive=expiry)
            wait_for(lambda: waiting_for_slot(instance, expiry_run.run_id), timeout=60,
                     what="the expiry's step to wait for the slot", alive=expiry)
            waiter = psutil.Process(expiry.pid)
            cpu_before, wall_before = _cpu_s(waiter), time.monotonic()
            wait_for(lambda: "waiting" in expiry.output() and APP_DATABASE_POOL in expiry.output(), timeout=60,
                     what="the CLI's line saying the step waits", alive=expiry)
            assert _holders(instance) == {sweep_run_id} and sweep.running()
            # Waiting costs no core: Dagster 1.13's executor spun at 100% of one here, its sleep interval never
            # above 0 (executors.sleep_while_a_step_waits_for_a_slot).
            waited_s = time.monotonic() - wall_before
            assert _cpu_s(waiter) - cpu_before < 0.25 * waited_s + 0.2, (_cpu_s(waiter) - cpu_before, waited_s)
            execute(engine, "DELETE FROM ba_test_gate")  # the range goes on, ends and frees the slot
            expiry_result = expiry.wait(timeout=180)
        sweep_result = sweep.wait(timeout=180)
    assert sweep_result.returncode == 0 and sweep_result.summary["status"] == "SUCCESS", sweep_result.describe()
    assert expiry_result.returncode == 0 and expiry_result.summary["status"] == "SUCCESS", expiry_result.describe()
    assert "waiting" in expiry_result.stderr and "no longer waiting" in expiry_result.stderr, expiry_result.stderr
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert _blocked_events(instance, expiry_run.run_id), "Dagster recorded no wait of the expiry's step"
        spans = sorted(_pool_steps(instance, sweep_run_id) + _pool_steps(instance, expiry_run.run_id))
        assert {key for _, _, key in spans} == {"sweep_range[r000_of_001]", "expire_subscriptions"}, spans
        for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
            assert end <= start, f"{first} and {second} held the pool's one slot at the same time: {spans}"
        assert _holders(instance) == set()


def test_a_killed_run_frees_its_slot_when_the_watchdog_marks_it_failed(
    cli_env: dict[str, str], engine: sa.Engine, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kill -9 of a CLI run holding the pool's one slot: Dagster alone leaves the slot held; the watchdog's tick marks
    the run failed and frees it, and the next run's step gets the slot at once (no "blocked" event)."""
    from batch_assets.definitions import defs as load_defs

    run_date = summary_run_date(seed_customers(cli_env, ROWS, "--seed", "17")).isoformat()
    home = _instance_with_limit_1(cli_env, monkeypatch)
    with engine.begin() as conn:
        conn.exec_driver_sql(GATE)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        with CliProcess(cli_env, _sweep_args(run_date), tmp_path) as sweep:
            wait_for(lambda: _holders(instance), timeout=120, what="the sweep's range to hold the slot", alive=sweep)
            sweep.kill_group()  # kill -9 of the CLI process, the run worker of its in-process run
        assert sweep.popen.returncode == -signal.SIGKILL
        execute(engine, "DELETE FROM ba_test_gate")  # the killed run's backend may end its statement
        [dead_run_id] = _holders(instance)  # what Dagster alone leaves behind until the daemon's delay
        assert instance.get_run_by_id(dead_run_id).status == dg.DagsterRunStatus.STARTED
        sensor = load_defs().resolve_sensor_def("dead_run_watchdog_sensor")
        with dg.build_sensor_context(instance=instance, resources=sensor_resources(db_url)) as context:
            assert "1 dead run(s) marked failed" in (sensor.evaluate_tick(context).skip_message or "")
        assert instance.get_run_by_id(dead_run_id).status == dg.DagsterRunStatus.FAILURE
        assert _holders(instance) == set() and waiting_for_slot(instance, dead_run_id) == []

        result = run_cli(cli_env, "subscriptions", "expire", timeout=180)
        assert result.returncode == 0 and result.summary["status"] == "SUCCESS", result.describe()
        assert _blocked_events(instance, result.summary["run_id"]) == [], "the next run's step waited for a slot"
        assert _pool_steps(instance, result.summary["run_id"]), "the next run's step did not run in the pool"
