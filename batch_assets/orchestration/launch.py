"""CLI → a Dagster run on the instance → the run's summary.

Every job command runs its job *as a Dagster run* on the instance the UI shows: `open_instance` picks DAGSTER_HOME
(this repository's location gives a fresh one its dagster.yaml; a team's instance file is never written);
`launch_job` takes the job's spec, resolved once by the command, validates the config (ConfigError naming the
field, before anything is written), executes the job on a reconstructable pointer (so the multiprocess and celery
executors can rebuild it in other processes) and reads the summary that the job's final op recorded in run history.

Nothing here prints to stdout: the CLI prints the JSON summary as its last line. Dagster's console logger is set to
WARNING and writes to stderr.
"""

from __future__ import annotations

import fcntl
import logging
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa

from batch_assets.db.engine import create_engine, normalize_url, one_off_engine
from batch_assets.db.migrate import require_migrated
from batch_assets.errors import BatchAssetsError, ConfigError, error_text, first_line
from batch_assets.orchestration.budget import check_run_budget, parallel_steps
from batch_assets.orchestration.code_location import execute_in_code_location, reexecute_in_code_location
from batch_assets.orchestration.config import JobConfig
from batch_assets.orchestration.executors import sleep_while_a_step_waits_for_a_slot
from batch_assets.orchestration.instance_home import write_instance_config
from batch_assets.orchestration.ops import run_in_thread
from batch_assets.orchestration.project import Project, current
from batch_assets.orchestration.run_results import (
    LaunchResult,
    StepOutcomes,
    error_of,
    read_summary,
    reconcile,
    step_outcomes,
)
from batch_assets.orchestration.slot_wait import LAUNCH_ID_TAG, SlotWaitReporter
from batch_assets.orchestration.spec import JobSpec
from batch_assets.orchestration.watchdog import cli_process_tags, free_pool_slots
from batch_assets.settings import Settings
from batch_assets.settings_model import check_run_date

EXECUTORS = ("in_process", "multiprocess", "celery")
log = logging.getLogger(__name__)

__all__ = ["EXECUTORS", "LaunchResult", "StepOutcomes", "build_run_config", "config_error_text", "job_engine",
           "launch_job", "open_instance", "reconcile", "reexecute_from_failure", "validated_config"]


# --- the instance ------------------------------------------------------------------------------------------------


def ensure_instance(settings: Settings) -> Path:
    """This repository's Dagster instance directory, with a dagster.yaml (`instance_home.write_instance_config`) and
    its storage initialised; sets DAGSTER_HOME for this process."""
    home = write_instance_config(settings)
    _initialise_storage_once(home)
    return home


def _initialise_storage_once(home: Path) -> None:
    """Create the instance's storage under a file lock: two first runs at once on a fresh home would otherwise race
    to create the same SQLite tables and one would crash."""
    marker = home / ".batch_assets_initialised"
    if marker.exists():
        return
    with open(home / ".init.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            if not marker.exists():
                with dg.DagsterInstance.get():
                    pass
                marker.touch()
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


@contextmanager
def open_instance(project: Project, settings: Settings) -> Iterator[dg.DagsterInstance]:
    """The instance runs are recorded on: this repository's (its DAGSTER_HOME given our dagster.yaml when it has
    none), or a team's own DAGSTER_HOME, whose dagster.yaml is never written. A team's project without DAGSTER_HOME
    runs on a temporary instance, and says so."""
    import os

    if not project.is_team:
        ensure_instance(settings)
        with dg.DagsterInstance.get() as instance:
            yield instance
        return
    if os.environ.get("DAGSTER_HOME", "").strip():
        with dg.DagsterInstance.get() as instance:
            yield instance
        return
    print("warning: DAGSTER_HOME is not set: this run is kept in a temporary Dagster instance, not in your UI's; "
          "set DAGSTER_HOME to your instance's directory", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="batch-assets-instance-") as home, \
            dg.DagsterInstance.from_config(home) as instance:
        yield instance


@contextmanager
def job_engine(spec: JobSpec, settings: Settings) -> Iterator[sa.Engine]:
    """A one-connection engine on the job's database (a declaration's `database_url`, else the location's), for a
    short piece of work outside the run; disposed afterwards."""
    if spec.database_url is None:
        with one_off_engine(settings) as engine:
            yield engine
        return
    engine = create_engine(normalize_url(spec.database_url()), pool_size=1, max_overflow=0)
    try:
        yield engine
    finally:
        engine.dispose()


# --- config ------------------------------------------------------------------------------------------------------


def validated_config(spec: JobSpec, config: JobConfig | Mapping[str, Any] | None,
                     settings: Settings) -> tuple[JobConfig, Any]:
    """The job's config object and its validated settings (`to_settings()`, the one validation), its run date within
    the window of today that `settings` (the environment) give. `config` is the job's `JobConfig`, a dict of its
    fields, or None for the defaults; a bad value is a ConfigError naming the field, raised before anything runs."""
    cls = spec.config
    if config is None or isinstance(config, Mapping):
        config = cls.from_values(config)
    elif not isinstance(config, cls):
        raise ConfigError(f"expected {cls.__name__}, got {type(config).__name__}", field="config")
    plan = config.to_settings()
    check_run_date(plan, window_days=settings.run_date_window_days, timezone=settings.timezone)
    return config, plan


def build_run_config(spec: JobSpec, config: JobConfig, *, executor: str = "in_process",
                     max_concurrent: int | None = None,
                     executor_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run config for the job: its (validated) op config, the executor and a WARNING console logger."""
    if executor not in (*EXECUTORS, *spec.variants):
        raise ConfigError(f"must be one of {', '.join(EXECUTORS)}, got {executor!r}", field="executor")
    run_config: dict[str, Any] = {
        "ops": {spec.config_op: {"config": config.model_dump(mode="json")}},
        "loggers": {"console": {"config": {"log_level": "WARNING"}}},
    }
    if executor == "in_process":
        run_config["execution"] = {"config": {"in_process": {}}}
    elif executor == "multiprocess":
        run_config["execution"] = {"config": {"multiprocess": {"max_concurrent": max_concurrent or 0}}}
    elif executor_config:
        run_config["execution"] = {"config": dict(executor_config)}
    return run_config


def config_error_text(exc: dg.DagsterInvalidConfigError) -> str:
    """Dagster's first line ("Error in config for job X") and what each error says, on one line. The run config holds
    op fields and EnvVar names (resource values are bound by name), so the errors never show a resolved value."""
    details = "; ".join(first_line(error.message) for error in getattr(exc, "errors", ()) or ())
    head = first_line(str(exc))
    return f"{head}: {details}" if details else head


# --- launching -----------------------------------------------------------------------------------------------------


def launch_job(job: JobSpec | str, config: Any, *, settings: Settings, project: Project | None = None,
               tags: Mapping[str, str] | None = None, executor: str = "in_process", max_concurrent: int | None = None,
               executor_config: Mapping[str, Any] | None = None) -> LaunchResult:
    """Run the job as a Dagster run on the instance and return its run id, status and summary.

    `job` is the job's spec, resolved once by the caller (a job name is resolved here, once). `config` is the job's
    `JobConfig`, a dict of its fields or None. `executor`: "in_process" (the CLI), "multiprocess" (ranges in parallel
    processes, at most `max_concurrent`) or a variant's executor (e.g. "celery"; `executor_config` may set
    {"broker": "redis://..."}). Raises ConfigError (naming the field) before anything runs when the config is
    invalid.
    """
    project = project or current()
    spec = job if isinstance(job, JobSpec) else project.spec_for(job)
    name = spec.name
    if executor in spec.variants:
        name = spec.variants[executor].name
    elif executor not in ("in_process", "multiprocess"):
        raise ConfigError(f"{spec.name} has no {executor} variant", field="executor")
    # Whatever the caller built (a Config object, a dict, None) is validated here, before anything runs.
    config, plan = validated_config(spec, config, settings)
    run_config = build_run_config(spec, config, executor=executor, max_concurrent=max_concurrent,
                                  executor_config=executor_config)
    # What the run really opens must fit in what the server has free; a database with migrations pending is refused
    # here too, with the one line saying to migrate, not by a run failing on "relation ... does not exist".
    with job_engine(spec, settings) as engine:
        check_run_budget(engine, plan, parallel=parallel_steps(run_config))
        # The location's own database has its migration sets; one only a declaration names, the library's. A role
        # that lacks a grant the job needs is refused here too, with one line naming it.
        require_migrated(engine, project.migrations if spec.database_url is None else (),
                         project.privileges_of(spec))
    sleep_while_a_step_waits_for_a_slot()
    launch_id = uuid.uuid4().hex
    # The process tag lets the dead-run watchdog fail this run at once if this process dies (orchestration.watchdog).
    all_tags = {"batch_assets/launched_by": "cli", LAUNCH_ID_TAG: launch_id, **cli_process_tags(), **(tags or {})}
    with open_instance(project, settings) as instance, SlotWaitReporter(instance, launch_id):
        try:
            result = run_in_thread(
                lambda: execute_in_code_location(project, name, instance, run_config=run_config, tags=all_tags),
                name="batch-assets-run",
            )
        except dg.DagsterInvalidConfigError as exc:
            raise ConfigError(config_error_text(exc), field="run_config") from None
        except Exception as exc:  # the run started (or not) and its execution broke: report it, with its id
            launched = _crashed_launch(instance, launch_id, exc)
        else:
            launched = _result_of(instance, result, settings, spec)
        _release_after_failure(instance, spec, launched, launched.run_id, settings)
    return launched


def reexecute_from_failure(run_id: str, *, settings: Settings, project: Project | None = None,
                           executor: str | None = None, max_concurrent: int | None = None) -> LaunchResult:
    """Re-execute a failed run from failure: only its failed and not-run steps run (unfinished ranges resume)."""
    project = project or current()
    with open_instance(project, settings) as instance:
        parent = instance.get_run_by_id(run_id)
        if parent is None:
            raise ConfigError(f"no run {run_id!r} on this instance", field="run_id")
        if parent.status not in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
            raise ConfigError(f"run {run_id} is {parent.status.value}; only a FAILURE or CANCELED run is re-executed "
                              "from failure", field="run_id")
        spec = project.spec_for(parent.job_name)
        run_config = dict(parent.run_config)
        if executor == "in_process":
            run_config["execution"] = {"config": {"in_process": {}}}
        elif executor == "multiprocess":
            run_config["execution"] = {"config": {"multiprocess": {"max_concurrent": max_concurrent or 0}}}
        tags = {"batch_assets/launched_by": "cli", **cli_process_tags()}
        result = run_in_thread(
            lambda: reexecute_in_code_location(project, parent, instance, run_config=run_config, tags=tags),
            name="batch-assets-run",
        )
        launched = _result_of(instance, result, settings, spec)
        _release_after_failure(instance, spec, launched, parent.root_run_id or parent.run_id, settings)
    return launched


def _result_of(instance: dg.DagsterInstance, result: Any, settings: Settings, spec: JobSpec) -> LaunchResult:
    run_id = result.run_id
    run = instance.get_run_by_id(run_id)
    status = run.status.value if run is not None else ("SUCCESS" if result.success else "FAILURE")
    try:
        with job_engine(spec, settings) as engine:
            summary = read_summary(run_id, engine, spec, result.all_events)
        read_error = None
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        summary, read_error = None, f"the run's summary could not be read: {error_text(exc)}"
    summary = reconcile(summary, run_id=run_id, dagster_status=status,
                        steps=step_outcomes(result.all_events, spec.mapped_op),
                        error=error_of(result) or read_error)
    return LaunchResult(run_id=run_id, dagster_status=status, summary=summary)


def _crashed_launch(instance: dg.DagsterInstance, launch_id: str, exc: Exception) -> LaunchResult:
    """A launch whose execution raised: the run (found by its launch tag) is reported FAILURE with its id."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={LAUNCH_ID_TAG: launch_id}), limit=1)
    if not runs:
        raise exc
    run = runs[0]
    error = f"the run's execution broke: {error_text(exc)}"
    summary = reconcile(None, run_id=run.run_id, dagster_status=run.status.value,
                        steps=StepOutcomes((), frozenset()), error=error)
    return LaunchResult(run_id=run.run_id, dagster_status=run.status.value, summary=summary)


def _release_after_failure(instance: dg.DagsterInstance, spec: JobSpec, launched: LaunchResult, root_run_id: str,
                           settings: Settings) -> None:
    """A run that did not succeed gives back the lock and lease it may still hold (jobs that hold one), and its pool
    slots (a step whose execution broke never freed its own; the daemon would free them only later).

    Not when a step of it lost its celery worker (orchestration.celery.LOST_WORKER_TAG): that step may still run on a
    host cut off from the broker, and a holder on another host is never judged from here, so lease and lock are left
    to expire (the step's writes are fenced on the lease meanwhile), and its slot to the daemon.
    """
    if launched.dagster_status == "SUCCESS":
        return
    lost = _lost_worker(instance, launched.run_id)
    if lost is not None:
        log.warning("run %s: a step lost its celery worker %s; its lease and lock are left to expire",
                    launched.run_id, lost)
        return
    free_pool_slots(instance, launched.run_id)
    if spec.release_after_failure is not None:
        with job_engine(spec, settings) as engine:
            spec.release_after_failure(root_run_id, engine, settings.redis_url)


def _lost_worker(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """The celery worker a step of the run lost (the tag the celery executor sets), or None."""
    from batch_assets.orchestration.celery import LOST_WORKER_TAG

    run = instance.get_run_by_id(run_id)
    return None if run is None else run.tags.get(LOST_WORKER_TAG)
