"""The code location loads, and every job, schedule, sensor, asset and check resolves."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
import pytest

from batch_assets.definitions import defs
from batch_assets.orchestration.config import ExpiryConfig, OutboxRelayConfig, QueueDrainConfig, SweepConfig
from batch_assets.settings import load_settings

pytestmark = pytest.mark.dagster

JOBS = {
    "customer_status_sweep_job",
    "customer_status_sweep_celery_job",
    "subscription_expiry_job",
    "payment_queue_drain_job",
    "outbox_relay_job",
    "asset_checks_job",
    "business_tables_observation_job",
}
SCHEDULES = {
    "daily_delta_schedule",
    "weekly_full_schedule",
    "nightly_subscription_expiry_schedule",
    "outbox_relay_schedule",
}
SENSORS = {
    "rules_changed_sensor",
    "payment_queue_drain_sensor",
    "run_failure_alert_sensor",
    "asset_checks_after_run_sensor",
}


def test_definitions_are_loadable() -> None:
    """Definitions.validate_loadable accepts the code location."""
    dg.Definitions.validate_loadable(defs)


def test_every_job_resolves_with_its_resources() -> None:
    """Each job resolves, and the sweep job's ops need exactly the four resources by parameter name."""
    names = {job.name for job in defs.resolve_all_job_defs()}
    assert JOBS <= names
    sweep = defs.resolve_job_def("customer_status_sweep_job")
    assert {"database", "encryption", "job_lock", "checkpoints"} <= set(sweep.resource_defs)
    assert {node.name for node in sweep.graph.nodes} == {"plan_sweep", "sweep_range", "summarise_sweep"}
    assert defs.resolve_job_def("customer_status_sweep_celery_job").executor_def.name == "celery"


def test_every_schedule_resolves_and_carries_the_configured_time_zone() -> None:
    """Every schedule has an explicit execution_timezone equal to BATCH_ASSETS_TIMEZONE (default UTC)."""
    expected = load_settings().timezone
    for name in SCHEDULES:
        schedule = defs.resolve_schedule_def(name)
        assert schedule.execution_timezone == expected, name


def test_every_sensor_resolves() -> None:
    """The four sensors resolve by name."""
    for name in SENSORS:
        assert defs.resolve_sensor_def(name).name == name


def test_lineage_runs_customers_to_status_to_triggers_and_outbox() -> None:
    """The asset graph shows customers → customer_status → review_triggers / outbox_events."""
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey
    assert key("customers") in graph.get(key("customer_status")).parent_keys
    assert key("customer_status") in graph.get(key("review_triggers")).parent_keys
    assert key("customer_status") in graph.get(key("outbox_events")).parent_keys
    assert {key("subscriptions"), key("enrollments")} <= graph.get(key("subscription_status")).parent_keys
    checks = {check.name for check in graph.asset_check_keys}
    assert checks == {
        "no_overdue_active_customers",
        "review_triggers_unique",
        "no_payment_stuck_in_processing",
        "failed_subscriptions",
        "dead_letter_queue_size",
    }


def test_daily_delta_schedule_requests_the_tick_date_with_a_run_key() -> None:
    """A tick asks for a delta run dated on the tick's day, keyed so the tick never starts two runs."""
    schedule = defs.resolve_schedule_def("daily_delta_schedule")
    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(
            instance=instance, scheduled_execution_time=datetime(2025, 6, 1, 2, 0, tzinfo=UTC)
        )
        request = schedule.evaluate_tick(context).run_requests[0]
    assert request.run_key == "delta:2025-06-01"
    assert request.run_config["ops"]["plan_sweep"]["config"]["mode"] == "delta"
    assert request.run_config["ops"]["plan_sweep"]["config"]["run_date"] == "2025-06-01"


def test_config_classes_name_the_invalid_field() -> None:
    """to_engine_settings raises ConfigError naming the field; zero means the default."""
    from batch_assets.errors import ConfigError

    assert SweepConfig(mode="full").to_engine_settings().ranges == 4
    assert SweepConfig(mode="delta", ranges=8).to_engine_settings().ranges == 1
    assert SweepConfig(workers=12).to_engine_settings().engine.pool_size == 15
    assert OutboxRelayConfig().to_engine_settings().batch_size == 500
    cases = [
        (SweepConfig.model_construct(page_size=5000), "page_size"),
        (SweepConfig.model_construct(mode="weekly"), "mode"),
        (SweepConfig.model_construct(run_date="2025-13-01"), "run_date"),
        (SweepConfig.model_construct(ranges=-1), "ranges"),
        (SweepConfig.model_construct(row_timeout_s=60, page_timeout_s=30), "row_timeout_s"),
        (ExpiryConfig.model_construct(batch_size=20_000), "batch_size"),
        (QueueDrainConfig.model_construct(concurrency=1000), "concurrency"),
        (QueueDrainConfig.model_construct(max_seconds=-1.0), "max_seconds"),
        (OutboxRelayConfig.model_construct(batch_size=10_001), "batch_size"),
    ]
    for config, field in cases:
        with pytest.raises(ConfigError) as info:
            config.to_engine_settings()
        assert info.value.field == field, config


def test_config_validators_reject_bad_values_at_construction() -> None:
    """The pydantic validators reject a bad value and the message names the field."""
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="mode"):
        SweepConfig(mode="weekly")
    with pytest.raises(pydantic.ValidationError, match="page_size"):
        SweepConfig(page_size=-5)
