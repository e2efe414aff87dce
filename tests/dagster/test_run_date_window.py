"""A run's run-date window is its calendar resource's (no environment read inside a settings model).

The first op checks the configured run date against the window and time zone of the calendar resource it
receives; the command line (launch_job) checks it against the environment's settings before anything runs.
Here the two differ, so each test fails if the check reads the other one.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from helpers import job_with_resources

from batch_assets.errors import ConfigError
from batch_assets.orchestration.launch import launch_job
from batch_assets.orchestration.resources import CalendarResource
from batch_assets.settings import Settings, load_settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

RUN_DATE = "2025-06-01"
JOBS = {  # job → (its first op, its config beyond the run date)
    "subscription_expiry_job": ("expire_subscriptions", {}),
    "customer_status_sweep_job": ("plan_sweep", {"mode": "full", "ranges": 1}),
}


def _written(engine: sa.Engine) -> tuple[int, int, int]:
    with engine.connect() as conn:
        return (conn.exec_driver_sql("SELECT count(*) FROM ba_run_history").scalar_one(),
                conn.exec_driver_sql("SELECT count(*) FROM ba_job_locks").scalar_one(),
                conn.exec_driver_sql("SELECT count(*) FROM customers WHERE next_review_date IS NOT NULL").scalar_one())


def _run(job_name: str, calendar: CalendarResource, **config: Any) -> dg.ExecuteInProcessResult:
    op, base = JOBS[job_name]
    with dg.instance_for_test() as instance:
        return job_with_resources(job_name, calendar=calendar).execute_in_process(
            run_config={"ops": {op: {"config": {**base, "run_date": RUN_DATE, **config}}}},
            instance=instance, raise_on_error=False)


@pytest.mark.parametrize("job_name", sorted(JOBS))
def test_the_op_holds_the_run_date_to_its_calendar_window_not_the_environments(
    job_name: str, dagster_env: Settings, engine: sa.Engine, seeded: int
) -> None:
    """The environment allows 36,500 days; the run's calendar allows 30: the first op fails naming run_date and
    the calendar's window, before any read or write; allow_distant_run_date lets the same run through."""
    assert load_settings().run_date_window_days == 36_500
    failed = _run(job_name, CalendarResource(run_date_window_days=30))
    assert not failed.success
    failure = failed.failure_data_for_node(JOBS[job_name][0])
    assert failure is not None
    message = failure.error.message
    assert "run_date" in message and "more than 30 days from today" in message
    assert "\n" not in message.strip(), "one line"
    assert _written(engine) == (0, 0, 0)
    assert _run(job_name, CalendarResource(run_date_window_days=30), allow_distant_run_date=True).success


def test_a_wider_calendar_window_lets_the_run_through_where_the_environment_would_refuse(
    dagster_env: Settings, engine: sa.Engine, seeded: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment's window (366 days) refuses 2025-06-01 on the command line; a run whose calendar allows
    36,500 days runs on that date."""
    monkeypatch.setenv("BATCH_ASSETS_RUN_DATE_WINDOW_DAYS", "366")
    with pytest.raises(ConfigError) as info:
        launch_job("customer_status_sweep_job", {"mode": "full", "run_date": RUN_DATE}, settings=load_settings())
    assert info.value.field == "run_date" and "more than 366 days" in str(info.value)
    assert _written(engine) == (0, 0, 0)
    result = _run("customer_status_sweep_job", CalendarResource(run_date_window_days=36_500))
    assert result.success
    assert _written(engine)[2] > 0
