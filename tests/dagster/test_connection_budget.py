"""The connection budget against reality: the backends a multi-range run holds, counted in pg_stat_activity."""

from __future__ import annotations

import threading
from datetime import date

import pytest
import sqlalchemy as sa

from batch_assets.crypto import DobCipher
from batch_assets.domains.customer_status.seed import seed_customers
from batch_assets.engine.settings import SweepSettings
from batch_assets.orchestration.launch import launch_job
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.slow]

RANGES, WORKERS = 3, 2
# :db — client backends on the test database other than the sampler's own.
BACKENDS = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :db AND backend_type = 'client backend' "
                   "AND pid <> pg_backend_pid()")


def test_multi_range_run_holds_at_most_ranges_times_the_per_range_budget(
    dagster_env: Settings, engine: sa.Engine, cipher: DobCipher
) -> None:
    """3 ranges in parallel (multiprocess), 2 workers each: at most 3 x (workers + prefetch + side effect +
    heartbeat) backends plus one per step process for plan, summary and report, sampled from another connection."""
    seed_customers(engine, cipher, 40_000, run_date=date(2025, 6, 1), seed=5)
    per_range = SweepSettings(workers=WORKERS).connections_needed
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        # Autocommit: pg_stat_activity is a snapshot per transaction.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            db = conn.execute(sa.text("SELECT current_database()")).scalar_one()
            while not done.is_set():
                peak = max(peak, conn.execute(BACKENDS, {"db": db}).scalar_one())
                done.wait(0.05)  # the sampling interval

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = launch_job("customer_status_sweep_job",
                            {"mode": "full", "run_date": "2025-06-01", "ranges": RANGES, "workers": WORKERS,
                             "page_size": 200},
                            settings=dagster_env, executor="multiprocess", max_concurrent=RANGES)
    finally:
        done.set()
        sampler.join()
    assert result.summary is not None and result.summary["status"] == "SUCCESS", result.summary
    budget = RANGES * (per_range + 1) + 2
    print(f"peak backends {peak}; per range {per_range}; budget {budget}")  # noqa: T201 - the measurement
    assert 0 < peak <= budget, (peak, budget)
