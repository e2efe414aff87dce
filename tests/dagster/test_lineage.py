"""Lineage a reviewer can read: named groups, the sweep's writes downstream of the status, observed tables,
automations."""

from __future__ import annotations

import dagster as dg
import pytest
import sqlalchemy as sa

from batch_assets.definitions import defs as load_defs
from batch_assets.orchestration.instance_home import repo_root
from batch_assets.orchestration.resources import DatabaseResource
from batch_assets.settings import Settings

pytestmark = pytest.mark.dagster

key = dg.AssetKey
BUSINESS_TABLES = ("customers", "enrollments", "payments", "subscriptions")
GROUPS = {
    "customers": "business_tables", "subscriptions": "business_tables", "enrollments": "business_tables",
    "payments": "business_tables", "customer_status": "customer_status", "review_triggers": "customer_status",
    "outbox_events": "customer_status", "payment_status": "nightly_jobs", "subscription_status": "nightly_jobs",
}


def test_every_asset_is_in_a_named_group_and_the_sweep_writes_hang_off_the_status() -> None:
    """No asset is in "default"; review_triggers and outbox_events are downstream of customer_status; loadable."""
    defs = load_defs()
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    groups = {k.to_user_string(): graph.get(k).group_name for k in graph.get_all_asset_keys()}
    assert groups == GROUPS
    assert graph.get(key("customer_status")).child_keys == {key("review_triggers"), key("outbox_events")}
    assert graph.get(key("payment_status")).parent_keys == {key("payments")}
    assert graph.get(key("payment_status")).is_observable


def test_the_ui_lists_the_automation_of_payment_status_and_of_the_business_tables() -> None:
    """What the asset page's Automation section asks (get_sensors_targeting) names the drain and observation sensors."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    with dg.instance_for_test() as instance, WorkspaceProcessContext(
        instance, WorkspaceFileTarget(paths=[str(repo_root() / "workspace.yaml")])
    ) as process:
        [location] = process.create_request_context().code_locations
        [repository] = location.get_repositories().values()
        targeting = {name: {s.name for s in repository.get_sensors_targeting(key(name))}
                     for name in ("payment_status", *BUSINESS_TABLES)}
    assert "payment_queue_drain_sensor" in targeting["payment_status"]
    for table in BUSINESS_TABLES:
        assert "business_tables_observation_sensor" in targeting[table], table


def test_the_observation_sensor_observes_changed_business_tables_without_a_run(
    dagster_env: Settings, db_url: str, engine: sa.Engine
) -> None:
    """First tick: one observation per business table; unchanged: none; a table another service wrote: that one."""
    sensor = load_defs().resolve_sensor_def("business_tables_observation_sensor")

    def tick(cursor: str | None) -> dg.SensorResult:
        with dg.instance_for_test() as instance, dg.build_sensor_context(
            instance=instance, cursor=cursor, resources={"database": DatabaseResource(url=db_url)}
        ) as context:
            return sensor.evaluate_tick(context)

    first = tick(None)
    assert sorted(e.asset_key.to_user_string() for e in first.asset_events) == list(BUSINESS_TABLES)
    assert first.run_requests == []
    quiet = tick(first.cursor)
    assert quiet.asset_events == [] and quiet.run_requests == []
    with engine.begin() as conn:  # another service adds a payment
        conn.execute(sa.text("INSERT INTO payments (id, amount_cents) VALUES (gen_random_uuid(), 100)"))
    changed = tick(quiet.cursor)
    assert [e.asset_key for e in changed.asset_events] == [key("payments")]
    assert changed.asset_events[0].metadata["rows"].value == 1
    assert changed.asset_events[0].metadata["rows_by_status"].value.splitlines() == [
        "| status | rows |", "|---|---:|", "| NEW | 1 |"]
