"""Acceptance: `batch-assets jobs list` / `jobs run NAME --set FIELD=VALUE` launch any registered job by name."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from _cli import EXIT_OK, assert_summary_keys, execute, ok, run_cli, scalar, today_utc, write_scalar

pytestmark = pytest.mark.integration

EXIT_CONFIG = 2


def test_jobs_list_names_every_registered_job_with_its_bounded_fields(cli_env) -> None:
    """The registry's jobs, their executor variants and config fields (type, default, bounds, description)."""
    listing = ok(cli_env, "jobs", "list")
    jobs = {job["name"]: job for job in listing["jobs"]}
    assert set(jobs) == {"customer_status_sweep_job", "subscription_expiry_job", "payment_queue_drain_job",
                         "outbox_relay_job", "retention_job"}
    assert jobs["customer_status_sweep_job"]["variants"] == ["celery"]
    fields = {f["name"]: f for f in jobs["customer_status_sweep_job"]["fields"]}
    assert fields["page_size"]["le"] == 1000 and fields["page_size"]["ge"] == 1
    assert fields["page_size"]["description"]


def test_jobs_run_launches_a_registered_job_with_its_config(cli_env, engine) -> None:
    """`jobs run subscription_expiry_job --set ...` is the same Dagster run as `subscriptions expire`."""
    past = today_utc() - timedelta(days=3)
    insert = "INSERT INTO subscriptions (customer_id, expiry_date, status) VALUES (:c, :e, 'ACTIVE') RETURNING id"
    ids = [write_scalar(engine, insert, c=uuid.uuid4(), e=past) for _ in range(7)]
    for sub_id in ids:
        execute(engine, "INSERT INTO enrollments (subscription_id, course_id) VALUES (:s, 1)", s=sub_id)
    result = run_cli(cli_env, "jobs", "run", "subscription_expiry_job", "--set", "batch_size=2",
                     "--set", f"run_date={today_utc().isoformat()}")
    assert result.returncode == EXIT_OK, result.describe()
    summary = result.summary
    assert_summary_keys(summary)
    assert summary["status"] == "SUCCESS" and summary["changed"] == 7 and summary["run_id"]
    assert scalar(engine, "SELECT count(*) FROM subscriptions WHERE status = 'EXPIRED'") == 7
    assert scalar(engine, "SELECT count(*) FROM enrollments") == 0


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("jobs", "run", "no_such_job"), "job"),
        (("jobs", "run", "subscription_expiry_job", "--set", "batch_sise=5"), "batch_sise"),
        (("jobs", "run", "subscription_expiry_job", "--set", "batch_size=-1"), "batch_size"),
        (("jobs", "run", "customer_status_sweep_job", "--set", "page_size=5000"), "page_size"),
        (("jobs", "run", "customer_status_sweep_job", "--set", "run_date=2026-13-01"), "run_date"),
        (("jobs", "run", "outbox_relay_job", "--set", "follow"), "set"),
    ],
)
def test_jobs_run_refuses_bad_config_naming_the_field_and_writes_nothing(cli_env, engine, args, field) -> None:
    """Exit 2, one error line naming the field, a FAILURE summary, no run recorded."""
    result = run_cli(cli_env, *args)
    assert result.returncode == EXIT_CONFIG, result.describe()
    assert result.summary["status"] == "FAILURE" and result.summary["error"].startswith(f"{field}:")
    assert scalar(engine, "SELECT count(*) FROM ba_run_history") == 0
