"""The payment worker job in Dagster: numeric metadata on payment_status, plug-in config failure."""

from __future__ import annotations

import dagster as dg
import pytest
import sqlalchemy as sa

from batch_assets.orchestration.launch import launch_job
from batch_assets.reference.payments import queue
from batch_assets.reference.payments.dagster import QueueDrainConfig
from batch_assets.settings import Settings

pytestmark = pytest.mark.dagster


def test_drain_records_numeric_metadata_on_payment_status(
    dagster_env: Settings, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every drain materializes payment_status with throughput, oldest due age, DLQ size and breaker as numbers."""
    monkeypatch.setenv("BATCH_ASSETS_PAYMENT_HANDLER", "batch_assets.reference.payments.noop:handle")
    queue.enqueue(engine, 50, seed=41)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO payments (id, amount_cents, status) VALUES (gen_random_uuid(), 1, 'FAILED')"))
        conn.execute(sa.text("INSERT INTO payments (id, amount_cents, next_attempt_at) "
                             "VALUES (gen_random_uuid(), 1, now() + interval '1 hour')"))
    result = launch_job("payment_queue_drain_job", QueueDrainConfig(drain=True, max_seconds=60), settings=dagster_env)
    assert result.dagster_status == "SUCCESS", result.summary
    assert result.summary["changed"] == 50 and result.summary["stopped_by"] == "drained"
    with dg.DagsterInstance.get() as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey("payment_status"))
    assert event is not None and event.run_id == result.run_id
    metadata = event.asset_materialization.metadata
    numeric = (dg.FloatMetadataValue, dg.IntMetadataValue)
    for key in ("throughput_per_s", "oldest_due_s", "dlq_size", "breaker_state"):
        assert isinstance(metadata[key], numeric), (key, metadata[key])
    assert metadata["dlq_size"].value == 1 and metadata["breaker_state"].value == 0
    assert metadata["throughput_per_s"].value > 0 and metadata["oldest_due_s"].value == 0
    # Every status, a zero included, from the same scan as the numbers above (one read of the table per drain).
    table = metadata["payments_by_status"].value
    for status, rows in (("DONE", 50), ("FAILED", 1), ("NEW", 1), ("PROCESSING", 0)):
        assert f"| {status} | {rows} |" in table, table


def test_unimportable_plugin_fails_the_run_before_claiming(
    dagster_env: Settings, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started from Dagster with an unimportable handler fails naming the variable; nothing is claimed."""
    monkeypatch.setenv("BATCH_ASSETS_PAYMENT_HANDLER", "ba_no_such_module_xyz:handle")
    queue.enqueue(engine, 3, seed=42)
    result = launch_job("payment_queue_drain_job", QueueDrainConfig(drain=True), settings=dagster_env)
    assert result.dagster_status == "FAILURE"
    assert "BATCH_ASSETS_PAYMENT_HANDLER" in str(result.summary.get("error")), result.summary
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT status, attempts, count(*) FROM payments GROUP BY 1, 2")).all() == [
            ("NEW", 0, 3)
        ]


def test_the_handler_is_a_resource_bound_by_env_var(dagster_env: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain takes its handler from the payment_handler resource: BATCH_ASSETS_PAYMENT_HANDLER and
    BATCH_ASSETS_LIMITS_URL reach it as EnvVars (shown by name, never by value); unset = None (the simulation)."""
    from batch_assets.definitions import defs as load_defs
    from batch_assets.queue.settings import QueueSettings
    from batch_assets.reference.payments.dagster import PaymentHandlerResource
    from batch_assets.reference.payments.handler import SimulatedHandler

    monkeypatch.setenv("BATCH_ASSETS_PAYMENT_HANDLER", "batch_assets.reference.payments.noop:handle")
    monkeypatch.setenv("BATCH_ASSETS_LIMITS_URL", "http://127.0.0.1:9/limits")
    resource = load_defs().resources["payment_handler"]  # type: ignore[index]
    assert isinstance(resource, PaymentHandlerResource)
    assert isinstance(resource.plugin, dg.EnvVar) and resource.plugin.env_var_name == "BATCH_ASSETS_PAYMENT_HANDLER"
    assert isinstance(resource.limits_url, dg.EnvVar) and resource.limits_url.env_var_name == "BATCH_ASSETS_LIMITS_URL"
    monkeypatch.delenv("BATCH_ASSETS_PAYMENT_HANDLER")
    monkeypatch.delenv("BATCH_ASSETS_LIMITS_URL")
    unset = load_defs().resources["payment_handler"]  # type: ignore[index]
    assert unset.plugin is None and unset.limits_url is None
    assert isinstance(unset.handler(QueueSettings()), SimulatedHandler)


def test_a_second_launch_in_one_process_follows_the_environment_of_its_own_time(
    dagster_env: Settings, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two launches of one job in one process: the second binds the resources of the environment it starts in.

    Dagster caches a reconstructable job's definition by module, function and args; without the launch clearing
    it, the second run reused the first one's EnvVar binding of BATCH_ASSETS_PAYMENT_HANDLER, unset since, and was
    refused with "Error in config for job payment_queue_drain_job" (the gate saw it when test_one_view followed this
    file in one process)."""
    monkeypatch.setenv("BATCH_ASSETS_PAYMENT_HANDLER", "batch_assets.reference.payments.noop:handle")
    queue.enqueue(engine, 3, seed=43)
    first = launch_job("payment_queue_drain_job", QueueDrainConfig(drain=True, max_seconds=30), settings=dagster_env)
    assert first.dagster_status == "SUCCESS" and first.summary["changed"] == 3, first.summary
    monkeypatch.delenv("BATCH_ASSETS_PAYMENT_HANDLER")
    queue.enqueue(engine, 2, seed=44)
    second = launch_job("payment_queue_drain_job", QueueDrainConfig(drain=True, max_seconds=30), settings=dagster_env)
    assert second.dagster_status == "SUCCESS" and second.summary["changed"] == 2, second.summary
    # ...and a variable set since the first launch is bound by the next one: an unimportable handler fails it.
    monkeypatch.setenv("BATCH_ASSETS_PAYMENT_HANDLER", "ba_no_such_module_xyz:handle")
    queue.enqueue(engine, 1, seed=45)
    third = launch_job("payment_queue_drain_job", QueueDrainConfig(drain=True, max_seconds=30), settings=dagster_env)
    assert third.dagster_status == "FAILURE" and "BATCH_ASSETS_PAYMENT_HANDLER" in str(third.summary.get("error"))
