"""The sweep's cursor ranges run on celery workers (separate processes) against the machine's Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psutil
import pytest
import redis
import sqlalchemy as sa

from batch_assets.orchestration.instance_home import repo_root
from batch_assets.orchestration.launch import launch_job
from batch_assets.reference.customer_status.dagster import SweepConfig
from batch_assets.settings import Settings

pytestmark = [
    pytest.mark.dagster,
    pytest.mark.slow,
    pytest.mark.integration,
    # dagster_celery registers its tasks on a new app per executor; celery 5.7 warns about the re-registration
    # (DuplicateTaskNameWarning, which 5.6 does not have: matched by its text).
    pytest.mark.filterwarnings("ignore:Task name .* is already registered to a different callable"),
]

BROKER = "redis://127.0.0.1:6379/11"
DEADLINE_S = 60


@pytest.fixture
def celery_worker(dagster_env: Settings, tmp_path: Path) -> Iterator[subprocess.Popen]:
    """A `celery -A dagster_celery.app worker` on BROKER, in its own session, stopped by process group."""
    try:
        redis.Redis.from_url(BROKER, socket_connect_timeout=2).ping()
    except redis.exceptions.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    redis.Redis.from_url(BROKER).flushdb()
    config_dir = tmp_path / "celery_config"
    config_dir.mkdir()
    # dagster_celery's app reads this module when present (what `dagster-celery worker start -y` writes).
    (config_dir / "dagster_celery_config.py").write_text(f"broker_url = {BROKER!r}\nresult_backend = {BROKER!r}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(config_dir), str(repo_root())]))
    log = (tmp_path / "celery.log").open("wb")
    celery = Path(sys.executable).parent / "celery"
    proc = subprocess.Popen(
        [str(celery), "-A", "dagster_celery.app", "worker", "-Q", "dagster", "--prefetch-multiplier=1",
         "--concurrency", "2", "--loglevel", "INFO", "-n", f"batch-assets-test-{os.getpid()}@%h"],
        cwd=repo_root(), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while b"ready." not in (tmp_path / "celery.log").read_bytes():
            assert proc.poll() is None, (tmp_path / "celery.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "celery worker did not start"
            time.sleep(0.2)  # polling interval of a deadline loop
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()


def test_sweep_ranges_run_on_celery_workers(
    celery_worker: subprocess.Popen, dagster_env: Settings, engine: sa.Engine, seeded: int
) -> None:
    """Each mapped range executes in a celery worker process; the run succeeds with the full count."""
    worker_pids = {celery_worker.pid} | {p.pid for p in psutil.Process(celery_worker.pid).children(recursive=True)}
    result = launch_job(
        "customer_status_sweep_job",
        SweepConfig(mode="full", run_date="2025-06-01", ranges=2, page_size=200),
        settings=dagster_env,
        executor="celery",
        executor_config={"broker": BROKER},
    )
    assert result.dagster_status == "SUCCESS", result.summary
    assert result.summary["scanned"] == seeded and result.summary["ranges"] == 2
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(result.run_id)
        assert run.job_name == "customer_status_sweep_celery_job"
        starts = instance.get_records_for_run(result.run_id, of_type=dg.DagsterEventType.STEP_START).records
        pids = {r.event_log_entry.step_key: r.event_log_entry.dagster_event.pid for r in starts}
    assert set(pids) == {"plan_sweep", "sweep_range[r000_of_002]", "sweep_range[r001_of_002]", "summarise_sweep",
                         "report_customer_status"}
    assert os.getpid() not in pids.values()
    # Celery forks its pool lazily; a step's process is the worker or one of its children.
    worker_pids |= {p.pid for p in psutil.Process(celery_worker.pid).children(recursive=True)}
    assert set(pids.values()) <= worker_pids
