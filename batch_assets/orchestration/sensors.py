"""Sensors: rules changed → config-change sweep, interval-style queue drain, failure alerts, post-run checks.

Built by `build_sensors` when the code location loads (definitions.py): the sensors that start
runs are RUNNING by default unless BATCH_ASSETS_AUTOMATION=off; the alerting sensor always runs.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import logging
import time

import dagster as dg

from batch_assets import run_history
from batch_assets.alerts import send_alert
from batch_assets.orchestration.checks import asset_checks_job
from batch_assets.orchestration.config import QueueDrainConfig, SweepConfig
from batch_assets.orchestration.jobs import (
    customer_status_asset_job,
    customer_status_sweep_job,
    outbox_relay_job,
    payment_queue_drain_job,
    subscription_expiry_job,
)
from batch_assets.orchestration.launch import SWEEP_JOBS, release_after_failure
from batch_assets.orchestration.resources import DatabaseResource
from batch_assets.orchestration.schedules import sweep_run_config
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


RULES_KEY_TAG = "batch_assets/rules_key"
"""Tag of every config-change run the sensor starts: the rules key (fingerprint, or fingerprint@vN)."""


def _swept(database: DatabaseResource, run_id: str) -> bool:
    """Whether the run recorded a SUCCESS summary (a SKIPPED sweep also ends Dagster-SUCCESS)."""
    summary = run_history.latest(database.get_engine(), run_id)
    return summary is not None and summary.get("status") == "SUCCESS"


def rules_changed(context: dg.SensorEvaluationContext, database: DatabaseResource) -> dg.SensorResult:
    """One successful config-change sweep per rules change: re-request until a run for the key succeeds.

    The cursor moves to a rules key only once a run tagged with it ended SUCCESS *and* recorded a
    SUCCESS summary; a run that ended SKIPPED (a CLI run held the lock) or FAILED is followed, on a
    later tick, by a new request (run key `<key>#<attempt>`, since Dagster never reuses a run key).
    """
    version, fingerprint, first_version = current_fingerprint(database)
    key = rules_run_key(version, fingerprint, first_version)
    if context.cursor == key:
        return dg.SensorResult(skip_reason=dg.SkipReason(f"rules unchanged (v{version}, {fingerprint})"))
    if context.cursor is None and version == 0:
        # Never changed since install: the default rules need no config-change sweep; remember them.
        return dg.SensorResult(skip_reason=dg.SkipReason(f"default rules ({fingerprint}); nothing changed"), cursor=key)
    runs = context.instance.get_runs(filters=dg.RunsFilter(tags={RULES_KEY_TAG: key}))
    running = [run for run in runs if run.status in IN_PROGRESS]
    if running:
        return dg.SensorResult(
            skip_reason=dg.SkipReason(f"config-change sweep {running[0].run_id} for {key} is {running[0].status.value}")
        )
    done = [run for run in runs if run.status == dg.DagsterRunStatus.SUCCESS and _swept(database, run.run_id)]
    if done:
        return dg.SensorResult(
            skip_reason=dg.SkipReason(f"rules {key} swept by run {done[0].run_id}"), cursor=key
        )
    attempt = len(runs) + 1
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=key if attempt == 1 else f"{key}#{attempt}",
                run_config=sweep_run_config(SweepConfig(mode="config-change")),
                tags={
                    "batch_assets/mode": "config-change",
                    RULES_KEY_TAG: key,
                    "batch_assets/rules_fingerprint": fingerprint,
                    "batch_assets/rules_version": str(version),
                    "batch_assets/attempt": str(attempt),
                },
            )
        ],
    )


def payment_queue_drain(context: dg.SensorEvaluationContext) -> dg.SensorResult:
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


SWEEP_JOB_NAMES = (*SWEEP_JOBS, customer_status_asset_job.name)
"""Jobs whose failed runs give back the sweep's lock and lease."""


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
    if run.job_name in SWEEP_JOB_NAMES:
        release_after_failure(run.root_run_id or run.run_id, load_settings())
    send_alert(
        text,
        {"run_id": run.run_id, "job": run.job_name, "status": "FAILURE", "error": error},
        load_settings().alert_webhook,
    )


def asset_checks_after_run(context: dg.RunStatusSensorContext) -> dg.RunRequest:
    return dg.RunRequest(run_key=f"checks-after:{context.dagster_run.run_id}")


def sensor_status(running: bool) -> dg.DefaultSensorStatus:
    return dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED


def build_sensors(*, running: bool) -> list[dg.SensorDefinition]:
    """Every sensor; those that start runs are RUNNING by default unless `running` is False."""
    status = sensor_status(running)
    return [
        dg.sensor(
            name="rules_changed_sensor",
            job=customer_status_asset_job,
            minimum_interval_seconds=30,
            default_status=status,
            description="Starts the config-change sweep of a rules change (run key = its fingerprint) and "
            "requests it again on later ticks until one run for that fingerprint succeeds.",
        )(rules_changed),
        dg.sensor(
            name="payment_queue_drain_sensor",
            job=payment_queue_drain_job,
            minimum_interval_seconds=10,
            default_status=status,
            description=f"Starts the next payment queue drain {QUEUE_DRAIN_INTERVAL_S}s after the last one "
            "finished; never two at once, and none while a resident `queue work` run (the same job) is running.",
        )(payment_queue_drain),
        run_failure_alert_sensor,
        dg.run_status_sensor(
            name="asset_checks_after_run_sensor",
            run_status=dg.DagsterRunStatus.SUCCESS,
            monitored_jobs=[customer_status_sweep_job, subscription_expiry_job, payment_queue_drain_job,
                            outbox_relay_job],
            request_job=asset_checks_job,
            default_status=status,
            description="Runs every asset check after each successful CLI sweep, expiry, queue drain and relay "
            "(the asset job runs its own checks).",
        )(asset_checks_after_run),
    ]
