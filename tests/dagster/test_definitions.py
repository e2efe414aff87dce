"""The code location loads, and every job, schedule, sensor, asset and check resolves."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
import pytest

from batch_assets.definitions import defs as load_defs
from batch_assets.orchestration.outbox_job import OutboxRelayConfig
from batch_assets.reference.customer_status.dagster import SweepConfig
from batch_assets.reference.payments.dagster import QueueDrainConfig
from batch_assets.reference.subscriptions.dagster import ExpiryConfig
from batch_assets.settings import load_settings

pytestmark = pytest.mark.dagster


@pytest.fixture(scope="module")
def defs() -> dg.Definitions:
    """The code location as Dagster loads it (built by the @dg.definitions function)."""
    return load_defs()

JOBS = {
    "customer_status_sweep_job",
    "customer_status_sweep_celery_job",
    "subscription_expiry_job",
    "payment_queue_drain_job",
    "outbox_relay_job",
    "asset_checks_job",
    "business_tables_observation_job",
    "customer_status_asset_job",
}
SCHEDULES = {
    "daily_delta_schedule",
    "weekly_full_schedule",
    "nightly_subscription_expiry_schedule",
    "failed_subscriptions_retry_schedule",
    "outbox_relay_schedule",
}
SENSORS = {
    "rules_changed_sensor",
    "payment_queue_drain_sensor",
    "run_failure_alert_sensor",
    "asset_checks_after_run_sensor",
}


def test_definitions_are_loadable(defs: dg.Definitions) -> None:
    """Definitions.validate_loadable accepts the code location."""
    dg.Definitions.validate_loadable(defs)


def test_every_job_resolves_with_its_resources(defs: dg.Definitions) -> None:
    """Each job resolves, and the sweep job's ops need exactly the four resources by parameter name."""
    names = {job.name for job in defs.resolve_all_job_defs()}
    assert JOBS <= names
    sweep = defs.resolve_job_def("customer_status_sweep_job")
    assert {"database", "encryption", "job_lock", "checkpoints"} <= set(sweep.resource_defs)
    ops = {"plan_sweep", "sweep_range", "summarise_sweep", "report_customer_status"}
    assert {node.name for node in sweep.graph.nodes} == ops
    # "Materialize" runs the same ops: the asset job's graph-backed node wraps them.
    assets = defs.resolve_job_def("customer_status_asset_job").graph.node_named("customer_status_sweep")
    assert {node.name for node in assets.definition.nodes} == ops
    assert defs.resolve_job_def("customer_status_sweep_celery_job").executor_def.name == "celery"


def test_every_schedule_resolves_and_carries_the_configured_time_zone(defs: dg.Definitions) -> None:
    """Every schedule has an explicit execution_timezone equal to BATCH_ASSETS_TIMEZONE (default UTC)."""
    expected = load_settings().timezone
    for name in SCHEDULES:
        schedule = defs.resolve_schedule_def(name)
        assert schedule.execution_timezone == expected, name


def test_every_sensor_resolves(defs: dg.Definitions) -> None:
    """The four sensors resolve by name."""
    for name in SENSORS:
        assert defs.resolve_sensor_def(name).name == name


def test_lineage_runs_customers_to_status_to_triggers_and_outbox(defs: dg.Definitions) -> None:
    """The asset graph shows customers → customer_status → review_triggers and outbox_events, one sweep node."""
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey
    sweep_keys = [key("customer_status"), key("review_triggers"), key("outbox_events")]
    assert graph.get(key("customer_status")).parent_keys == {key("customers")}
    for sweep_key in sweep_keys[1:]:
        node = graph.get(sweep_key)
        assert node.parent_keys == {key("customer_status")} and node.is_materializable, sweep_key
    assert len({graph.get(k).assets_def for k in sweep_keys}) == 1  # one graph-backed multi-asset
    assert {key("subscriptions"), key("enrollments")} <= graph.get(key("subscription_status")).parent_keys
    checks = {check.name for check in graph.asset_check_keys}
    assert checks == {
        "no_overdue_active_customers",
        "review_triggers_unique",
        "no_payment_stuck_in_processing",
        "failed_subscriptions",
        "dead_letter_queue_size",
        "outbox_backlog",
    }


def test_daily_delta_schedule_requests_the_tick_date_with_a_run_key(defs: dg.Definitions) -> None:
    """A tick asks for a delta run dated on the tick's day, keyed so the tick never starts two runs."""
    schedule = defs.resolve_schedule_def("daily_delta_schedule")
    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(
            instance=instance, scheduled_execution_time=datetime(2025, 6, 1, 2, 0, tzinfo=UTC)
        )
        request = schedule.evaluate_tick(context).run_requests[0]
    assert request.run_key == "delta:2025-06-01"
    config = request.run_config["ops"]["customer_status_sweep"]["ops"]["plan_sweep"]["config"]
    assert (config["mode"], config["run_date"]) == ("delta", "2025-06-01")
    assert schedule.job_name == "customer_status_asset_job"


def test_config_classes_name_the_invalid_field() -> None:
    """to_settings raises ConfigError naming the field; zero means the default."""
    from batch_assets.errors import ConfigError

    assert SweepConfig(mode="full").to_settings().ranges == 4
    assert SweepConfig(mode="delta", ranges=8).to_settings().ranges == 1
    assert SweepConfig(workers=12).to_settings().engine.pool_size == 15
    assert OutboxRelayConfig().to_settings().batch_size == 500
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
            config.to_settings()
        assert info.value.field == field, config


def test_config_validators_reject_bad_values_at_construction() -> None:
    """The pydantic validators reject a bad value and the message names the field."""
    import pydantic

    from batch_assets.errors import ConfigError

    with pytest.raises(pydantic.ValidationError, match="mode"):
        SweepConfig(mode="weekly")  # the launchpad's Enum
    with pytest.raises(ConfigError) as info:
        SweepConfig(page_size=-5).to_settings()  # the bounds live in the settings model only
    assert info.value.field == "page_size"


def test_automation_is_running_on_load_and_stopped_with_the_variable_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Schedules and run-starting sensors default to RUNNING; BATCH_ASSETS_AUTOMATION=off leaves them STOPPED."""
    monkeypatch.delenv("BATCH_ASSETS_AUTOMATION", raising=False)
    on = load_defs()
    monkeypatch.setenv("BATCH_ASSETS_AUTOMATION", "off")
    off = load_defs()
    running, stopped = dg.DefaultScheduleStatus.RUNNING, dg.DefaultScheduleStatus.STOPPED
    assert {on.resolve_schedule_def(n).default_status for n in SCHEDULES} == {running}
    assert {off.resolve_schedule_def(n).default_status for n in SCHEDULES} == {stopped}
    starting = SENSORS - {"run_failure_alert_sensor"}
    assert {on.resolve_sensor_def(n).default_status for n in starting} == {dg.DefaultSensorStatus.RUNNING}
    assert {off.resolve_sensor_def(n).default_status for n in starting} == {dg.DefaultSensorStatus.STOPPED}
    assert off.resolve_sensor_def("run_failure_alert_sensor").default_status == dg.DefaultSensorStatus.RUNNING


def test_a_bad_automation_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown BATCH_ASSETS_AUTOMATION value stops the load with a ConfigError naming it."""
    from batch_assets.errors import ConfigError

    monkeypatch.setenv("BATCH_ASSETS_AUTOMATION", "sometimes")
    with pytest.raises(ConfigError, match="BATCH_ASSETS_AUTOMATION"):
        load_defs()


def test_retry_schedule_requests_retry_failed_with_its_own_run_key(defs: dg.Definitions) -> None:
    """The retry schedule asks subscription_expiry_job for retry_failed, keyed apart from the nightly run."""
    with dg.instance_for_test() as instance:
        when = datetime(2025, 6, 1, 6, 30, tzinfo=UTC)
        retry = defs.resolve_schedule_def("failed_subscriptions_retry_schedule").evaluate_tick(
            dg.build_schedule_context(instance=instance, scheduled_execution_time=when)).run_requests[0]
        nightly = defs.resolve_schedule_def("nightly_subscription_expiry_schedule").evaluate_tick(
            dg.build_schedule_context(instance=instance, scheduled_execution_time=when)).run_requests[0]
    assert retry.run_config["ops"]["expire_subscriptions"]["config"]["retry_failed"] is True
    assert nightly.run_config["ops"]["expire_subscriptions"]["config"]["retry_failed"] is False
    assert retry.run_key == "expiry-retry:2025-06-01" and retry.run_key != nightly.run_key
