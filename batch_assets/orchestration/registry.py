"""The job registry: every job of batch_assets, one line each.

`definitions.py` (the code location) and the CLI (through `orchestration.launch`) read it. A new
job is one folder, `batch_assets/reference/<name>/` with a `dagster.py` that declares its `SPEC`, and
one line in `JOB_MODULES` below (docs/DESIGN.md walks through adding one).

What spans the jobs is built here from their specs: the failure alert (which also gives back a
failed run's lock), the asset checks run after every successful CLI run, and the observation of
the business tables.
"""

# No `from __future__ import annotations`: Dagster reads the sensor annotations at runtime.

import importlib
import logging
from collections.abc import Sequence
from typing import Any

import dagster as dg
import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.errors import BatchAssetsError, ConfigError, error_text
from batch_assets.orchestration.automation import schedule_status, sensor_status
from batch_assets.orchestration.metadata import business_tables_observation_sensor
from batch_assets.orchestration.resources import AlertsResource, DatabaseResource, JobLockResource
from batch_assets.orchestration.spec import JobSpec
from batch_assets.orchestration.sweep_job import definitions_of as definitions_of  # moved: components import it there
from batch_assets.orchestration.watchdog import build_watchdog_sensor
from batch_assets.settings import Settings

log = logging.getLogger(__name__)

JOB_MODULES: dict[str, tuple[str, ...]] = {
    "batch_assets.reference.customer_status.dagster": (
        "customer_status_sweep_job", "customer_status_sweep_celery_job", "customer_status_asset_job"),
    "batch_assets.reference.subscriptions.dagster": ("subscription_expiry_job",),
    "batch_assets.reference.payments.dagster": ("payment_queue_drain_job", "payment_status_observation_job"),
    "batch_assets.orchestration.outbox_job": ("outbox_relay_job",),
    "batch_assets.orchestration.retention_job": ("retention_job",),
}
"""The product's jobs: each domain's `dagster.py` (its `SPEC`) and the job names that SPEC answers for
(`JobSpec.job_names`; tests/dagster/test_registry.py holds the two equal). A domain's module is imported
when one of its jobs is asked for: the CLI launching one job builds that job only, not every domain's
Dagster definitions (start-up, issue 20); the code location (`definitions.py`) asks for all of them."""


def _spec_in(module: str) -> JobSpec:
    spec: JobSpec = importlib.import_module(module).SPEC
    return spec


def __getattr__(name: str) -> Any:
    """`SPECS` (every product spec) and the shared jobs are built on first use, then kept as module attributes."""
    if name == "SPECS":
        value: Any = tuple(_spec_in(module) for module in JOB_MODULES)
    elif name == "asset_checks_job":
        value = _asset_checks_job()
    elif name == "business_tables_observation_job":
        value = _business_tables_observation_job()
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def _kept(name: str) -> Any:
    """A lazily built module attribute (`__getattr__` serves other modules only, not this module's own code)."""
    return globals()[name] if name in globals() else __getattr__(name)


def _product_specs() -> tuple[JobSpec, ...]:
    specs: tuple[JobSpec, ...] = _kept("SPECS")
    return specs


def _product_spec_named(job_name: str) -> JobSpec | None:
    """The product spec answering for `job_name`, importing only its domain's module (unless SPECS was built
    or replaced, e.g. by a test adding a job: then SPECS is the list)."""
    if "SPECS" in globals():
        return next((spec for spec in globals()["SPECS"] if job_name in spec.job_names), None)
    module = next((module for module, names in JOB_MODULES.items() if job_name in names), None)
    return None if module is None else _spec_in(module)


def declared() -> tuple[tuple[JobSpec, ...], list[ConfigError]]:
    """The jobs declared in defs.yaml files under BATCH_ASSETS_DEFS_DIR (CONTRACT §9, §10), and the declarations
    that cannot work (each names its file and attribute). Built once per state of the files."""
    from batch_assets.orchestration.components.loader import load_declarations

    try:
        found = load_declarations()
    except ConfigError as exc:  # BATCH_ASSETS_DEFS_DIR itself is unusable
        return (), [exc]
    cached = _DECLARED.get(id(found))
    if cached is not None and cached[0] is found:
        return cached[1], cached[2]
    taken = {name for names in JOB_MODULES.values() for name in names}
    if "SPECS" in globals():  # built (or extended by a test): its names
        taken.update(name for spec in globals()["SPECS"] for name in spec.job_names)
    specs: list[JobSpec] = []
    errors: list[ConfigError] = list(found.errors)
    for loaded in found.components:
        build = getattr(loaded.component, "job_specs", None)
        if build is None:
            continue
        try:
            built = list(build())
        except ConfigError as exc:
            from batch_assets.orchestration.components.loader import from_config_error

            errors.append(from_config_error(loaded.path, exc))
            continue
        clash = next((name for spec in built for name in spec.job_names if name in taken), None)
        if clash is not None:
            from batch_assets.orchestration.components.loader import DeclarationError

            clashing = DeclarationError(loaded.path, "name", f"{clash!r} is already a job of the code location")
            clashing.declares = clash
            errors.append(clashing)
            continue
        taken.update(name for spec in built for name in spec.job_names)
        specs.extend(built)
    _DECLARED.clear()
    _DECLARED[id(found)] = (found, tuple(specs), errors)
    return tuple(specs), errors


_DECLARED: dict[int, tuple[Any, tuple[JobSpec, ...], list[ConfigError]]] = {}


def all_specs() -> tuple[JobSpec, ...]:
    """The product's jobs and every declared job that can be built (a broken declaration is left out)."""
    return (*_product_specs(), *declared()[0])


def spec_for(job_name: str) -> JobSpec:
    """The spec of a job by any of its names (op job, executor variant, asset job); ConfigError if none.
    Only the module of that job is imported (a product job's domain, or the declarations for a declared job)."""
    found = _product_spec_named(job_name)
    if found is not None:
        return found
    found = next((spec for spec in declared()[0] if job_name in spec.job_names), None)
    if found is not None:
        return found
    specs = all_specs()
    raise ConfigError(f"unknown job {job_name!r}; known: {', '.join(s.name for s in specs)}", field="job")


def op_jobs() -> list[dg.JobDefinition]:
    """Every op job a launch may target (the jobs and their executor variants)."""
    return [job for spec in all_specs() for job in spec.op_jobs]


def asset_jobs() -> list[Any]:
    return [job for spec in all_specs() for job in spec.asset_jobs]


def assets() -> list[Any]:
    """Every asset; a table two declared sweeps read is one asset spec."""
    found: dict[Any, Any] = {}
    for spec in all_specs():
        for asset in spec.assets:
            key = asset.key if isinstance(asset, dg.AssetSpec) else id(asset)
            found.setdefault(key, asset)
    return list(found.values())


def asset_checks() -> list[Any]:
    return [check for spec in all_specs() for check in spec.asset_checks]


def _asset_checks_job() -> Any:
    return dg.define_asset_job(
        "asset_checks_job",
        selection=dg.AssetSelection.checks(*(check for spec in _product_specs() for check in spec.asset_checks)),
        description="Evaluate every asset check (started after each successful CLI sweep, expiry, drain and relay).",
    )


def _business_tables_observation_job() -> Any:
    return dg.define_asset_job(
        "business_tables_observation_job",
        selection=dg.AssetSelection.assets(
            *(a.key for spec in _product_specs() for a in spec.assets if isinstance(a, dg.SourceAsset))),
        description="Observe the business tables (row counts by status).",
    )


@dg.run_failure_sensor(
    name="run_failure_alert_sensor",
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Alerts on every failed run: an error log entry, plus a POST to BATCH_ASSETS_ALERT_WEBHOOK if set. "
    "A failed run of a job that holds a lock gives it back at once.",
)
def run_failure_alert_sensor(context: dg.RunFailureSensorContext, database: DatabaseResource,
                             job_lock: JobLockResource, alerts: AlertsResource) -> None:
    run = context.dagster_run
    error = _failure_line(context)
    text = f"batch_assets: run {run.run_id} of {run.job_name} FAILED: {error}"
    context.log.error(text)
    release = next((s.release_after_failure for s in all_specs() if run.job_name in s.job_names), None)
    if release is not None:
        try:
            engine = database.get_engine()
        except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:  # the alert must still go out
            log.warning("run %s: lock and lease not released, they will expire: %s", run.run_id, error_text(exc))
        else:
            release(run.root_run_id or run.run_id, engine, job_lock.redis_url)
    alerts.send(text, {"run_id": run.run_id, "job": run.job_name, "status": "FAILURE", "error": error})


def _failure_line(context: dg.RunFailureSensorContext) -> str:
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
    """Checks after a successful run that changed something (CONTRACT §8 "quiet when idle").

    A run whose summary says `changed` 0 (a drain that found nothing, a sweep with nothing due, a
    SKIPPED run) leaves every checked table as it was: no check run. A run without a readable summary
    is checked.
    """
    run_id = context.dagster_run.run_id
    changed = _changed_by(database, run_id)
    if changed == 0:
        return dg.SkipReason(f"run {run_id} changed nothing: no check run")
    return dg.RunRequest(run_key=f"checks-after:{run_id}")


def _changed_by(database: DatabaseResource, run_id: str) -> int | None:
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


def resources(settings: Settings) -> dict[str, Any]:
    """The resources every job shares plus each job's own (e.g. the outbox sink), chosen from `settings`."""
    return resources_of(all_specs(), settings)


def resources_of(specs: Sequence[JobSpec], settings: Settings) -> dict[str, Any]:
    """The shared resources plus the own resources of `specs` (the CLI binds one job's only)."""
    from batch_assets.orchestration.resources import default_resources

    chosen = default_resources()
    for spec in specs:
        if spec.resources is not None:
            chosen.update(spec.resources(settings))
    return chosen


def watched_job_names() -> list[str]:
    """Every job of the code location, whose STARTED runs the dead-run watchdog judges."""
    return [*(name for spec in all_specs() for name in spec.job_names), "asset_checks_job",
            "business_tables_observation_job"]


def schedules(timezone: str, *, running: bool) -> list[dg.ScheduleDefinition]:
    """Every job's schedules, in `timezone`, RUNNING or STOPPED by default."""
    status = schedule_status(running)
    return [s for spec in all_specs() if spec.schedules for s in spec.schedules(timezone, status)]


def sensors(*, running: bool) -> list[dg.SensorDefinition]:
    """Every job's sensors plus the shared ones; those that start runs are RUNNING unless `running` is False.
    The failure alert and the dead-run watchdog (they start no runs) always run."""
    status = sensor_status(running)
    return [
        *(s for spec in all_specs() if spec.sensors for s in spec.sensors(status)),
        run_failure_alert_sensor,
        business_tables_observation_sensor(_kept("business_tables_observation_job"), status),
        build_watchdog_sensor(watched_job_names()),
        dg.run_status_sensor(
            name="asset_checks_after_run_sensor",
            run_status=dg.DagsterRunStatus.SUCCESS,
            monitored_jobs=[spec.job for spec in all_specs()],
            request_job=_kept("asset_checks_job"),
            default_status=status,
            description="Runs every asset check after each successful CLI sweep, expiry, queue drain and relay "
            "that changed something (a run that changed nothing starts no check run; the asset job runs its "
            "own checks).",
        )(asset_checks_after_run),
    ]


# SPECS, asset_checks_job and business_tables_observation_job are module attributes built on first use (__getattr__).
__all__ = ["JOB_MODULES", "all_specs", "asset_checks", "asset_jobs", "assets", "declared",
           "op_jobs", "resources", "resources_of", "schedules",
           "sensors", "spec_for"]
