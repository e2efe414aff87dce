"""Sensor ticks with build_sensor_context inside dg.instance_for_test()."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest
import sqlalchemy as sa
from helpers import AlertWebhook, sensor_resources

from batch_assets.definitions import defs as load_defs
from batch_assets.orchestration.code_location import get_job
from batch_assets.reference.customer_status.rules import Rules
from batch_assets.reference.customer_status.rules_store import set_rules
from batch_assets.reference.customer_status.sensor import RulesSensorState
from batch_assets.reference.payments.dagster import QUEUE_DRAIN_INTERVAL_S, payment_queue_drain_job
from batch_assets.settings import Settings

pytestmark = pytest.mark.dagster

defs = load_defs()
payment_queue_drain_sensor = defs.resolve_sensor_def("payment_queue_drain_sensor")


def _tick(sensor_name: str, instance: dg.DagsterInstance, cursor: str | None, db_url: str) -> tuple:
    sensor = defs.resolve_sensor_def(sensor_name)
    resources = sensor_resources(db_url)
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
        result = sensor.evaluate_tick(context)
    return result, result.cursor


@pytest.mark.integration
def test_rules_changed_sensor_requests_one_sweep_per_rules_change(db_url: str, engine: sa.Engine) -> None:
    """Default rules: no run; a change: one config-change run keyed by its fingerprint; same cursor: nothing."""
    with dg.instance_for_test() as instance:
        first, cursor = _tick("rules_changed_sensor", instance, None, db_url)
        assert first.run_requests == [] and cursor is not None

        rules = Rules.parse("MINOR=0,ADULT=21,SENIOR=67")
        set_rules(engine, rules)
        _settle(engine)
        second, cursor = _tick("rules_changed_sensor", instance, cursor, db_url)
        [request] = second.run_requests
        assert request.run_key == rules.fingerprint
        config = request.run_config["ops"]["customer_status_sweep"]["ops"]["plan_sweep"]["config"]
        assert config["mode"] == "config-change"
        # The cursor moves only once a run for the fingerprint succeeded: record one.
        _succeed(instance, engine, request)
        _, cursor = _tick("rules_changed_sensor", instance, cursor, db_url)
        assert RulesSensorState.parse(cursor).swept == request.run_key

        # The persisted cursor (what the daemon hands back after a restart) starts nothing new.
        third, cursor_after = _tick("rules_changed_sensor", instance, cursor, db_url)
        assert third.run_requests == [] and cursor_after == cursor

        # A change back to earlier rules is a new change: a new key, so Dagster starts it.
        other = Rules.parse("MINOR=0,ADULT=18,SENIOR=70")
        set_rules(engine, other)
        _settle(engine)
        fourth, cursor = _tick("rules_changed_sensor", instance, cursor, db_url)
        _succeed(instance, engine, fourth.run_requests[0])
        _, cursor = _tick("rules_changed_sensor", instance, cursor, db_url)
        set_rules(engine, rules)
        _settle(engine)
        fifth, cursor = _tick("rules_changed_sensor", instance, cursor, db_url)
        [back] = fifth.run_requests
        assert fourth.run_requests[0].run_key == other.fingerprint
        assert back.run_key.startswith(rules.fingerprint + "@v") and back.run_key != request.run_key


def _settle(engine: sa.Engine) -> None:
    """Another connection dates the current rules two minutes back: past the sensor's one-minute debounce."""
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE ba_rules SET created_at = created_at - interval '2 minutes' "
                             "WHERE version = (SELECT max(version) FROM ba_rules)"))


def _succeed(instance: dg.DagsterInstance, engine: sa.Engine, request: dg.RunRequest) -> str:
    """Record a run for `request` that ended SUCCESS with a SUCCESS summary (what a real sweep leaves)."""
    from datetime import UTC, datetime

    from batch_assets import run_history
    from batch_assets.reference.customer_status.dagster import customer_status_sweep_job

    run = instance.create_run_for_job(job_def=customer_status_sweep_job, status=dg.DagsterRunStatus.SUCCESS,
                                      tags=request.tags)
    run_history.record(engine, run_id=run.run_id, job="customer_status_asset_job", status="SUCCESS",
                       started_at=datetime.now(UTC), summary={"status": "SUCCESS"})
    return run.run_id


def test_queue_drain_sensor_waits_for_the_last_drain_and_never_starts_two(
    dagster_env: Settings, engine: sa.Engine, db_url: str
) -> None:
    """Payments due, no drain yet: start one; one in progress: skip; one just finished: skip until the interval."""
    from batch_assets.reference.payments.queue import enqueue

    def tick() -> dg.SensorResult:
        with dg.build_sensor_context(
            instance=instance, resources=sensor_resources(db_url)
        ) as context:
            return payment_queue_drain_sensor.evaluate_tick(context)

    with dg.instance_for_test() as instance:
        enqueue(engine, 3)
        [request] = tick().run_requests
        assert request.run_key == "drain-after:none"

        running = instance.create_run_for_job(job_def=payment_queue_drain_job, status=dg.DagsterRunStatus.STARTED)
        result = tick()
        assert result.run_requests == [] and running.run_id in result.skip_message
        instance.delete_run(running.run_id)

        finished = get_job("payment_queue_drain_job").execute_in_process(
            run_config={"ops": {"drain_payment_queue": {"config": {"max_seconds": 2}}}}, instance=instance
        )
        assert finished.success
        enqueue(engine, 1)
        result = tick()
        assert result.run_requests == [] and "next drain in" in result.skip_message
        assert QUEUE_DRAIN_INTERVAL_S > 0


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict]]]:
    with AlertWebhook() as hook:
        yield hook.url, hook.received


def _alert_on(instance: dg.DagsterInstance, failed: dg.ExecuteInProcessResult) -> None:
    """Evaluate run_failure_alert_sensor on a failed in-process run, as the daemon would."""
    with dg.build_run_status_sensor_context(
        sensor_name="run_failure_alert_sensor", dagster_event=failed.get_run_failure_event(),
        dagster_instance=instance, dagster_run=failed.dagster_run, resources=sensor_resources(),
    ) as context:  # the sensor's resources (database, job_lock, alerts) are set up inside `with`
        defs.resolve_sensor_def("run_failure_alert_sensor")(context.for_run_failure())


def test_run_failure_sensor_logs_and_posts_an_alert(
    dagster_env: Settings, engine: sa.Engine, webhook: tuple[str, list[dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed run produces an alert POSTed to BATCH_ASSETS_ALERT_WEBHOOK naming run and job."""
    url, received = webhook
    monkeypatch.setenv("BATCH_ASSETS_ALERT_WEBHOOK", url)
    with dg.instance_for_test() as instance:
        failed = get_job("customer_status_sweep_job").execute_in_process(
            run_config={"ops": {"plan_sweep": {"config": {"page_size": 5000}}}},
            instance=instance,
            raise_on_error=False,
        )
        assert not failed.success
        _alert_on(instance, failed)
    [alert] = received
    assert alert["run_id"] == failed.run_id and alert["job"] == "customer_status_sweep_job"
    assert alert["status"] == "FAILURE"


def test_expiry_alerts_by_id_when_subscriptions_reach_the_maximum_retry_count(
    dagster_env: Settings, engine: sa.Engine, webhook: tuple[str, list[dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry run whose failures bring rows to max_retries POSTs one alert naming their ids, and no customer data."""
    url, received = webhook
    monkeypatch.setenv("BATCH_ASSETS_ALERT_WEBHOOK", url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO subscriptions (id, customer_id, expiry_date, status, retry_count, last_error) VALUES "
            "(11, gen_random_uuid(), '2025-05-01', 'FAILED', 2, 'x'), "
            "(12, gen_random_uuid(), '2025-05-02', 'FAILED', 1, 'x'), "
            "(13, gen_random_uuid(), '2025-05-03', 'ACTIVE', 0, NULL)")
        conn.exec_driver_sql("INSERT INTO enrollments (subscription_id, course_id) VALUES (11, 1), (12, 1), (13, 1)")
        # Every enrollment delete fails: the retried rows fail again.
        conn.exec_driver_sql(
            "CREATE FUNCTION test_fail() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'provoked'; END; $$")
        conn.exec_driver_sql(
            "CREATE TRIGGER test_fail BEFORE DELETE ON enrollments FOR EACH ROW EXECUTE FUNCTION test_fail()")
    with dg.instance_for_test() as instance:
        result = get_job("subscription_expiry_job").execute_in_process(
            run_config={"ops": {"expire_subscriptions": {"config": {
                "run_date": "2025-06-01", "retry_failed": True, "max_retries": 3}}}},
            instance=instance,
        )
    assert result.success
    [alert] = received
    assert alert["kind"] == "retries_exhausted" and alert["subscription_ids"] == [11]
    assert (alert["count"], alert["max_retries"], alert["run_id"]) == (1, 3, result.run_id)
    assert set(alert) == {"text", "kind", "count", "max_retries", "subscription_ids", "run_id", "job", "run_date"}
    with engine.connect() as conn:
        counts = dict(conn.exec_driver_sql("SELECT id, retry_count FROM subscriptions").all())
    assert counts == {11: 3, 12: 2, 13: 0}


def test_expiry_ends_failure_with_an_alert_after_three_consecutive_batch_failures(
    dagster_env: Settings, engine: sa.Engine, webhook: tuple[str, list[dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that fails with a connection-class error three times in a row: the run ends FAILURE and alerts."""
    url, received = webhook
    monkeypatch.setenv("BATCH_ASSETS_ALERT_WEBHOOK", url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO subscriptions (id, expiry_date, status) VALUES (21, '2025-05-01', 'ACTIVE')")
        conn.exec_driver_sql(
            "CREATE FUNCTION test_conn() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'provoked' USING ERRCODE = '08006'; END; $$")
        conn.exec_driver_sql(
            "CREATE TRIGGER test_conn BEFORE UPDATE ON subscriptions FOR EACH STATEMENT EXECUTE FUNCTION test_conn()")
    with dg.instance_for_test() as instance:
        result = get_job("subscription_expiry_job").execute_in_process(
            run_config={"ops": {"expire_subscriptions": {"config": {"run_date": "2025-06-01"}}}},
            instance=instance, raise_on_error=False,
        )
    assert not result.success
    [alert] = received
    assert (alert["kind"], alert["status"], alert["batch_retries"]) == ("batch_failures", "FAILURE", 2)
    assert "3 consecutive batch failures" in alert["text"]


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("workers", 100000, "invalid configuration: workers: "),
    ("run_date", "tomorrow", "invalid configuration: run_date: "),
])
def test_a_config_mistake_fails_at_plan_in_one_line_and_the_alert_gives_that_line(
    dagster_env: Settings, engine: sa.Engine, webhook: tuple[str, list[dict]], monkeypatch: pytest.MonkeyPatch,
    field: str, value: object, expected: str,
) -> None:
    """A value the launchpad lets through fails plan_sweep with one line naming the field; the alert carries it."""
    url, received = webhook
    monkeypatch.setenv("BATCH_ASSETS_ALERT_WEBHOOK", url)
    with dg.instance_for_test() as instance:
        failed = get_job("customer_status_sweep_job").execute_in_process(
            run_config={"ops": {"plan_sweep": {"config": {field: value}}}}, instance=instance, raise_on_error=False,
        )
        [failure] = failed.get_step_failure_events()
        description = failure.step_failure_data.user_failure_data.description
        assert description.startswith(expected) and "\n" not in description
        assert "ValidationError" not in description and "pydantic" not in description
        _alert_on(instance, failed)
    [alert] = received
    assert f"plan_sweep: {description}" in alert["text"] and "Steps failed" not in alert["text"]


@pytest.mark.parametrize(("job", "op", "field", "value"), [
    ("subscription_expiry_job", "expire_subscriptions", "batch_size", 100_000_000),
    ("subscription_expiry_job", "expire_subscriptions", "run_date", "tomorrow"),
    ("payment_queue_drain_job", "drain_payment_queue", "concurrency", 100_000),
    ("outbox_relay_job", "relay_outbox_events", "batch_size", 100_000_000),
    ("outbox_relay_job", "relay_outbox_events", "claim_lease_s", 10 ** 9),
])
def test_a_config_mistake_of_expiry_drain_or_relay_fails_in_one_line_and_the_alert_gives_it(
    dagster_env: Settings, engine: sa.Engine, webhook: tuple[str, list[dict]], monkeypatch: pytest.MonkeyPatch,
    job: str, op: str, field: str, value: object,
) -> None:
    """The first op of each job checks its config like plan_sweep: one line naming the field, no pydantic trace,
    and the failure alert quotes that line (not "Steps failed")."""
    url, received = webhook
    monkeypatch.setenv("BATCH_ASSETS_ALERT_WEBHOOK", url)
    with dg.instance_for_test() as instance:
        failed = get_job(job).execute_in_process(
            run_config={"ops": {op: {"config": {field: value}}}}, instance=instance, raise_on_error=False,
        )
        [failure] = failed.get_step_failure_events()
        user = failure.step_failure_data.user_failure_data
        assert user is not None, failure.step_failure_data.error
        description = user.description
        assert description.startswith(f"invalid configuration: {field}: ") and "\n" not in description
        assert "ValidationError" not in description and "pydantic" not in description
        _alert_on(instance, failed)
    [alert] = received
    assert f"{op}: {description}" in alert["text"] and "Steps failed" not in alert["text"]


def test_the_launchpad_refuses_an_unknown_mode_before_the_run() -> None:
    """The mode is a config Enum: Dagster's own config check (what the launchpad runs) refuses 'fulll'."""
    job = defs.resolve_job_def("customer_status_asset_job")
    config = {"ops": {"customer_status_sweep": {"ops": {"plan_sweep": {"config": {"mode": "fulll"}}}}}}
    with pytest.raises(dg.DagsterInvalidConfigError, match="mode"):
        dg.validate_run_config(job, config)
    config["ops"]["customer_status_sweep"]["ops"]["plan_sweep"]["config"]["mode"] = "config-change"
    dg.validate_run_config(job, config)
