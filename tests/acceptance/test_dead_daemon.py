"""Dead runs with real processes (docs/production/operations.md): kill -9 of dagster-daemon, its code server and a
sweep's run
worker together, the daemon restarted: the run is FAILURE within the bound with the alert, the sweep queued
behind it starts, and that run resumes from the checkpoints.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from _cli import REPO, run_cli, scalar, seed_customers, summary_run_date, wait_for
from helpers import AlertWebhook, kill_session

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 80_000
BOUND_S = 300  # operations (docs/production/operations.md): within 5 minutes


@contextmanager
def _daemon(env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`dagster-daemon run` in its own session (its code server and run workers join it), killed by group."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            kill_session(proc)


def _launch(env: dict[str, str], config: dict) -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "dagster"), "job", "launch", "-w", "workspace.yaml",
                           "-j", "customer_status_sweep_job", "--config-json", json.dumps(config)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_kill_9_of_daemon_code_server_and_run_worker(cli_env: dict[str, str], engine: sa.Engine,
                                                     tmp_path: Path) -> None:
    """The dead sweep is FAILURE within 5 min with the alert; the queued sweep then starts and resumes."""
    with AlertWebhook() as hook:
        home = tmp_path / "dagster_home"
        env = {**cli_env, "DAGSTER_HOME": str(home), "BATCH_ASSETS_AUTOMATION": "off",
               "BATCH_ASSETS_ALERT_WEBHOOK": hook.url}
        run_date = summary_run_date(seed_customers(env, ROWS, "--seed", "61"))  # also writes DAGSTER_HOME/dagster.yaml
        config = {"ops": {"plan_sweep": {"config": {"mode": "full", "run_date": run_date.isoformat(),
                                                    "page_size": 200, "workers": 1, "ranges": 2}}}}
        log_path = tmp_path / "daemon.log"
        # Create Dagster's storage once, before the daemon and `dagster job launch` start together: two
        # processes creating a fresh SQLite storage race in its schema migration (alembic CommandError).
        with dg.DagsterInstance.from_config(str(home)) as instance:
            instance.get_runs(limit=1)
        with _daemon(env, log_path) as first:
            _launch(env, config)
            _launch(env, config)  # queued behind the first: one sweep at a time
            wait_for(lambda: scalar(engine, "SELECT count(*) FROM outbox_events") >= 2000, timeout=180,
                     what="the first sweep to have written part of the table", interval=0.5)
            kill_session(first)  # kill -9: the daemon, its code server, the run worker and its step processes
        with dg.DagsterInstance.from_config(str(home)) as instance:
            runs = sorted(instance.get_runs(), key=lambda r: instance.get_run_record_by_id(r.run_id).create_timestamp)
            dead, queued = runs[0], runs[1]
            assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.STARTED
            assert instance.get_run_by_id(queued.run_id).status == dg.DagsterRunStatus.QUEUED
            with _daemon(env, log_path):
                wait_for(lambda: instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE,
                         timeout=BOUND_S, what="the dead run to be FAILURE", interval=1)
                wait_for(lambda: any(a.get("run_id") == dead.run_id for a in hook.received), timeout=90,
                         what="the failure alert", interval=0.5)
                wait_for(lambda: instance.get_run_by_id(queued.run_id).is_finished, timeout=240,
                         what="the queued sweep to run", interval=1)
                assert instance.get_run_by_id(queued.run_id).status == dg.DagsterRunStatus.SUCCESS, \
                    log_path.read_text()[-3000:]
        summary = scalar(engine, "SELECT summary FROM ba_run_history WHERE run_id = :r AND summary->>'range' IS NULL "
                                 "ORDER BY id DESC LIMIT 1", r=queued.run_id)
        assert summary["status"] == "SUCCESS" and summary["resumed_from"] is not None, summary
        assert summary["scanned"] < ROWS, summary
        # and nothing is left to do
        rerun = run_cli(env, "sweep", "customer-status", "--mode", "full", "--run-date", run_date.isoformat())
        assert rerun.summary is not None and rerun.summary["changed"] == 0, rerun.describe()
