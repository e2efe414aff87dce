"""Jobs run as Dagster runs on the instance: summaries, metadata, config errors, lock, resume from failure."""

from __future__ import annotations

import dagster as dg
import pytest
import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.errors import ConfigError
from batch_assets.locking.lock import PostgresJobLock
from batch_assets.orchestration.code_location import get_job
from batch_assets.orchestration.launch import ensure_instance, launch_job, reexecute_from_failure
from batch_assets.orchestration.outbox_job import OutboxRelayConfig
from batch_assets.reference.customer_status.dagster import SweepConfig
from batch_assets.reference.payments.dagster import QueueDrainConfig
from batch_assets.reference.subscriptions.dagster import ExpiryConfig
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

SUMMARY_KEYS = {"status", "run_id", "scanned", "changed", "unchanged", "failed", "failed_by_type", "duration_s"}
SWEEP_KEYS = SUMMARY_KEYS | {"mode", "run_date", "pages", "decrypted", "triggers", "audit_events", "resumed_from"}


def _computed(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM customers WHERE next_review_date IS NOT NULL").scalar_one()


def _history_rows(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM ba_run_history").scalar_one()


def test_full_sweep_runs_as_a_dagster_run_over_ranges(dagster_env: Settings, engine: sa.Engine, seeded: int) -> None:
    """A full sweep over 3 ranges is a SUCCESS run on the instance; summary and UI metadata add up."""
    result = launch_job(
        "customer_status_sweep_job", SweepConfig(mode="full", run_date="2025-06-01", ranges=3, page_size=200),
        settings=dagster_env,
    )
    assert result.dagster_status == "SUCCESS"
    summary = result.summary
    assert SWEEP_KEYS <= set(summary)
    assert summary["status"] == "SUCCESS" and summary["run_id"] == result.run_id
    assert summary["scanned"] == seeded and summary["ranges"] == 3
    assert summary["changed"] + summary["failed"] == seeded
    assert summary["run_date"] == "2025-06-01" and summary["mode"] == "full"
    assert run_history.latest(engine, result.run_id) == summary

    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(result.run_id)
        assert run.job_name == "customer_status_sweep_job" and run.tags["batch_assets/launched_by"] == "cli"
        event = instance.get_latest_materialization_event(dg.AssetKey("customer_status"))
        metadata = event.asset_materialization.metadata
        assert event.run_id == result.run_id
        assert metadata["scanned"].value == seeded
        assert "ADULT" in metadata["counts_by_category"].value
        assert metadata["failed_by_type"].value.count("|") > 4
        for key in ("review_triggers", "outbox_events"):
            assert instance.get_latest_materialization_event(dg.AssetKey(key)).run_id == result.run_id


def test_bad_config_from_the_cli_path_is_rejected_before_anything_runs(
    dagster_env: Settings, engine: sa.Engine, seeded: int
) -> None:
    """launch_job raises ConfigError naming the field; no run is created and nothing is written."""
    with pytest.raises(ConfigError) as info:
        launch_job("customer_status_sweep_job", {"mode": "full", "page_size": 5000}, settings=dagster_env)
    assert info.value.field == "page_size"
    with pytest.raises(ConfigError) as info:
        launch_job("subscription_expiry_job", {"run_date": "2025-02-30"}, settings=dagster_env)
    assert info.value.field == "run_date"
    ensure_instance(dagster_env)
    with dg.DagsterInstance.get() as instance:
        assert instance.get_runs() == []
    assert _computed(engine) == 0 and _history_rows(engine) == 0


def test_bad_config_from_the_launchpad_fails_the_first_op_naming_the_field(
    dagster_env: Settings, engine: sa.Engine, seeded: int
) -> None:
    """Run config that passed the type check fails in plan_sweep (naming the field) before any read or write."""
    job = get_job("customer_status_sweep_job")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(
            run_config={"ops": {"plan_sweep": {"config": {"mode": "full", "row_timeout_s": 60.0}}}},
            instance=instance,
            raise_on_error=False,
        )
    assert not result.success
    failure = result.failure_data_for_node("plan_sweep")
    assert "row_timeout_s" in failure.error.message
    assert _computed(engine) == 0 and _history_rows(engine) == 0
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM ba_job_locks").scalar_one() == 0


def test_sweep_is_skipped_while_another_run_holds_the_lock(
    dagster_env: Settings, engine: sa.Engine, seeded: int
) -> None:
    """A sweep that finds the lock held ends SKIPPED (run SUCCESS, nothing written)."""
    assert PostgresJobLock(engine).acquire("customer_status_sweep", "someone-else", 60)
    result = launch_job("customer_status_sweep_job", SweepConfig(mode="delta"), settings=dagster_env)
    assert result.dagster_status == "SUCCESS"
    assert result.summary["status"] == "SKIPPED" and "someone-else" in result.summary["reason"]
    assert _computed(engine) == 0


BREAK_HIGH_IDS = """
CREATE FUNCTION ba_test_break() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id >= 'c0000000-0000-0000-0000-000000000000'::uuid THEN
        RAISE EXCEPTION 'injected failure';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER ba_test_break BEFORE UPDATE ON customers FOR EACH ROW EXECUTE FUNCTION ba_test_break();
"""


def test_reexecution_from_failure_resumes_the_unfinished_range_from_its_checkpoint(
    dagster_env: Settings, engine: sa.Engine, seeded: int
) -> None:
    """Range 2 fails half-way (writes refused); re-executing from failure resumes only it, from its checkpoint."""
    with engine.begin() as conn:
        conn.exec_driver_sql(BREAK_HIGH_IDS)
    config = SweepConfig(mode="full", run_date="2025-06-01", ranges=2, page_size=50, workers=1, window=1,
                         breaker_min_rows=1)
    failed = launch_job("customer_status_sweep_job", config, settings=dagster_env)
    assert failed.dagster_status == "FAILURE"
    assert failed.summary["status"] == "FAILURE" and "range 2/2" in failed.summary["error"]
    with engine.connect() as conn:
        low_done = conn.exec_driver_sql(
            "SELECT count(*) FROM customers WHERE next_review_date IS NOT NULL "
            "AND id < '80000000-0000-0000-0000-000000000000'"
        ).scalar_one()
        checkpoint = conn.exec_driver_sql(
            "SELECT cursor FROM ba_checkpoints WHERE mode = 'full' AND status = 'RUNNING'"
        ).scalar_one()
    assert low_done > 0 and checkpoint is not None

    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER ba_test_break ON customers")
    resumed = reexecute_from_failure(failed.run_id, settings=dagster_env)
    assert resumed.dagster_status == "SUCCESS", resumed.summary
    assert resumed.summary["status"] == "SUCCESS"
    # Range 1's result is reused from the failed run; range 2 scans only what lies after its checkpoint.
    assert resumed.summary["resumed_from"] is not None
    assert resumed.summary["scanned"] < seeded
    # Nothing was left behind: a delta afterwards finds only the rows that cannot be evaluated.
    delta = launch_job("customer_status_sweep_job", SweepConfig(mode="delta", run_date="2025-06-01"),
                       settings=dagster_env)
    assert delta.summary["changed"] == 0 and delta.summary["scanned"] == delta.summary["failed"] > 0
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(resumed.run_id)
        assert run.root_run_id == failed.run_id
        started = {
            record.event_log_entry.step_key
            for record in instance.get_records_for_run(
                resumed.run_id, of_type=dg.DagsterEventType.STEP_START
            ).records
        }
    assert started == {"sweep_range[r001_of_002]", "summarise_sweep", "report_customer_status"}
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM ba_job_locks").scalar_one() == 0


def test_expiry_drain_and_relay_jobs_record_their_summaries(dagster_env: Settings, engine: sa.Engine) -> None:
    """The three single-op jobs run as Dagster runs and return their JSON summaries."""
    for job, config in (
        ("subscription_expiry_job", ExpiryConfig(run_date="2025-06-01")),
        ("payment_queue_drain_job", QueueDrainConfig(max_seconds=5)),
        ("outbox_relay_job", OutboxRelayConfig()),
    ):
        result = launch_job(job, config, settings=dagster_env)
        assert result.dagster_status == "SUCCESS", (job, result.summary)
        assert SUMMARY_KEYS <= set(result.summary), job
        assert result.summary["status"] == "SUCCESS", job


def test_asset_checks_pass_after_a_successful_delta(dagster_env: Settings, engine: sa.Engine, seeded: int) -> None:
    """After a delta: no overdue ACTIVE customer, unique triggers, empty DLQ; a stuck payment fails its check."""
    from batch_assets.definitions import defs

    launch_job("customer_status_sweep_job", SweepConfig(mode="delta", run_date="2025-06-01"), settings=dagster_env)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO payments (id, status, claimed_until) "
            "VALUES (gen_random_uuid(), 'PROCESSING', now() - interval '1 hour')"
        )
    with dg.instance_for_test() as instance:
        result = defs().resolve_job_def("asset_checks_job").execute_in_process(instance=instance)
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["no_overdue_active_customers"].passed
    assert evaluations["no_overdue_active_customers"].metadata["last_delta_run_date"].value == "2025-06-01"
    assert evaluations["review_triggers_unique"].passed
    assert evaluations["dead_letter_queue_size"].passed
    assert evaluations["failed_subscriptions"].passed
    assert not evaluations["no_payment_stuck_in_processing"].passed


def test_failed_sweep_gives_back_lock_and_lease_and_the_next_run_gets_in(
    dagster_env: Settings, engine: sa.Engine, seeded: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep whose breaker trips (wrong key) releases its lock and lease; the next run is not skipped."""
    from batch_assets.reference.customer_status.crypto import generate_key_text
    from batch_assets.settings import load_settings

    monkeypatch.setenv("BATCH_ASSETS_ENCRYPTION_KEY", generate_key_text())
    failed = launch_job("customer_status_sweep_job", SweepConfig(mode="full", run_date="2025-06-01", ranges=2),
                        settings=load_settings())
    assert failed.dagster_status == "FAILURE" and failed.summary["status"] == "FAILURE"
    assert _computed(engine) == 0
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM ba_leases").scalar_one() == 0
        assert conn.exec_driver_sql("SELECT count(*) FROM ba_job_locks WHERE lock_until > now()").scalar_one() == 0
    monkeypatch.setenv("BATCH_ASSETS_ENCRYPTION_KEY", dagster_env.encryption_key)
    again = launch_job("customer_status_sweep_job", SweepConfig(mode="full", run_date="2025-06-01", ranges=2),
                       settings=load_settings())
    assert again.summary["status"] == "SUCCESS"
    assert again.summary["changed"] + again.summary["failed"] == seeded


def test_multiprocess_executor_runs_each_range_in_its_own_process(
    dagster_env: Settings, engine: sa.Engine, seeded: int
) -> None:
    """Under the multiprocess executor every mapped range runs in a separate process; the run still adds up."""
    import os

    result = launch_job(
        "customer_status_sweep_job", SweepConfig(mode="full", run_date="2025-06-01", ranges=2, page_size=200),
        settings=dagster_env, executor="multiprocess", max_concurrent=2,
    )
    assert result.dagster_status == "SUCCESS", result.summary
    assert result.summary["scanned"] == seeded and result.summary["ranges"] == 2
    with dg.DagsterInstance.get() as instance:
        pids = {
            entry.dagster_event.pid
            for entry in instance.all_logs(result.run_id, of_type=dg.DagsterEventType.STEP_START)
            if entry.step_key and entry.step_key.startswith("sweep_range")
        }
    assert len(pids) == 2 and os.getpid() not in pids
