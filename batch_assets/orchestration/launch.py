"""CLI → a Dagster run on the instance → the run's summary.

Every job command of the CLI runs its job *as a Dagster run* on the same instance
`dagster dev` shows (CONTRACT §2): `ensure_instance` picks DAGSTER_HOME (or the
project-local `.batch_assets/dagster_home`) and gives it a dagster.yaml;
`launch_job` validates the config (ConfigError naming the field, before anything
is written), executes the job with `dg.execute_job` on a reconstructable pointer
(so the multiprocess and celery executors can rebuild it in other processes), and
reads the summary that the job's final op recorded in run history.

Nothing here prints to stdout: the CLI prints the JSON summary as its last line.
Dagster's console logger is set to WARNING and writes to stderr.
"""

from __future__ import annotations

import fcntl
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.db.engine import is_transient, one_off_engine
from batch_assets.db.migrate import require_migrated
from batch_assets.errors import BatchAssetsError, ConfigError, error_text, first_line
from batch_assets.orchestration.budget import check_run_budget, parallel_steps
from batch_assets.orchestration.config import JobConfig
from batch_assets.orchestration.executors import sleep_while_a_step_waits_for_a_slot
from batch_assets.orchestration.instance_home import repo_root as repo_root  # re-exported: cli.tools, tests
from batch_assets.orchestration.instance_home import write_instance_config
from batch_assets.orchestration.ops import run_in_thread
from batch_assets.orchestration.registry import spec_for
from batch_assets.orchestration.spec import JobSpec
from batch_assets.orchestration.watchdog import cli_process_tags, free_pool_slots, waiting_for_slot
from batch_assets.settings import Settings
from batch_assets.settings_model import check_run_date

EXECUTORS = ("in_process", "multiprocess", "celery")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchResult:
    run_id: str
    dagster_status: str
    """The Dagster run status: SUCCESS, FAILURE, CANCELED, ..."""
    summary: dict[str, Any] | None
    """The job's summary (CONTRACT §2 keys); a FAILURE summary when the run failed before recording one."""


def ensure_instance(settings: Settings) -> Path:
    """The Dagster instance directory, with a dagster.yaml (`instance_home.write_instance_config`) and its
    storage initialised; sets DAGSTER_HOME for this process."""
    home = write_instance_config(settings)
    _initialise_storage_once(home)
    return home


def _initialise_storage_once(home: Path) -> None:
    """Create the instance's storage under a file lock: two first runs at once on a fresh home
    would otherwise race to create the same SQLite tables and one would crash."""
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


def get_job(job_name: str) -> dg.JobDefinition:
    """The job with its resources bound as in the code location (the reconstructable target).

    Resources are built at call time, so they follow this process's environment. Only that job's module
    is imported and only its spec's resources are built (start-up, issue 20: not every domain's).
    """
    from batch_assets.orchestration.registry import resources_of
    from batch_assets.settings import load_settings

    spec = spec_for(job_name)
    jobs = [job for job in spec.op_jobs if job.name == job_name]
    if not jobs:
        raise ConfigError(f"unknown job {job_name!r}", field="job")
    return dg.Definitions(jobs=jobs, resources=resources_of((spec,), load_settings())).resolve_job_def(job_name)


def validated_config(job_name: str, config: JobConfig | Mapping[str, Any] | None,
                     settings: Settings) -> tuple[JobConfig, Any]:
    """The job's config object and its validated settings (`to_settings()`, the one validation), its run date
    within the window of today that `settings` (the environment) give.

    `config` is the job's `JobConfig`, a dict of its fields, or None for the defaults; a bad value is
    a ConfigError naming the field, raised before anything runs.
    """
    cls = spec_for(job_name).config
    if config is None or isinstance(config, Mapping):
        config = cls.from_values(config)
    elif not isinstance(config, cls):
        raise ConfigError(f"expected {cls.__name__}, got {type(config).__name__}", field="config")
    plan = config.to_settings()
    check_run_date(plan, window_days=settings.run_date_window_days, timezone=settings.timezone)
    return config, plan


def build_run_config(
    job_name: str,
    config: JobConfig,
    *,
    executor: str = "in_process",
    max_concurrent: int | None = None,
    executor_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run config for `job_name`: the job's (validated) op config, the executor and a WARNING console logger."""
    spec = spec_for(job_name)
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


def launch_job(
    job_name: str,
    config: Any,
    *,
    settings: Settings,
    tags: Mapping[str, str] | None = None,
    executor: str = "in_process",
    max_concurrent: int | None = None,
    executor_config: Mapping[str, Any] | None = None,
) -> LaunchResult:
    """Run `job_name` as a Dagster run on the instance and return its run id, status and summary.

    `config` is the job's `JobConfig` (SweepConfig, ExpiryConfig, ...), a dict of its fields or None.
    `executor`: "in_process" (the CLI), "multiprocess" (ranges in parallel processes, at most
    `max_concurrent`) or "celery" (the sweep's ranges on celery workers; `executor_config`
    may set {"broker": "redis://..."}).
    Raises ConfigError (naming the field) before anything runs when the config is invalid.
    """
    spec = spec_for(job_name)
    name = job_name
    if executor in spec.variants:
        name = spec.variants[executor].name
    elif executor not in ("in_process", "multiprocess"):
        raise ConfigError(f"{job_name} has no {executor} variant", field="executor")
    # Whatever the caller built (a Config object, a dict, None) is validated here, before anything runs:
    # a library caller's object may never have been through to_settings() (cheap, so the CLI's own early
    # call costs nothing worth saving).
    config, plan = validated_config(job_name, config, settings)
    run_config = build_run_config(
        name, config, executor=executor, max_concurrent=max_concurrent, executor_config=executor_config
    )
    # What the run really opens (its ranges at once under this executor, plus the other jobs) must fit in what the
    # server has free: otherwise it is refused here, naming the numbers, before anything runs (budget.py). A database
    # with migrations pending is refused here too, not by a run failing on "relation ... does not exist".
    with one_off_engine(settings) as engine:
        check_run_budget(engine, plan, parallel=parallel_steps(run_config))
        require_migrated(engine)
    ensure_instance(settings)
    sleep_while_a_step_waits_for_a_slot()  # a CLI drain or expiry loads only its own job module, not the sweep's
    launch_id = uuid.uuid4().hex
    # The process tag lets the dead-run watchdog fail this run at once if this process dies (orchestration.watchdog).
    all_tags = {"batch_assets/launched_by": "cli", LAUNCH_ID_TAG: launch_id, **cli_process_tags(), **(tags or {})}
    with dg.DagsterInstance.get() as instance, SlotWaitReporter(instance, launch_id):
        try:
            result = run_in_thread(
                lambda: execute_in_code_location(name, instance, run_config=run_config, tags=all_tags),
                name="batch-assets-run",
            )
        except dg.DagsterInvalidConfigError as exc:
            raise ConfigError(config_error_text(exc), field="run_config") from None
        except Exception as exc:  # the run started (or not) and its execution broke: report it, with its id
            launched = _crashed_launch(instance, launch_id, exc)
        else:
            launched = _result_of(instance, result, settings, spec)
    _release_after_failure(spec, launched, launched.run_id, settings)
    return launched


LAUNCH_ID_TAG = "batch_assets/launch_id"
WORKSPACE_FILE = "workspace.yaml"
REPOSITORY_NAME = "__repository__"
"""The repository name Dagster gives the code location's `Definitions` (what `dagster dev` shows)."""


def workspace_job_origin(job_name: str) -> Any:
    """The job's origin in the code location `dagster dev -w workspace.yaml` loads (location and repository name).

    A run that carries it shows under its job in the UI (the job's Runs tab, the sparklines, the Overview
    timeline filter on the repository label it gives), and the code location's run-status sensors (the
    failure alert, the checks after a run) see it as one of theirs (CONTRACT §8 "one view").
    """
    # Dagster has no public constructor of a job's remote origin outside a workspace process; these are the
    # classes `dagster job launch` builds it from, read from the same workspace.yaml.
    from dagster._core.remote_origin import RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    [location] = WorkspaceFileTarget(paths=[str(repo_root() / WORKSPACE_FILE)]).create_origins()
    return RemoteJobOrigin(repository_origin=RemoteRepositoryOrigin(location, REPOSITORY_NAME), job_name=job_name)


def config_error_text(exc: dg.DagsterInvalidConfigError) -> str:
    """Dagster's first line ("Error in config for job X") and what each error says, on one line.

    The run config holds op fields and EnvVar names (resource values are bound by name), so the errors name
    paths and variables, never a resolved value."""
    details = "; ".join(first_line(error.message) for error in getattr(exc, "errors", ()) or ())
    head = first_line(str(exc))
    return f"{head}: {details}" if details else head


def reconstructable_job(job_name: str) -> Any:
    """The reconstructable job `get_job(job_name)`, its definition built from this process's environment now.

    Dagster caches `ReconstructableJob.get_definition()` and `get_repository_definition()` (`lru_cache`s keyed
    by module, function and args, not by the environment), so a second launch of the same job in one process would
    reuse the first one's resources: a variable bound by EnvVar then (BATCH_ASSETS_LIMITS_URL,
    BATCH_ASSETS_PAYMENT_HANDLER) and unset since fails the run's config ("Error in config for job"), and one set
    since is ignored. Both caches are cleared before each launch.
    """
    recon = dg.build_reconstructable_job(__name__, "get_job", reconstructable_args=(job_name,))
    type(recon).get_definition.cache_clear()
    type(recon).get_repository_definition.cache_clear()
    return recon


def execute_in_code_location(
    job_name: str, instance: dg.DagsterInstance, *, run_config: Mapping[str, Any], tags: Mapping[str, str]
) -> Any:
    """`dg.execute_job` on the reconstructable job, with the run created under the job's workspace origin.

    The same steps as `execute_job` (create the run for the job, then execute it), with `remote_job_origin`
    and `job_code_origin` set on the run as a run launched from the UI has them.
    """
    from dagster._core.execution.api import execute_run

    recon = reconstructable_job(job_name)
    job_def = recon.get_definition()
    run = instance.create_run_for_job(
        job_def=job_def,
        run_config=run_config,
        tags={**job_def.run_tags, **tags},
        remote_job_origin=workspace_job_origin(job_name),
        job_code_origin=recon.get_python_origin(),
    )
    return execute_run(recon, run, instance, raise_on_error=False)


def reexecute_in_code_location(
    parent: Any, instance: dg.DagsterInstance, *, run_config: Mapping[str, Any], tags: Mapping[str, str]
) -> Any:
    """Re-execute `parent` from failure, the new run created under the job's workspace origin.

    The steps of `dg.execute_job(..., reexecution_options=ReexecutionOptions.from_failure(...))` (the failed and
    not-run steps, the others' outputs reused from the parent), with `remote_job_origin` set like
    `execute_in_code_location`: without it the re-executed run is missing from its job's Runs tab, sparkline
    and timeline (CONTRACT §8 "one view"), though its parent is there.
    """
    from dagster._core.execution.api import create_execution_plan, execute_run
    from dagster._core.execution.plan.state import KnownExecutionState

    recon = reconstructable_job(parent.job_name)
    job_def = recon.get_definition()
    step_keys, known_state = KnownExecutionState.build_resume_retry_reexecution(instance=instance, parent_run=parent)
    plan = create_execution_plan(recon, run_config, step_keys_to_execute=step_keys, known_state=known_state,
                                 tags=parent.tags)
    run = instance.create_run_for_job(
        job_def=job_def,
        execution_plan=plan,
        run_config=run_config,
        tags={**job_def.run_tags, **tags},
        op_selection=parent.op_selection,
        resolved_op_selection=parent.resolved_op_selection,
        root_run_id=parent.root_run_id or parent.run_id,
        parent_run_id=parent.run_id,
        remote_job_origin=workspace_job_origin(parent.job_name),
        job_code_origin=recon.get_python_origin(),
    )
    return execute_run(recon, run, instance, raise_on_error=False)


SLOT_WAIT_POLL_S = 5.0
"""How often a CLI run looks whether a step of it waits for a pool slot (nothing is read before the first poll)."""
SLOT_WAIT_REPEAT_S = 60.0
"""While the same steps keep waiting, the line is repeated this often."""


class SlotWaitReporter:
    """While a CLI run executes: a line on stderr when a step of it waits for a slot of the application database's
    pool (budget.APP_DATABASE_POOL), naming the runs that hold the slots, and one when it no longer waits.
    Dagster waits silently otherwise (its "blocked" event is a DEBUG-level engine event, and the CLI's console
    shows WARNING). A run shorter than SLOT_WAIT_POLL_S reads nothing."""

    def __init__(self, instance: dg.DagsterInstance, launch_id: str) -> None:
        self.instance = instance
        self.launch_id = launch_id
        self.run_id: str | None = None
        self.waiting: list[str] = []
        self._since = self._reported = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="batch-assets-slot-wait", daemon=True)

    def __enter__(self) -> SlotWaitReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.waiting and not self._thread.is_alive():  # it got its slot since the last poll, or the run ended
            self.poll()

    def _watch(self) -> None:
        while not self._stop.wait(SLOT_WAIT_POLL_S):
            self.poll()

    def poll(self) -> None:
        """Read whether the run's steps wait for a slot; say so when that changed (or every SLOT_WAIT_REPEAT_S)."""
        from batch_assets.orchestration.budget import APP_DATABASE_POOL

        try:
            if self.run_id is None:
                runs = self.instance.get_runs(filters=dg.RunsFilter(tags={LAUNCH_ID_TAG: self.launch_id}), limit=1)
                self.run_id = runs[0].run_id if runs else None
            waiting = waiting_for_slot(self.instance, self.run_id) if self.run_id else []
            info = self.instance.event_log_storage.get_concurrency_info(APP_DATABASE_POOL) if waiting else None
        except (sa.exc.SQLAlchemyError, OSError) as exc:  # the storage is busy or away: the next poll tells
            log.debug("slot wait not read: %s", exc)
            return
        now = time.monotonic()
        if info is not None and (waiting != self.waiting or now - self._reported >= SLOT_WAIT_REPEAT_S):
            self._since = self._since if self.waiting else now - SLOT_WAIT_POLL_S
            holders = sorted(info.active_run_ids - {self.run_id})
            log.warning("run %s: %s waiting for a slot of pool %s (%.0fs so far; limit %s, held by run(s) %s)",
                        self.run_id, ", ".join(waiting), APP_DATABASE_POOL, now - self._since, info.limit,
                        ", ".join(holders) or "none")
            self._reported = now
        elif self.waiting and not waiting:
            log.warning("run %s: no longer waiting for a slot of pool %s (waited about %.0fs)", self.run_id,
                        APP_DATABASE_POOL, now - self._since)
        self.waiting = waiting


def _crashed_launch(instance: dg.DagsterInstance, launch_id: str, exc: Exception) -> LaunchResult:
    """A launch whose execution raised: the run (found by its launch tag) is reported FAILURE with its id."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={LAUNCH_ID_TAG: launch_id}), limit=1)
    if not runs:
        raise exc
    run = runs[0]
    error = f"the run's execution broke: {error_text(exc)}"
    summary = reconcile(None, run_id=run.run_id, dagster_status=run.status.value, steps=StepOutcomes((), frozenset()),
                        error=error)
    return LaunchResult(run_id=run.run_id, dagster_status=run.status.value, summary=summary)


def _release_after_failure(spec: JobSpec, launched: LaunchResult, root_run_id: str, settings: Settings) -> None:
    """A run that did not succeed gives back the lock and lease it may still hold (jobs that hold one), and its
    pool slots (watchdog.free_pool_slots: a step whose execution broke never freed its own; the daemon would
    free them only free_slots_after_run_end_seconds after the run ended).

    Not when a step of it lost its celery worker (orchestration.celery.LOST_WORKER_TAG): that step may still run
    on a host cut off from the broker, and a holder on another host is never judged from here, so lease and lock
    are left to expire (the step's writes are fenced on the lease meanwhile), and its slot to the daemon.
    """
    if launched.dagster_status == "SUCCESS":
        return
    with dg.DagsterInstance.get() as instance:
        lost = _lost_worker(instance, launched.run_id)
        if lost is not None:
            log.warning("run %s: a step lost its celery worker %s; its lease and lock are left to expire",
                        launched.run_id, lost)
            return
        free_pool_slots(instance, launched.run_id)
    if spec.release_after_failure is not None:
        with one_off_engine(settings) as engine:
            spec.release_after_failure(root_run_id, engine, settings.redis_url)


def _lost_worker(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """The celery worker a step of the run lost (the tag the celery executor sets), or None."""
    from batch_assets.orchestration.celery import LOST_WORKER_TAG

    run = instance.get_run_by_id(run_id)
    return None if run is None else run.tags.get(LOST_WORKER_TAG)


def reexecute_from_failure(
    run_id: str,
    *,
    settings: Settings,
    executor: str | None = None,
    max_concurrent: int | None = None,
) -> LaunchResult:
    """Re-execute a failed run from failure: only its failed and not-run steps run (unfinished ranges resume)."""
    ensure_instance(settings)
    with dg.DagsterInstance.get() as instance:
        parent = instance.get_run_by_id(run_id)
        if parent is None:
            raise ConfigError(f"no run {run_id!r} on this instance", field="run_id")
        if parent.status not in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
            raise ConfigError(f"run {run_id} is {parent.status.value}; only a FAILURE or CANCELED run is re-executed "
                              "from failure", field="run_id")
        run_config = dict(parent.run_config)
        if executor == "in_process":
            run_config["execution"] = {"config": {"in_process": {}}}
        elif executor == "multiprocess":
            run_config["execution"] = {"config": {"multiprocess": {"max_concurrent": max_concurrent or 0}}}
        tags = {"batch_assets/launched_by": "cli", **cli_process_tags()}
        result = run_in_thread(
            lambda: reexecute_in_code_location(parent, instance, run_config=run_config, tags=tags),
            name="batch-assets-run",
        )
        launched = _result_of(instance, result, settings, spec_for(parent.job_name))
    _release_after_failure(spec_for(parent.job_name), launched, parent.root_run_id or parent.run_id, settings)
    return launched


SUMMARY_READ_ATTEMPTS = 5


def _result_of(instance: dg.DagsterInstance, result: Any, settings: Settings, spec: JobSpec) -> LaunchResult:
    run_id = result.run_id
    run = instance.get_run_by_id(run_id)
    status = run.status.value if run is not None else ("SUCCESS" if result.success else "FAILURE")
    try:
        summary = read_summary(run_id, settings, spec)
        read_error = None
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        summary, read_error = None, f"the run's summary could not be read: {error_text(exc)}"
    summary = reconcile(summary, run_id=run_id, dagster_status=status,
                        steps=step_outcomes(result.all_events, spec.mapped_op),
                        error=_error_of(result) or read_error)
    return LaunchResult(run_id=run_id, dagster_status=status, summary=summary)


@dataclass(frozen=True)
class StepOutcomes:
    """Which steps of a run were planned and which of them succeeded (from the run's own events)."""

    planned: tuple[str, ...]
    succeeded: frozenset[str]
    mapped_op: str | None = None
    """The op the job maps over cursor ranges (its JobSpec's `mapped_op`): its unfinished steps are ranges."""

    @property
    def unfinished(self) -> list[str]:
        return [key for key in self.planned if key not in self.succeeded]

    @property
    def unfinished_ranges(self) -> list[str]:
        """Mapping keys of the unfinished steps of the mapped op."""
        if not self.mapped_op:
            return []
        prefix = f"{self.mapped_op}["
        return [key[len(prefix):-1] for key in self.unfinished if key.startswith(prefix)]


def step_outcomes(events: Sequence[Any], mapped_op: str | None) -> StepOutcomes:
    """Every step that started, failed, was skipped or was mapped by a dynamic output, and those that succeeded.

    A mapped range that never started (its run died first) is still planned: its mapping key
    comes from the plan op's dynamic output.
    """
    planned: dict[str, None] = {}
    succeeded: set[str] = set()
    for event in events:
        key = event.step_key
        if key is None:
            continue
        if event.is_step_start or event.is_step_failure or event.is_step_skipped:
            planned.setdefault(key)
        if event.is_step_success:
            planned.setdefault(key)
            succeeded.add(key)
        if event.is_successful_output:
            mapping_key = getattr(event.step_output_data, "mapping_key", None)
            if mapping_key and mapped_op:
                planned.setdefault(f"{mapped_op}[{mapping_key}]")
    return StepOutcomes(tuple(planned), frozenset(succeeded), mapped_op)


def reconcile(
    summary: Mapping[str, Any] | None,
    *,
    run_id: str,
    dagster_status: str,
    steps: StepOutcomes,
    error: str | None,
) -> dict[str, Any]:
    """The run's summary, made truthful: its status is the Dagster run's own outcome and every step's.

    Summaries are what the ops recorded; an op that crashed (or never ran) recorded nothing, so
    a summary alone can say SUCCESS for a run that left whole ranges undone. Here a run that did
    not end SUCCESS in Dagster, or left any planned step unfinished, is FAILURE, names the steps
    and ranges that did not finish, and always carries the run id.
    """
    unfinished = steps.unfinished
    if summary is None:
        reason = error or ("the run succeeded but recorded no summary" if dagster_status == "SUCCESS"
                           else f"run ended {dagster_status}")
        merged = run_history.empty_summary("FAILURE", run_id, error=reason)
    else:
        merged = dict(summary)
    merged["run_id"] = run_id
    if dagster_status != "SUCCESS" or unfinished:
        if merged.get("status") != "FAILURE":
            merged["status"] = "FAILURE"
            merged["error"] = merged.get("error") or error or f"run ended {dagster_status}"
        merged["resumable"] = True
        merged["dagster_status"] = dagster_status
    if unfinished:
        merged["unfinished_steps"] = unfinished
        ranges = steps.unfinished_ranges
        if ranges:
            merged["unfinished_ranges"] = ranges
            note = f"{len(ranges)} range(s) did not finish: {', '.join(ranges)}"
            if note not in str(merged.get("error") or ""):
                merged["error"] = f"{merged['error']}; {note}" if merged.get("error") else note
    return merged


def read_summary(run_id: str, settings: Settings, spec: JobSpec) -> dict[str, Any] | None:
    """The run's summary from run history, or None.

    The final op's record when there is one; a mapped sweep that failed has no final op, only
    one record per range that recorded one; those are merged here (FAILURE wins, counters add
    up) and `reconcile` accounts for the ranges that recorded nothing. A database that is
    restarting is waited for a few seconds before this gives up.
    """
    with one_off_engine(settings) as engine:
        records = _with_db_retries(lambda: run_history.all_for_run(engine, run_id))
    if not records:
        return None
    final = [r for r in records if "range" not in r]
    if final or len(records) == 1 or spec.merge_records is None:
        return dict((final or records)[-1])
    return spec.merge_records(records)


def _with_db_retries(work: Any, attempts: int = SUMMARY_READ_ATTEMPTS) -> Any:
    delay = 0.5
    for attempt in range(attempts):
        try:
            return work()
        except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
            if attempt == attempts - 1 or not is_transient(exc):
                raise
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def _error_of(result: Any) -> str | None:
    """The first step failure's message (one line), else the run failure's."""
    for event in result.get_step_failure_events():
        error = event.step_failure_data.error
        # The step error wraps the user code's exception: report the innermost cause.
        while error is not None and error.cause is not None:
            error = error.cause
        if error is not None:
            return first_line(error.message)
    try:
        failure = result.get_run_failure_event()
    except Exception:  # no run-failure event (e.g. canceled): fall back to the caller's message
        return None
    data = failure.job_failure_data
    if data is not None and data.error is not None:
        return first_line(data.error.message)
    return first_line(failure.message or "") or None
