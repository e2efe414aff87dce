"""Quiet when idle (CONTRACT §8): no drain while nothing is due, no check run after a run that changed nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa

from batch_assets.definitions import defs as load_defs
from batch_assets.domains.payments.queue import enqueue
from batch_assets.orchestration.launch import get_job
from batch_assets.orchestration.resources import DatabaseResource
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

defs = load_defs()
IDLE_HOUR_TICKS = 360
"""The drain sensor's ticks in an hour (minimum_interval_seconds = 10)."""


def _drain_tick(instance: dg.DagsterInstance, cursor: str | None, db_url: str) -> dg.SensorResult:
    sensor = defs.resolve_sensor_def("payment_queue_drain_sensor")
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"database": DatabaseResource(url=db_url)}
    ) as context:
        return sensor.evaluate_tick(context)


def _checks_tick(instance: dg.DagsterInstance, cursor: str | None) -> dg.SensorResult:
    sensor = defs.resolve_sensor_def("asset_checks_after_run_sensor")
    with dg.build_sensor_context(instance=instance, cursor=cursor) as context:
        return sensor.evaluate_tick(context)


def _drain(instance: dg.DagsterInstance) -> None:
    result = get_job("payment_queue_drain_job").execute_in_process(
        run_config={"ops": {"drain_payment_queue": {"config": {"max_seconds": 5}}}}, instance=instance
    )
    assert result.success


def test_drain_sensor_starts_a_drain_only_when_payments_are_due(
    dagster_env: Settings, db_url: str, engine: sa.Engine
) -> None:
    """Nothing queued or nothing due yet: a SkipReason and no run; a due payment (another connection): one run."""
    with dg.instance_for_test() as instance:
        idle = _drain_tick(instance, None, db_url)
        assert idle.run_requests == [] and "no payment queued" in (idle.skip_message or "")

        with engine.begin() as conn:  # another service queues a payment due in an hour
            conn.execute(sa.text("INSERT INTO payments (id, amount_cents, next_attempt_at) "
                                 "VALUES (gen_random_uuid(), 100, :at)"),
                         {"at": datetime.now(UTC) + timedelta(hours=1)})
        later = _drain_tick(instance, idle.cursor, db_url)
        assert later.run_requests == [] and "no payment due" in (later.skip_message or "")

        enqueue(engine, 3)
        due = _drain_tick(instance, later.cursor, db_url)
        assert len(due.run_requests) == 1


def test_drain_sensor_observes_payment_status_while_idle_without_a_run(
    dagster_env: Settings, db_url: str, engine: sa.Engine
) -> None:
    """An idle tick reports payment_status's counts as an observation (fresh numbers, no run); unchanged: none."""
    enqueue(engine, 2)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE payments SET status = 'DONE'"))
    with dg.instance_for_test() as instance:
        first = _drain_tick(instance, None, db_url)
        [observation] = first.asset_events
        assert first.run_requests == [] and observation.asset_key == dg.AssetKey("payment_status")
        assert observation.metadata["payments_done"].value == 2
        again = _drain_tick(instance, first.cursor, db_url)
        assert again.asset_events == [] and again.run_requests == []


def test_an_idle_hour_starts_no_drain_and_no_check_run(dagster_env: Settings, db_url: str) -> None:
    """An hour of drain-sensor ticks with nothing due requests no run, so the checks sensor starts none either."""
    with dg.instance_for_test() as instance:
        checks_cursor = _checks_tick(instance, None).cursor
        cursor, requested = None, 0
        for _ in range(IDLE_HOUR_TICKS):
            result = _drain_tick(instance, cursor, db_url)
            cursor = result.cursor or cursor
            requested += len(result.run_requests)
        checks = _checks_tick(instance, checks_cursor)
        assert requested == 0 and checks.run_requests == []


def _schedule_ticks(start: datetime, end: datetime) -> dict[str, int]:
    """How many times each schedule of the code location fires in [start, end)."""
    from dagster._utils.schedules import cron_string_iterator

    ticks: dict[str, int] = {}
    for schedule in defs.schedules or []:
        assert isinstance(schedule, dg.ScheduleDefinition)
        count = 0
        for when in cron_string_iterator(start.timestamp(), str(schedule.cron_schedule),
                                         schedule.execution_timezone):
            if when >= end:
                break
            count += 1
        if count:
            ticks[schedule.name] = count
    return ticks


def test_an_idle_hour_starts_at_most_one_run_per_schedule_tick(dagster_env: Settings, db_url: str) -> None:
    """An idle weekday hour (10:00-11:00 UTC): the sensors that may start runs start none, so the runs of that
    hour are the schedule ticks alone (the outbox relay's, every 5 minutes)."""
    start = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    ticks = _schedule_ticks(start, start + timedelta(hours=1))
    assert ticks == {"outbox_relay_schedule": 12}
    sensors = {"payment_queue_drain_sensor": 360, "rules_changed_sensor": 120,
               "business_tables_observation_sensor": 12}
    requested = 0
    with dg.instance_for_test() as instance:
        checks_cursor = _checks_tick(instance, None).cursor
        for name, count in sensors.items():
            cursor = None
            for _ in range(count):
                with dg.build_sensor_context(
                    instance=instance, cursor=cursor, resources={"database": DatabaseResource(url=db_url)}
                ) as context:
                    result = defs.resolve_sensor_def(name).evaluate_tick(context)
                cursor = result.cursor or cursor
                requested += len(result.run_requests)
        requested += len(_checks_tick(instance, checks_cursor).run_requests)
    runs_per_idle_hour = requested + sum(ticks.values())
    assert requested == 0 and runs_per_idle_hour == 12


def test_checks_run_only_after_a_run_that_changed_something(
    dagster_env: Settings, db_url: str, engine: sa.Engine
) -> None:
    """A drain that found nothing (changed 0) starts no check run; a drain that processed payments starts one."""
    with dg.instance_for_test() as instance:
        cursor = _checks_tick(instance, None).cursor  # the first tick only places the cursor
        _drain(instance)
        quiet = _checks_tick(instance, cursor)
        assert quiet.run_requests == []

        enqueue(engine, 5)
        _drain(instance)
        busy = _checks_tick(instance, quiet.cursor or cursor)
        assert len(busy.run_requests) == 1
