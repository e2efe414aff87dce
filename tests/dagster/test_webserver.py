"""`dagster dev` (webserver + daemon) on a temporary DAGSTER_HOME: a sweep launched through GraphQL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path

import dagster as dg
import httpx
import psutil
import pytest
import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.orchestration.instance_home import repo_root
from batch_assets.orchestration.launch import ensure_instance
from batch_assets.reference.customer_status.crypto import DobCipher
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


def _session(sid: int) -> list[psutil.Process]:
    """Every live process of the session `sid` (the dagster dev the test started, and its children)."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the session, SIGKILL what is left after 20 s, then check that nothing of it survived."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while (proc.poll() is None or _session(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)  # polling interval of a deadline loop
        if proc.poll() is not None and not _session(proc.pid):
            break
    proc.wait(timeout=10)
    left = _session(proc.pid)
    assert not left, f"processes of dagster dev survived: {[p.pid for p in left]}"


def _reset_signals() -> None:
    # Started without a terminal, the child may inherit SIGTERM/SIGINT ignored: restore the defaults
    # so dagster dev installs its own handlers and shuts its children down.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def _dagster_dev(settings: Settings, tmp_path: Path, **env: str) -> Iterator[tuple[int, Path]]:
    """`dagster dev -w workspace.yaml` in its own session (extra `env`), stopped by process group."""
    home = ensure_instance(settings)
    port = _free_port()
    log_path = tmp_path / f"dagster_dev_{port}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-w", str(repo_root() / "workspace.yaml"),
         "-h", "127.0.0.1", "-p", str(port)],
        cwd=repo_root(), env=dict(os.environ, DAGSTER_HOME=str(home), **env), stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True, restore_signals=True, preexec_fn=_reset_signals,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "dagster dev did not come up"
            time.sleep(0.5)  # polling interval of a deadline loop, not synchronisation
        yield port, home
    finally:
        try:
            _stop(proc)
        finally:
            log.close()


@pytest.fixture
def dagster_dev(dagster_env: Settings, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """`dagster dev` with automation off, so no schedule or sensor starts runs during the test."""
    with _dagster_dev(dagster_env, tmp_path, BATCH_ASSETS_AUTOMATION="off") as running:
        yield running


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
    from dagster._core.instance.ref import InstanceRef
    from dagster_graphql import DagsterGraphQLClient

    from batch_assets.reference.customer_status.seed import seed_customers

    seed_customers(engine, cipher, 100_000, run_date=date(2025, 6, 1), seed=9)
    port, home = dagster_dev
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
    # What the README says a terminated run shows: CANCELED, and one product warning per range stopped saying what
    # it drained and where its checkpoint stands (an id, never a date).
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        said = [record.event_log_entry.user_message for record in instance.get_records_for_run(run_id).records
                if "terminated: the pages in flight were drained" in (record.event_log_entry.user_message or "")]
    assert len(said) == 1 and "scanned " in said[0] and "checkpoint at " in said[0], said
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


# --- operations (docs/production/operations.md) -------------------------------------------------------------------

REPOSITORY = {"repositoryLocationName": "batch_assets", "repositoryName": "__repository__"}
SWEEP_ASSETS = ("customer_status", "review_triggers", "outbox_events")
SWEEP_CHECKS = (("customer_status", "no_overdue_active_customers"), ("review_triggers", "review_triggers_unique"),
                ("outbox_events", "outbox_backlog"))

AUTOMATION_QUERY = """
query Automation($repo: RepositorySelector!) {
  repositoryOrError(repositorySelector: $repo) {
    __typename
    ... on Repository {
      schedules { name scheduleState { status } }
      sensors { name sensorState { status } }
    }
  }
}
"""

MATERIALIZE_MUTATION = """
mutation Materialize($params: ExecutionParams!) {
  launchPipelineExecution(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on InvalidSubsetError { message }
  }
}
"""

CHECKS_QUERY = """
query Checks($keys: [AssetKeyInput!]) {
  assetNodes(assetKeys: $keys) {
    assetKey { path }
    assetChecksOrError {
      __typename
      ... on AssetChecks { checks { name executionForLatestMaterialization { runId status } } }
    }
  }
}
"""


def _graphql(port: int, query: str, variables: dict, deadline: float) -> dict:
    """POST a GraphQL query; retries while the code location is still loading."""
    while True:
        response = httpx.post(f"http://127.0.0.1:{port}/graphql", json={"query": query, "variables": variables},
                              timeout=30)
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body
        data = body["data"]
        loading = "RepositoryNotFoundError" in str(data) or "RepositoryLocationNotFound" in str(data)
        if not loading or time.monotonic() > deadline:
            return data
        time.sleep(0.5)  # the code location is loading: polling interval of a deadline loop


def _automation(port: int) -> dict[str, str]:
    data = _graphql(port, AUTOMATION_QUERY, {"repo": REPOSITORY}, time.monotonic() + DEADLINE_S)
    repo = data["repositoryOrError"]
    assert repo["__typename"] == "Repository", repo
    states = {s["name"]: s["scheduleState"]["status"] for s in repo["schedules"]}
    states.update({s["name"]: s["sensorState"]["status"] for s in repo["sensors"]})
    return states


def test_schedules_and_sensors_are_running_after_load_and_stopped_with_automation_off(
    dagster_env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh instance: every schedule and run-starting sensor RUNNING; with BATCH_ASSETS_AUTOMATION=off,
    STOPPED (the alerting sensor and the dead-run watchdog stay on)."""
    with _dagster_dev(dagster_env, tmp_path, BATCH_ASSETS_AUTOMATION="on") as (port, _home):
        on = _automation(port)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "fresh_dagster_home"))  # no state stored by the first
    with _dagster_dev(dagster_env, tmp_path, BATCH_ASSETS_AUTOMATION="off") as (port, _home):
        off = _automation(port)
    assert len(on) == 12 and set(on) == set(off)
    assert on == dict.fromkeys(on, "RUNNING")
    # The two sensors that start no runs stay on: the failure alert and the dead-run watchdog.
    assert off.pop("run_failure_alert_sensor") == "RUNNING"
    assert off.pop("dead_run_watchdog_sensor") == "RUNNING"
    assert set(off.values()) == {"STOPPED"}


def test_materialize_customer_status_through_graphql_runs_the_sweep_and_shows_check_results(
    dagster_dev: tuple[int, Path], engine: sa.Engine, cipher: DobCipher
) -> None:
    """"Materialize" (GraphQL, as the UI sends it) on 1k rows succeeds; the asset shows its check results."""
    from dagster_graphql import DagsterGraphQLClient

    from batch_assets.reference.customer_status.seed import seed_customers

    seed_customers(engine, cipher, 1_000, run_date=date(2025, 6, 1), seed=5)
    port, home = dagster_dev
    deadline = time.monotonic() + DEADLINE_S
    params = {
        "selector": {
            **REPOSITORY,
            "pipelineName": "__ASSET_JOB",
            "assetSelection": [{"path": [key]} for key in SWEEP_ASSETS],
            "assetCheckSelection": [{"assetKey": {"path": [a]}, "name": c} for a, c in SWEEP_CHECKS],
        },
        "runConfigData": {
            "ops": {"customer_status_sweep": {"ops": {"plan_sweep": {"config": {"mode": "full",
                                                                               "run_date": "2025-06-01"}}}}},
            # One process: the multiprocess default starts ~10 step processes, minutes on a busy 2-core box.
            "execution": {"config": {"in_process": {}}},
        },
        "mode": "default",
    }
    launched = _graphql(port, MATERIALIZE_MUTATION, {"params": params}, deadline)["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    client = DagsterGraphQLClient("127.0.0.1", port_number=port)
    assert _wait_for_run(client, run_id, time.monotonic() + 3 * DEADLINE_S) == dg.DagsterRunStatus.SUCCESS
    assert run_history.latest(engine, run_id)["scanned"] == 1_000

    nodes = _graphql(port, CHECKS_QUERY, {"keys": [{"path": [k]} for k in SWEEP_ASSETS]}, deadline)["assetNodes"]
    results = {
        (node["assetKey"]["path"][0], check["name"]): check["executionForLatestMaterialization"]
        for node in nodes for check in node["assetChecksOrError"]["checks"]
    }
    for asset, check in SWEEP_CHECKS:
        execution = results[(asset, check)]
        assert execution is not None and execution["runId"] == run_id, (asset, check, execution)
        assert execution["status"] in ("SUCCEEDED", "FAILED"), execution  # evaluated, with a result
    assert results[("review_triggers", "review_triggers_unique")]["status"] == "SUCCEEDED"
    with dg.DagsterInstance.from_config(str(home)) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey("customer_status"))
        assert event.run_id == run_id
        assert event.asset_materialization.metadata["scanned"].value == 1_000


@pytest.mark.usefixtures("require_redis")
@pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")
def test_a_celery_run_with_no_worker_fails_saying_so_and_leaves_no_process(
    dagster_dev: tuple[int, Path], engine: sa.Engine, seeded: int
) -> None:
    """Launched with no celery worker, the celery job fails after worker_wait_s with a message that says so,
    writes nothing, and its run process is gone."""
    import redis
    from dagster_graphql import DagsterGraphQLClient

    broker = "redis://127.0.0.1:6379/12"
    redis.Redis.from_url(broker).flushdb()  # no worker has ever listened on this broker
    port, home = dagster_dev
    client = DagsterGraphQLClient("127.0.0.1", port_number=port)
    deadline = time.monotonic() + DEADLINE_S
    run_id = _submit(
        client, deadline, job_name="customer_status_sweep_celery_job",
        run_config={
            "ops": {"plan_sweep": {"config": {"mode": "full", "run_date": "2025-06-01", "ranges": 2}}},
            "execution": {"config": {"broker": broker, "worker_wait_s": 3.0}},
        },
    )
    assert _wait_for_run(client, run_id, time.monotonic() + 2 * DEADLINE_S) == dg.DagsterRunStatus.FAILURE
    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_records_for_run(run_id).records
    texts = [str(r.event_log_entry.dagster_event) + (r.event_log_entry.user_message or "") for r in records]
    assert any("no celery worker consumed queue 'dagster' within 3s" in t for t in texts)
    assert _computed(engine) == 0
    # The run worker exits: no process of this dagster dev still runs this run.
    deadline = time.monotonic() + 30
    while _processes_of_run(run_id):
        assert time.monotonic() < deadline, "the run's process is still alive"
        time.sleep(0.2)  # polling interval of a deadline loop


def _processes_of_run(run_id: str) -> list[int]:
    found = []
    for process in psutil.process_iter():
        try:
            if any(run_id in part for part in process.cmdline()):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found
