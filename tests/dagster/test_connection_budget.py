"""The connection budget against reality: the backends one run holds, counted in
pg_stat_activity by the run's application_name, against `budget.run_connections`."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date

import pytest
import sqlalchemy as sa
from helpers import SLOW_WRITES

from batch_assets.db.engine import RUN_APPLICATION_PREFIX
from batch_assets.engine.settings import SweepSettings
from batch_assets.orchestration.budget import OTHER_JOBS, range_step_connections, run_connections
from batch_assets.orchestration.launch import ensure_instance, launch_job
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.seed import seed_customers
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.slow]

RANGES, WORKERS = 3, 2
# :db, :prefix — client backends on the test database by application_name (a run's carry its run id).
BACKENDS = sa.text("SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = :db "
                   "AND backend_type = 'client backend' AND application_name LIKE :prefix GROUP BY 1")


@contextmanager
def sampled_backends(engine: sa.Engine) -> Iterator[Counter[str]]:
    """While the block runs, the peak count of client backends per run application_name on the test database."""
    peaks: Counter[str] = Counter()
    done = threading.Event()

    def sample() -> None:
        # Autocommit: pg_stat_activity is a snapshot per transaction.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            db = conn.execute(sa.text("SELECT current_database()")).scalar_one()
            while not done.is_set():
                for name, count in conn.execute(BACKENDS, {"db": db, "prefix": f"{RUN_APPLICATION_PREFIX}%"}):
                    peaks[name] = max(peaks[name], count)
                done.wait(0.02)  # the sampling interval

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield peaks
    finally:
        done.set()
        sampler.join()


def test_a_multi_range_run_holds_what_the_budget_says(
    dagster_env: Settings, engine: sa.Engine, cipher: DobCipher
) -> None:
    """3 ranges in parallel (multiprocess), 2 workers each: the run's own backends (its application_name) never
    exceed run_connections, and reach at least every range's workers at once (the ranges really overlap)."""
    seed_customers(engine, cipher, 12_000, run_date=date(2025, 6, 1), seed=5)
    with engine.begin() as conn:
        conn.exec_driver_sql(SLOW_WRITES)
    settings = SweepSettings(workers=WORKERS)
    budget = run_connections(settings, ranges=RANGES, parallel=RANGES)
    with sampled_backends(engine) as peaks:
        result = launch_job("customer_status_sweep_job",
                            {"mode": "full", "run_date": "2025-06-01", "ranges": RANGES, "workers": WORKERS,
                             "page_size": 200},
                            settings=dagster_env, executor="multiprocess", max_concurrent=RANGES)
    assert result.summary is not None and result.summary["status"] == "SUCCESS", result.summary
    peak = peaks[f"{RUN_APPLICATION_PREFIX}{result.run_id}"]
    print(f"peak backends of the run {peak}; per range step {range_step_connections(settings)}; "  # noqa: T201
          f"budget {budget}; by application_name {dict(peaks)}")
    assert set(peaks) == {f"{RUN_APPLICATION_PREFIX}{result.run_id}"}, "every backend of the run carries its id"
    assert RANGES * WORKERS <= peak <= budget, (peak, budget)


def test_a_run_over_the_budget_is_refused_before_it_starts(dagster_env: Settings, engine: sa.Engine) -> None:
    """3 ranges at once with 32 workers each need 3 x 36 connections, more than the server has: ConfigError naming
    workers, with the numbers, and no run was created (nothing ran, nothing holds a connection)."""
    import dagster as dg

    from batch_assets.errors import ConfigError

    ensure_instance(dagster_env)
    big = SweepSettings(workers=32)
    assert run_connections(big, ranges=3, parallel=3) == 3 * (32 + 3 + 1)
    with pytest.raises(ConfigError) as refused:
        launch_job("customer_status_sweep_job",
                   {"mode": "full", "run_date": "2025-06-01", "ranges": 3, "workers": 32},
                   settings=dagster_env, executor="multiprocess", max_concurrent=3)
    assert refused.value.field == "workers" and "needs 108 connections" in str(refused.value)
    assert "\n" not in str(refused.value)
    with dg.DagsterInstance.get() as instance:
        assert instance.get_runs() == []
    # In one process the same ranges run one after the other: the run fits.
    result = launch_job("customer_status_sweep_job",
                        {"mode": "full", "run_date": "2025-06-01", "ranges": 3, "workers": 32},
                        settings=dagster_env, executor="in_process")
    assert result.summary is not None and result.summary["status"] == "SUCCESS", result.summary


@pytest.mark.parametrize("follow", [False, True])
def test_the_outbox_relay_holds_what_the_budget_keeps_for_it(dagster_env: Settings, engine: sa.Engine,
                                                             follow: bool) -> None:
    """The relay, one pass and following, relaying 30k events to the file sink: its run's backends never exceed what
    the budget keeps free for it while a sweep runs (OTHER_JOBS["outbox relay"])."""
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO outbox_events (aggregate_id, event_type, payload) "
                             "SELECT gen_random_uuid(), 'age_category_changed', '{}'::jsonb "
                             "FROM generate_series(1, 30000)")
    config = {"follow": True, "follow_seconds": 3.0} if follow else {}
    with sampled_backends(engine) as peaks:
        result = launch_job("outbox_relay_job", config, settings=dagster_env)
    assert result.summary is not None and result.summary["status"] == "SUCCESS", result.summary
    assert result.summary["sent"] == 30000
    peak = peaks[f"{RUN_APPLICATION_PREFIX}{result.run_id}"]
    print(f"peak backends of the relay run {peak}; by application_name {dict(peaks)}")  # noqa: T201
    assert 2 <= peak <= OTHER_JOBS["outbox relay"], (peak, OTHER_JOBS)
