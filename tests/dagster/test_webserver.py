"""`dagster dev` (webserver + daemon) on a temporary DAGSTER_HOME: a sweep launched through GraphQL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.crypto import DobCipher
from batch_assets.orchestration.launch import ensure_instance, repo_root
from batch_assets.settings import Settings

pytestmark = [
    pytest.mark.dagster,
    pytest.mark.slow,
    # dagster_graphql calls gql with arguments gql 4 deprecates; not ours to fix.
    pytest.mark.filterwarnings("ignore:Using variable_values and operation_name:DeprecationWarning"),
]

DEADLINE_S = 75


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture
def dagster_dev(dagster_env: Settings, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """`dagster dev -w workspace.yaml` in its own session, stopped by process group."""
    home = ensure_instance(dagster_env)
    port = _free_port()
    log = (tmp_path / "dagster_dev.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-w", str(repo_root() / "workspace.yaml"),
         "-h", "127.0.0.1", "-p", str(port)],
        cwd=repo_root(), env=dict(os.environ, DAGSTER_HOME=str(home)), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, restore_signals=True,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert proc.poll() is None, (tmp_path / "dagster_dev.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "dagster dev did not come up"
            time.sleep(0.5)  # polling interval of a deadline loop, not synchronisation
        yield port, home
    finally:
        _stop(proc)
        log.close()


def _submit(client, deadline: float, **kwargs) -> str:  # noqa: ANN001
    from dagster_graphql import DagsterGraphQLClientError

    while True:
        try:
            return client.submit_job_execution(
                repository_location_name="batch_assets", repository_name="__repository__", **kwargs
            )
        except DagsterGraphQLClientError as exc:
            # The code location may still be loading; any other error is real.
            if "Could not find" not in str(exc) and "LocationNotFound" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _wait_for_run(client, run_id: str, deadline: float) -> dg.DagsterRunStatus:  # noqa: ANN001
    finished = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
    while True:
        status = client.get_run_status(run_id)
        if status in finished:
            return status
        assert time.monotonic() < deadline, f"run {run_id} still {status}"
        time.sleep(0.5)


def test_sweep_launched_through_graphql_succeeds_and_reports_metadata(
    dagster_dev: tuple[int, Path], engine: sa.Engine, seeded: int
) -> None:
    """GraphQL launch → SUCCESS; the run's summary and materialization metadata are on the instance."""
    from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

    port, home = dagster_dev
    client = DagsterGraphQLClient("127.0.0.1", port_number=port)
    deadline = time.monotonic() + DEADLINE_S

    # A type error is rejected at launch, naming the field; nothing runs.
    with pytest.raises(DagsterGraphQLClientError, match="page_size"):
        _submit(client, deadline, job_name="customer_status_sweep_job",
                run_config={"ops": {"plan_sweep": {"config": {"page_size": "many"}}}})

    run_id = _submit(
        client, deadline, job_name="customer_status_sweep_job",
        run_config={
            "ops": {"plan_sweep": {"config": {"mode": "full", "run_date": "2025-06-01", "ranges": 2}}},
            "execution": {"config": {"in_process": {}}},
        },
    )
    assert _wait_for_run(client, run_id, deadline) == dg.DagsterRunStatus.SUCCESS
    summary = run_history.latest(engine, run_id)
    assert summary["status"] == "SUCCESS" and summary["scanned"] == seeded

    # A value that type-checks but is out of range fails the first op, naming the field, before any write.
    bad_id = _submit(client, deadline, job_name="customer_status_sweep_job",
                     run_config={"ops": {"plan_sweep": {"config": {"mode": "full", "page_size": 5000}}},
                                 "execution": {"config": {"in_process": {}}}})
    assert _wait_for_run(client, bad_id, deadline) == dg.DagsterRunStatus.FAILURE
    assert run_history.latest(engine, bad_id) is None

    with dg.DagsterInstance.from_config(str(home)) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey("customer_status"))
        assert event.run_id == run_id
        assert event.asset_materialization.metadata["scanned"].value == seeded
        failures = instance.get_records_for_run(bad_id, of_type=dg.DagsterEventType.STEP_FAILURE).records
        assert "page_size" in failures[0].event_log_entry.dagster_event.step_failure_data.error.message


def test_terminating_a_sweep_from_the_ui_drains_checkpoints_and_releases_the_lock(
    dagster_dev: tuple[int, Path], engine: sa.Engine, cipher: DobCipher
) -> None:
    """Run termination (GraphQL/UI) stops the sweep: low watermark recorded, lock and lease given back."""
    from dagster_graphql import DagsterGraphQLClient

    from batch_assets.domains.customer_status.seed import seed_customers

    seed_customers(engine, cipher, 100_000, run_date=date(2025, 6, 1), seed=9)
    port, _home = dagster_dev
    client = DagsterGraphQLClient("127.0.0.1", port_number=port)
    deadline = time.monotonic() + DEADLINE_S
    run_id = _submit(
        client, deadline, job_name="customer_status_sweep_job",
        run_config={
            "ops": {"plan_sweep": {"config": {"mode": "full", "run_date": "2025-06-01", "ranges": 1,
                                              "page_size": 20, "workers": 1, "window": 2}}},
            "execution": {"config": {"in_process": {}}},
        },
    )
    while _computed(engine) < 2_000:  # mid-run
        assert client.get_run_status(run_id) not in {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE}
        assert time.monotonic() < deadline, "the sweep did not start"
        time.sleep(0.2)  # polling interval of a deadline loop
    client.terminate_run(run_id)
    assert _wait_for_run(client, run_id, deadline) == dg.DagsterRunStatus.CANCELED
    done = _computed(engine)
    assert 2_000 <= done < 100_000
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM ba_leases").scalar_one() == 0
        assert conn.exec_driver_sql("SELECT count(*) FROM ba_job_locks WHERE lock_until > now()").scalar_one() == 0
        cursor = conn.exec_driver_sql(
            "SELECT cursor #>> '{}' FROM ba_checkpoints WHERE sweep = 'customer_status' AND mode = 'full' "
            "AND status = 'RUNNING'"
        ).scalar_one()
        # Everything at or before the low watermark is written (the drain finished the pages in flight).
        behind = conn.exec_driver_sql(
            "SELECT count(*) FROM customers WHERE id <= CAST(%(c)s AS uuid) AND next_review_date IS NULL "
            "AND encrypted_dob IS NOT NULL", {"c": cursor}
        ).scalar_one()
    assert behind == 0


def _computed(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM customers WHERE next_review_date IS NOT NULL").scalar_one()
