"""Rules-change retries (docs/production/operations.md): debounce, a growing delay between failed attempts, one alert
per fingerprint."""

from __future__ import annotations

import time
from collections.abc import Iterator

import dagster as dg
import pytest
import sqlalchemy as sa
from helpers import AlertWebhook, sensor_resources, wait_for

from batch_assets.definitions import defs as load_defs
from batch_assets.reference.customer_status import dagster as cs
from batch_assets.reference.customer_status import sensor as rules_sensor
from batch_assets.reference.customer_status.rules import Rules
from batch_assets.reference.customer_status.rules_store import set_rules
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

defs = load_defs()


@pytest.fixture
def alerts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict]]:
    with AlertWebhook() as hook:
        monkeypatch.setenv("BATCH_ASSETS_ALERT_WEBHOOK", hook.url)
        yield hook.received


def _tick(instance: dg.DagsterInstance, cursor: str | None, db_url: str) -> dg.SensorResult:
    resources = sensor_resources(db_url)
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
        return defs.resolve_sensor_def("rules_changed_sensor").evaluate_tick(context)


def _age_rules(engine: sa.Engine, seconds: int) -> None:
    """Another connection dates the current rules `seconds` back (as if set that long ago)."""
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE ba_rules SET created_at = now() - make_interval(secs => :s) "
                             "WHERE version = (SELECT max(version) FROM ba_rules)"), {"s": seconds})


def _fail(instance: dg.DagsterInstance, request: dg.RunRequest) -> None:
    """A run for the request that ended FAILURE (what a config-change sweep that broke leaves)."""
    instance.create_run_for_job(job_def=cs.customer_status_sweep_job, status=dg.DagsterRunStatus.FAILURE,
                                tags=request.tags)


def test_rules_changed_twice_within_a_minute_are_swept_once_for_the_latest(
    dagster_env: Settings, db_url: str, engine: sa.Engine
) -> None:
    """Two edits 30 s apart: no run while the latest is under a minute old; then one run, for the latest rules."""
    with dg.instance_for_test() as instance:
        cursor = _tick(instance, None, db_url).cursor
        set_rules(engine, Rules.parse("MINOR=0,ADULT=21,SENIOR=67"))
        _age_rules(engine, 30)
        latest = Rules.parse("MINOR=0,ADULT=22,SENIOR=67")
        set_rules(engine, latest)
        waiting = _tick(instance, cursor, db_url)
        assert waiting.run_requests == [] and "swept once they are 60s old" in (waiting.skip_message or "")
        _age_rules(engine, 61)
        [request] = _tick(instance, waiting.cursor or cursor, db_url).run_requests
        assert request.run_key == latest.fingerprint


def test_failed_attempts_are_retried_with_a_growing_delay_and_alerted_once(
    dagster_env: Settings, db_url: str, engine: sa.Engine, alerts: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed attempt the next waits the base delay, after two it waits twice that; one alert in all."""
    monkeypatch.setattr(rules_sensor, "RULES_RETRY_BASE_S", 2.0)
    with dg.instance_for_test() as instance:
        cursor = _tick(instance, None, db_url).cursor
        rules = Rules.parse("MINOR=0,ADULT=21,SENIOR=67")
        set_rules(engine, rules)
        _age_rules(engine, 120)
        result = _tick(instance, cursor, db_url)
        [first] = result.run_requests
        cursor = result.cursor
        _fail(instance, first)
        failed_at = time.monotonic()

        waiting = _tick(instance, cursor, db_url)
        assert waiting.run_requests == [] and "attempt 2" in (waiting.skip_message or "")
        cursor = waiting.cursor
        retried = wait_for(lambda: _tick(instance, cursor, db_url).run_requests, timeout=10, what="attempt 2")
        first_wait = time.monotonic() - failed_at
        assert retried[0].run_key == f"{rules.fingerprint}#2"
        _fail(instance, retried[0])
        failed_at = time.monotonic()

        waiting = _tick(instance, cursor, db_url)
        assert waiting.run_requests == [] and "attempt 3" in (waiting.skip_message or "")
        assert [rules_sensor.retry_delay_s(n) for n in (1, 2, 3)] == [2.0, 4.0, 8.0]
        cursor = waiting.cursor or cursor
        third = wait_for(lambda: _tick(instance, cursor, db_url).run_requests, timeout=10, what="attempt 3")
        second_wait = time.monotonic() - failed_at
        assert third[0].run_key == f"{rules.fingerprint}#3"
        # 2 s, then 4 s after the failed run's end (the test instance's SQLite stores it to the second: -1 s)
        assert 1.0 <= first_wait < second_wait and second_wait >= 3.0
    assert [a["kind"] for a in alerts] == ["rules_sweep_not_done"] and alerts[0]["rules_key"] == rules.fingerprint
