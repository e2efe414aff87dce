"""Sensors: rules changed → config-change sweep, interval-style queue drain, failure alerts, post-run checks."""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import logging
import time

import dagster as dg
import httpx

from batch_assets.orchestration.checks import asset_checks_job
from batch_assets.orchestration.config import QueueDrainConfig, SweepConfig
from batch_assets.orchestration.jobs import (
    customer_status_sweep_job,
    payment_queue_drain_job,
    subscription_expiry_job,
)
from batch_assets.orchestration.launch import SWEEP_JOBS, release_after_failure
from batch_assets.orchestration.resources import DatabaseResource
from batch_assets.settings import load_settings

log = logging.getLogger(__name__)

QUEUE_DRAIN_INTERVAL_S = 30
"""The next drain starts this many seconds after the previous one finished."""
QUEUE_DRAIN_MAX_SECONDS = 300
"""A sensor-started drain stops claiming after this long (the next one picks up the rest)."""

IN_PROGRESS = {
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
}


FIRST_VERSION_OF = "SELECT min(version) FROM ba_rules WHERE fingerprint = %(fingerprint)s"
# %(fingerprint)s — a rules fingerprint; the first version that had it (None for the built-in defaults)


def current_fingerprint(database: DatabaseResource) -> tuple[int, str, int | None]:
    """(current version, its fingerprint, the first version that ever had this fingerprint)."""
    from batch_assets.domains.customer_status.rules_store import current_rules

    with database.get_engine().connect() as conn:
        version, rules = current_rules(conn)
        first = conn.exec_driver_sql(FIRST_VERSION_OF, {"fingerprint": rules.fingerprint}).scalar()
    return version, rules.fingerprint, first


def rules_run_key(version: int, fingerprint: str, first_version: int | None) -> str:
    """The run key of the config-change sweep for a rules version: its fingerprint.

    Dagster never starts a second run for a key a sensor already used, so a change *back* to
    earlier rules (A → B → A) gets the fingerprint qualified by its version: two changes, two sweeps.
    """
    if first_version is None or first_version == version:
        return fingerprint
    return f"{fingerprint}@v{version}"


@dg.sensor(
    name="rules_changed_sensor",
    job=customer_status_sweep_job,
    minimum_interval_seconds=30,
    description="Starts one config-change sweep per rules change "
    "(run key = the rules fingerprint; the cursor is persisted).",
)
def rules_changed_sensor(context: dg.SensorEvaluationContext, database: DatabaseResource) -> dg.SensorResult:
    version, fingerprint, first_version = current_fingerprint(database)
    key = rules_run_key(version, fingerprint, first_version)
    if context.cursor == key:
        return dg.SensorResult(skip_reason=dg.SkipReason(f"rules unchanged (v{version}, {fingerprint})"))
    if context.cursor is None and version == 0:
        # Never changed since install: the default rules need no config-change sweep; remember them.
        return dg.SensorResult(skip_reason=dg.SkipReason(f"default rules ({fingerprint}); nothing changed"), cursor=key)
    # Dagster never starts a second run for a run key this sensor already used, so the same
    # change starts one sweep even if the cursor were lost (and the cursor survives daemon restarts).
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=key,
                run_config=dg.RunConfig(ops={"plan_sweep": SweepConfig(mode="config-change")}),
                tags={
                    "batch_assets/mode": "config-change",
                    "batch_assets/rules_fingerprint": fingerprint,
                    "batch_assets/rules_version": str(version),
                },
            )
        ],
        cursor=key,
    )


@dg.sensor(
    name="payment_queue_drain_sensor",
    job=payment_queue_drain_job,
    minimum_interval_seconds=10,
    description=f"Starts the next payment queue drain {QUEUE_DRAIN_INTERVAL_S}s after the last one finished; "
    "never two at once, and none while a resident `queue work` run (the same job) is running.",
)
def payment_queue_drain_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    records = context.instance.get_run_records(
        filters=dg.RunsFilter(job_name=payment_queue_drain_job.name), limit=1
    )
    last = records[0] if records else None
    if last is not None:
        run = last.dagster_run
        if run.status in IN_PROGRESS:
            return dg.SensorResult(skip_reason=dg.SkipReason(f"drain {run.run_id} is {run.status.value}"))
        finished = last.end_time or (last.update_timestamp.timestamp() if last.update_timestamp else 0.0)
        wait_s = finished + QUEUE_DRAIN_INTERVAL_S - time.time()
        if wait_s > 0:
            return dg.SensorResult(skip_reason=dg.SkipReason(f"next drain in {wait_s:.0f}s"))
    # The run key names the previous run, so two racing ticks can never start two drains after it.
    previous = last.dagster_run.run_id if last is not None else "none"
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=f"drain-after:{previous}",
                run_config=dg.RunConfig(
                    ops={"drain_payment_queue": QueueDrainConfig(max_seconds=QUEUE_DRAIN_MAX_SECONDS, drain=True)}
                ),
            )
        ]
    )


def send_alert(text: str, payload: dict, webhook: str | None) -> bool:
    """Log the alert; POST it as JSON when a webhook is configured. Returns whether a POST succeeded."""
    log.error("ALERT %s", text)
    if not webhook:
        return False
    try:
        response = httpx.post(webhook, json={"text": text, **payload}, timeout=5.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:  # the alert is already logged; a broken webhook must not kill the sensor
        log.warning("alert webhook POST failed: %s", type(exc).__name__)
        return False
    return True


@dg.run_failure_sensor(
    name="run_failure_alert_sensor",
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Alerts on every failed run: an error log entry, plus a POST to BATCH_ASSETS_ALERT_WEBHOOK if set.",
)
def run_failure_alert_sensor(context: dg.RunFailureSensorContext) -> None:
    run = context.dagster_run
    error = context.failure_event.message if context.failure_event else "run failed"
    text = f"batch_assets: run {run.run_id} of {run.job_name} FAILED: {error}"
    context.log.error(text)
    if run.job_name in SWEEP_JOBS:
        release_after_failure(run.root_run_id or run.run_id, load_settings())
    send_alert(
        text,
        {"run_id": run.run_id, "job": run.job_name, "status": "FAILURE", "error": error},
        load_settings().alert_webhook,
    )


@dg.run_status_sensor(
    name="asset_checks_after_run_sensor",
    run_status=dg.DagsterRunStatus.SUCCESS,
    monitored_jobs=[customer_status_sweep_job, subscription_expiry_job, payment_queue_drain_job],
    request_job=asset_checks_job,
    description="Runs the asset checks after every successful sweep, expiry and queue drain.",
)
def asset_checks_after_run_sensor(context: dg.RunStatusSensorContext) -> dg.RunRequest:
    return dg.RunRequest(run_key=f"checks-after:{context.dagster_run.run_id}")


SENSORS = [rules_changed_sensor, payment_queue_drain_sensor, run_failure_alert_sensor, asset_checks_after_run_sensor]
