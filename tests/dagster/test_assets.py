"""The sweep's assets: materialized by the same graph as the CLI's job, checks in the same run, and the
rules-changed sensor that keeps asking until one config-change sweep for the fingerprint succeeded."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from helpers import sensor_resources

from batch_assets import run_history
from batch_assets.definitions import defs as load_defs
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.dagster import SweepConfig, sweep_run_config
from batch_assets.reference.customer_status.rules import Rules
from batch_assets.reference.customer_status.rules_store import set_rules
from batch_assets.reference.customer_status.seed import seed_customers
from batch_assets.reference.customer_status.sensor import RULES_KEY_TAG, RulesSensorState
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

SWEEP_KEYS = ("customer_status", "review_triggers", "outbox_events")


def test_materializing_the_sweep_assets_runs_the_sweep_and_their_checks_in_one_run(
    dagster_env: Settings, engine: sa.Engine, seeded: int
) -> None:
    """customer_status_asset_job sweeps every row, materializes the three assets with numeric metadata and
    evaluates their checks inside the same run."""
    job = load_defs().resolve_job_def("customer_status_asset_job")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(
            run_config=sweep_run_config(SweepConfig(mode="full", run_date="2025-06-01", ranges=2)),
            instance=instance,
        )
        assert result.success
        materialized = {m.asset_key.to_user_string(): m for m in result.asset_materializations_for_node(
            "customer_status_sweep")}
        checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(SWEEP_KEYS) <= set(materialized)
    status = materialized["customer_status"].metadata
    assert status["scanned"].value == seeded and isinstance(status["scanned"].value, int)
    assert isinstance(status["rows_per_s"].value, float) and status["rows_per_s"].value > 0
    assert isinstance(status["duration_s"].value, float)
    assert {"failed", "changed", "unchanged"} <= set(status)
    assert "| age_category" in status["counts_by_category"].value  # a pandas-built table
    assert status["cursor_ranges"].value.count("\n") == 3  # header, rule, one row per range
    assert {"no_overdue_active_customers", "review_triggers_unique", "outbox_backlog"} <= set(checks)
    assert checks["review_triggers_unique"].passed
    backlog = checks["outbox_backlog"].metadata
    assert backlog["pending"].value == materialized["outbox_events"].metadata["events"].value
    assert run_history.latest(engine, result.run_id)["scanned"] == seeded


def _tick(instance: dg.DagsterInstance, cursor: str | None, db_url: str) -> dg.SensorResult:
    sensor = load_defs().resolve_sensor_def("rules_changed_sensor")
    resources = sensor_resources(db_url)
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
        return sensor.evaluate_tick(context)


def _run(instance: dg.DagsterInstance, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    job = load_defs().resolve_job_def("customer_status_asset_job")
    return job.execute_in_process(run_config=request.run_config, tags=request.tags, instance=instance)


def test_a_rules_change_swept_while_a_cli_sweep_holds_the_lock_ends_with_exactly_one_success(
    dagster_env: Settings, db_url: str, engine: sa.Engine, cipher: DobCipher, cli_env: dict[str, str],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first config-change run is SKIPPED (a CLI sweep holds the lock); the sensor requests it again until
    one run for the fingerprint succeeds, then never again."""
    monkeypatch.setattr("batch_assets.reference.customer_status.sensor.RULES_RETRY_BASE_S", 0.0)  # no backoff here
    seed_customers(engine, cipher, 60_000, run_date=date(2025, 6, 1), seed=21)
    out = (tmp_path / "cli.out").open("w")
    cli = subprocess.Popen(
        [sys.executable, "-m", "batch_assets.cli", "sweep", "customer-status", "--mode", "full",
         "--run-date", "2025-06-01", "--allow-distant-run-date", "--page-size", "100", "--workers", "1",
         "--ranges", "1"],
        env=cli_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _lock_held(engine):
            assert cli.poll() is None, (tmp_path / "cli.out").read_text()[-2000:]
            assert time.monotonic() < deadline, "the CLI sweep never took the lock"
            time.sleep(0.05)  # polling interval of a deadline loop
        with dg.instance_for_test() as instance:
            first = _tick(instance, None, db_url)
            assert first.run_requests == []  # default rules: nothing to sweep
            cursor = first.cursor
            rules = Rules.parse("MINOR=0,ADULT=21,SENIOR=67")
            set_rules(engine, rules)
            with engine.begin() as conn:  # set two minutes ago: past the sensor's debounce
                conn.execute(sa.text("UPDATE ba_rules SET created_at = created_at - interval '2 minutes'"))

            [request] = _tick(instance, cursor, db_url).run_requests
            assert request.tags[RULES_KEY_TAG] == rules.fingerprint and request.run_key == rules.fingerprint
            skipped = _run(instance, request)
            assert skipped.success  # Dagster counts a SKIPPED sweep a success ...
            assert run_history.latest(engine, skipped.run_id)["status"] == "SKIPPED"
            assert cli.poll() is None, "the CLI sweep ended before the skipped run: the test proves nothing"

            retry = _tick(instance, cursor, db_url)  # ... the sensor does not: it asks again
            [again] = retry.run_requests
            assert again.run_key == f"{rules.fingerprint}#2"
            cursor = retry.cursor or cursor

            assert cli.wait(timeout=300) == 0
            succeeded = _run(instance, again)
            assert run_history.latest(engine, succeeded.run_id)["status"] == "SUCCESS"

            done = _tick(instance, cursor, db_url)
            assert done.run_requests == [] and RulesSensorState.parse(done.cursor).swept == rules.fingerprint
            assert _tick(instance, done.cursor, db_url).run_requests == []
            runs = instance.get_runs(filters=dg.RunsFilter(tags={RULES_KEY_TAG: rules.fingerprint}))
            outcomes = sorted(run_history.latest(engine, r.run_id)["status"] for r in runs)
        assert outcomes == ["SKIPPED", "SUCCESS"]
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, 9)
            cli.wait(timeout=30)
        out.close()


def _lock_held(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.exec_driver_sql(
            "SELECT count(*) FROM ba_job_locks WHERE name = 'customer_status_sweep' AND lock_until > now()"
        ).scalar_one())
