"""Quiet when idle (docs/production/operations.md): no drain while nothing is due, no check run after a run that
changed nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa
from helpers import sensor_resources

from batch_assets.definitions import defs as load_defs
from batch_assets.orchestration.code_location import get_job
from batch_assets.reference.payments.queue import enqueue
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

defs = load_defs()


def _drain_tick(instance: dg.DagsterInstance, cursor: str | None, db_url: str) -> dg.SensorResult:
    sensor = defs.resolve_sensor_def("payment_queue_drain_sensor")
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, resources=sensor_resources(db_url)
    ) as context:
        return sensor.evaluate_tick(context)


def _checks_tick(instance: dg.DagsterInstance, cursor: str | None) -> dg.SensorResult:
    sensor = defs.resolve_sensor_def("asset_checks_after_run_sensor")
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=sensor_resources()) as context:
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
        # Another service's status of its own, spelled like one of ours in other letters.
        conn.execute(sa.text("INSERT INTO payments (id, amount_cents, status) VALUES (gen_random_uuid(), 1, 'new')"))
    with dg.instance_for_test() as instance:
        first = _drain_tick(instance, None, db_url)
        [observation] = first.asset_events
        assert first.run_requests == [] and observation.asset_key == dg.AssetKey("payment_status")
        assert observation.metadata["payments_done"].value == 2
        # A status with no row is a 0, not a missing point on the UI's plot of it.
        assert observation.metadata["payments_new"].value == 0 and observation.metadata["payments_failed"].value == 0
        assert observation.metadata["payments_unknown_status"].value == 1  # counted, never as payments_new
        again = _drain_tick(instance, first.cursor, db_url)
        assert again.asset_events == [] and again.run_requests == []


def _schedule_ticks(start: datetime, end: datetime) -> dict[str, list[datetime]]:
    """When each schedule of the code location fires in [start, end)."""
    from dagster._utils.schedules import cron_string_iterator

    ticks: dict[str, list[datetime]] = {}
    for schedule in defs.schedules or []:
        assert isinstance(schedule, dg.ScheduleDefinition)
        for when in cron_string_iterator(start.timestamp(), str(schedule.cron_schedule),
                                         schedule.execution_timezone):
            if when >= end:
                break
            ticks.setdefault(schedule.name, []).append(when)
    return ticks


def _schedule_runs(instance: dg.DagsterInstance, db_url: str, ticks: dict[str, list[datetime]]) -> dict[str, int]:
    """The runs each schedule requests when evaluated at its ticks, as the daemon would."""
    requested: dict[str, int] = {}
    for name, whens in ticks.items():
        schedule = defs.resolve_schedule_def(name)
        for when in whens:
            with dg.build_schedule_context(instance=instance, scheduled_execution_time=when,
                                           resources=sensor_resources(db_url)) as context:
                data = schedule.evaluate_tick(context)
            requested[name] = requested.get(name, 0) + len(data.run_requests or [])
    return requested


def _idle_sensor_runs(instance: dg.DagsterInstance, db_url: str, seconds: float) -> dict[str, int]:
    """The runs each sensor that may start runs requests over `seconds` of ticks at its interval (the run-status
    sensors answer runs, not ticks: the checks sensor is counted by the tests that make runs)."""
    requested: dict[str, int] = {}
    for sensor in defs.sensors or []:
        if isinstance(sensor, dg.RunStatusSensorDefinition):
            continue
        cursor = None
        for _ in range(int(seconds // (sensor.minimum_interval_seconds or 30))):
            with dg.build_sensor_context(
                instance=instance, cursor=cursor, resources=sensor_resources(db_url)
            ) as context:
                result = sensor.evaluate_tick(context)
            cursor = result.cursor or cursor
            requested[sensor.name] = requested.get(sensor.name, 0) + len(result.run_requests or [])
    return requested


def test_an_idle_hour_starts_no_run(dagster_env: Settings, db_url: str) -> None:
    """An idle weekday hour (10:00-11:00 UTC): every sensor that may start runs starts none, and the one schedule
    that fires in it, the outbox relay's (every 5 minutes), skips each tick while no event is pending."""
    start = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    ticks = _schedule_ticks(start, start + timedelta(hours=1))
    assert {name: len(whens) for name, whens in ticks.items()} == {"outbox_relay_schedule": 12}
    with dg.instance_for_test() as instance:
        checks_cursor = _checks_tick(instance, None).cursor
        sensors = _idle_sensor_runs(instance, db_url, 3600)
        schedules = _schedule_runs(instance, db_url, ticks)
        checks = len(_checks_tick(instance, checks_cursor).run_requests)
    assert {"payment_queue_drain_sensor", "rules_changed_sensor", "business_tables_observation_sensor",
            "dead_run_watchdog_sensor"} <= set(sensors)
    runs_per_idle_hour = sum(sensors.values()) + sum(schedules.values()) + checks
    assert (sensors, schedules, checks) == ({name: 0 for name in sensors}, {"outbox_relay_schedule": 0}, 0)
    assert runs_per_idle_hour == 0


def test_an_idle_day_starts_at_most_one_run_per_schedule_tick(dagster_env: Settings, db_url: str) -> None:
    """An idle Sunday: the nightly and weekly schedules start their one run per tick (the relay schedule's 288 ticks
    skip like the idle hour's 12, so they are not evaluated again here)."""
    start = datetime(2026, 12, 6, 0, 0, tzinfo=UTC)
    ticks = _schedule_ticks(start, start + timedelta(days=1))
    assert len(ticks.pop("outbox_relay_schedule")) == 288
    with dg.instance_for_test() as instance:
        requested = _schedule_runs(instance, db_url, ticks)
    assert {name: len(whens) for name, whens in ticks.items()} == {name: 1 for name in ticks}
    assert requested == {name: 1 for name in ticks}, requested  # the daily and weekly jobs: one run per tick


def test_the_relay_schedule_starts_a_run_when_an_event_is_pending(
    dagster_env: Settings, db_url: str, engine: sa.Engine
) -> None:
    """Another service writes an event (PENDING): the next relay tick requests one run; once SENT, the tick skips."""
    when = [datetime(2026, 12, 2, 10, 5, tzinfo=UTC)]
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO outbox_events (aggregate_id, event_type, payload) "
                             "VALUES (gen_random_uuid(), 'test', '{}')"))
    with dg.instance_for_test() as instance:
        assert _schedule_runs(instance, db_url, {"outbox_relay_schedule": when}) == {"outbox_relay_schedule": 1}
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE outbox_events SET status = 'SENT', sent_at = now()"))
        assert _schedule_runs(instance, db_url, {"outbox_relay_schedule": when}) == {"outbox_relay_schedule": 0}


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
