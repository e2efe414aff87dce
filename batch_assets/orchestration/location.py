"""A code location's Dagster definitions built from a `Project`: its own jobs, each declaration's definitions (by
the declaration's own `build_defs` route) and what spans the jobs: the failure alert (which also gives back a failed
run's lock), the asset checks run after every successful CLI run, the observation of the business tables and the
dead-run watchdog.
"""

# No `from __future__ import annotations`: Dagster reads the sensor annotations at runtime.

import logging
from collections.abc import Sequence
from typing import Any

import dagster as dg
import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.errors import BatchAssetsError, error_text
from batch_assets.orchestration.automation import schedule_status, sensor_status
from batch_assets.orchestration.metadata import business_tables_observation_sensor
from batch_assets.orchestration.project import Project
from batch_assets.orchestration.resources import AlertsResource, DatabaseResource, JobLockResource
from batch_assets.orchestration.spec import JobSpec
from batch_assets.orchestration.watchdog import build_watchdog_sensor
from batch_assets.settings import Settings

log = logging.getLogger(__name__)

SHARED_JOBS = ("asset_checks_job", "business_tables_observation_job")


def definitions(project: Project, settings: Settings, *, running: bool) -> dg.Definitions:
    """Every definition of the code location; a declaration that cannot work is left out, logged, and named in the
    location's metadata (`batch-assets jobs list` refuses it with exit 2)."""
    own = project.own_specs()
    declared, errors = project.declared()
    broken = [str(error) for error in errors]
    for line in broken:
        log.error("declared job not loaded: %s", line)
    checks_job, observation_job = asset_checks_job(own), business_tables_observation_job(own)
    specs = (*own, *declared)
    location = dg.Definitions(
        metadata={"declaration_errors": dg.MetadataValue.json(broken)} if broken else None,
        assets=[a for spec in own for a in spec.assets],
        asset_checks=[c for spec in own for c in spec.asset_checks],
        jobs=[*(j for spec in own for j in (*spec.op_jobs, *spec.asset_jobs)), checks_job, observation_job],
        schedules=[s for spec in own if spec.schedules
                   for s in spec.schedules(settings.timezone, schedule_status(running))],
        sensors=sensors(specs, checks_job, observation_job, running=running),
        resources=resources_of(specs, settings),
    )
    # Each declaration reaches Dagster by its own route (`definitions`, what its `build_defs` returns in a team's
    # project), here with this location's defaults: the location's resources, schedules and outbox.
    parts = [loaded.component.definitions(project.defaults, loaded.path.parent)
             for loaded in project.built_declarations()]
    return dg.Definitions.merge(location, *parts)


def resources_of(specs: Sequence[JobSpec], settings: Settings) -> dict[str, Any]:
    """The shared resources plus the own resources of `specs` (the CLI binds one job's only)."""
    from batch_assets.orchestration.resources import default_resources

    chosen = default_resources()
    for spec in specs:
        if spec.resources is not None:
            chosen.update(spec.resources(settings))
    return chosen


def asset_checks_job(specs: Sequence[JobSpec]) -> Any:
    return dg.define_asset_job(
        "asset_checks_job",
        selection=dg.AssetSelection.checks(*(check for spec in specs for check in spec.asset_checks)),
        description="Evaluate every asset check (started after each successful CLI sweep, expiry, drain and relay).",
    )


def business_tables_observation_job(specs: Sequence[JobSpec]) -> Any:
    return dg.define_asset_job(
        "business_tables_observation_job",
        selection=dg.AssetSelection.assets(
            *(a.key for spec in specs for a in spec.assets if isinstance(a, dg.SourceAsset))),
        description="Observe the business tables (row counts by status).",
    )


def failure_alert_sensor(specs: Sequence[JobSpec]) -> dg.SensorDefinition:
    @dg.run_failure_sensor(
        name="run_failure_alert_sensor",
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Alerts on every failed run: an error log entry, plus a POST to BATCH_ASSETS_ALERT_WEBHOOK if "
        "set. A failed run of a job that holds a lock gives it back at once.",
    )
    def run_failure_alert_sensor(context: dg.RunFailureSensorContext, database: DatabaseResource,
                                 job_lock: JobLockResource, alerts: AlertsResource) -> None:
        run = context.dagster_run
        error = failure_line(context)
        text = f"batch_assets: run {run.run_id} of {run.job_name} FAILED: {error}"
        context.log.error(text)
        release = next((s.release_after_failure for s in specs if run.job_name in s.job_names), None)
        if release is not None:
            try:
                engine = database.get_engine()
            except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:  # the alert must still go out
                log.warning("run %s: lock and lease not released, they will expire: %s", run.run_id,
                            error_text(exc))
            else:
                release(run.root_run_id or run.run_id, engine, job_lock.redis_url)
        alerts.send(text, {"run_id": run.run_id, "job": run.job_name, "status": "FAILURE", "error": error})

    return run_failure_alert_sensor


def failure_line(context: dg.RunFailureSensorContext) -> str:
    """What failed, in one line: the first failed step's own message (e.g. `invalid configuration: workers: ...`),
    else the run's failure message ("Steps failed: [...]" names only the steps)."""
    for event in context.get_step_failure_events():
        data = event.step_failure_data
        user = data.user_failure_data
        text = (user.description if user is not None else None) or (data.error.message if data.error else "")
        if text.strip():
            return f"{event.step_key}: {text.strip().splitlines()[0]}"
    return (context.failure_event.message if context.failure_event else None) or "run failed"


def asset_checks_after_run(context: dg.RunStatusSensorContext,
                           database: DatabaseResource) -> dg.RunRequest | dg.SkipReason:
    """Checks after a successful run that changed something ("quiet when idle").

    A run whose summary says `changed` 0 (a drain that found nothing, a sweep with nothing due, a SKIPPED run)
    leaves every checked table as it was: no check run. A run without a readable summary is checked.
    """
    run_id = context.dagster_run.run_id
    changed = changed_by(database, run_id)
    if changed == 0:
        return dg.SkipReason(f"run {run_id} changed nothing: no check run")
    return dg.RunRequest(run_key=f"checks-after:{run_id}")


def changed_by(database: DatabaseResource, run_id: str) -> int | None:
    """The `changed` count of the run's summary in run history, or None when there is none."""
    try:
        summary = run_history.latest(database.get_engine(), run_id)
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        log.warning("run %s: summary not readable (%s); its checks run", run_id, error_text(exc))
        return None
    if summary is None:
        return None
    if summary.get("status") == "SKIPPED":
        return 0
    return int(summary.get("changed") or 0)


def watched_job_names(specs: Sequence[JobSpec]) -> list[str]:
    """Every job of the code location, whose STARTED runs the dead-run watchdog judges."""
    return [*(name for spec in specs for name in spec.job_names), *SHARED_JOBS]


def sensors(specs: Sequence[JobSpec], checks_job: Any, observation_job: Any, *,
            running: bool) -> list[dg.SensorDefinition]:
    """Every job's sensors plus the shared ones; those that start runs are RUNNING unless `running` is False.
    The failure alert and the dead-run watchdog (they start no runs) always run."""
    status = sensor_status(running)
    return [
        *(s for spec in specs if spec.sensors for s in spec.sensors(status)),
        failure_alert_sensor(specs),
        business_tables_observation_sensor(observation_job, status),
        build_watchdog_sensor(watched_job_names(specs)),
        dg.run_status_sensor(
            name="asset_checks_after_run_sensor",
            run_status=dg.DagsterRunStatus.SUCCESS,
            monitored_jobs=[spec.job for spec in specs],
            request_job=checks_job,
            default_status=status,
            description="Runs every asset check after each successful CLI sweep, expiry, queue drain and relay "
            "that changed something (a run that changed nothing starts no check run; the asset job runs its "
            "own checks).",
        )(asset_checks_after_run),
    ]
