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
import os
import shutil
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pydantic
import sqlalchemy as sa

import batch_assets
from batch_assets import run_history
from batch_assets.db.engine import create_engine, is_transient, normalize_url, resolve_database_url
from batch_assets.errors import BatchAssetsError, ConfigError, error_text, first_line
from batch_assets.orchestration.config import CONFIG_CLASSES
from batch_assets.settings import DAGSTER_PG_URL_VAR, Settings

EXECUTORS = ("in_process", "multiprocess", "celery")
CONFIG_OP = {
    "customer_status_sweep_job": "plan_sweep",
    "customer_status_sweep_celery_job": "plan_sweep",
    "subscription_expiry_job": "expire_subscriptions",
    "payment_queue_drain_job": "drain_payment_queue",
    "outbox_relay_job": "relay_outbox_events",
}
CELERY_VARIANT = {"customer_status_sweep_job": "customer_status_sweep_celery_job"}
SQLITE_TEMPLATE = "dagster.yaml"
log = logging.getLogger(__name__)
POSTGRES_TEMPLATE = "dagster.postgres.yaml"


@dataclass(frozen=True)
class LaunchResult:
    run_id: str
    dagster_status: str
    """The Dagster run status: SUCCESS, FAILURE, CANCELED, ..."""
    summary: dict[str, Any] | None
    """The job's summary (CONTRACT §2 keys); a FAILURE summary when the run failed before recording one."""


def repo_root() -> Path:
    """The repository (the package is installed editable): where workspace.yaml and dagster*.yaml live."""
    return Path(batch_assets.__file__).resolve().parents[1]


def ensure_instance(settings: Settings) -> Path:
    """The Dagster instance directory, with a dagster.yaml; sets DAGSTER_HOME for this process."""
    configured = os.environ.get("DAGSTER_HOME", "").strip()
    home = Path(configured).expanduser().resolve() if configured else settings.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    wanted = POSTGRES_TEMPLATE if os.environ.get(DAGSTER_PG_URL_VAR, "").strip() else SQLITE_TEMPLATE
    other = SQLITE_TEMPLATE if wanted == POSTGRES_TEMPLATE else POSTGRES_TEMPLATE
    target = home / "dagster.yaml"
    template = repo_root() / wanted
    # Write ours when missing, or switch when the file is our other template verbatim (storage changed);
    # a dagster.yaml someone edited is left alone.
    if not target.exists() or target.read_bytes() == (repo_root() / other).read_bytes():
        shutil.copyfile(template, target)
    os.environ["DAGSTER_HOME"] = str(home)
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


def _off_main_thread(fn: Any) -> Any:
    """Run `fn` in a worker thread and wait for it on the main thread.

    Dagster replaces the interrupt handlers when it executes on the main thread and turns a
    signal into DagsterExecutionInterruptedError wherever the op happens to be, which skips the
    engine's drain. Off the main thread it leaves them alone, so SIGTERM/SIGINT reach the CLI's
    handler (batch_assets.shutdown), which sets STOP: new pages stop, in-flight pages drain, the
    checkpoint is recorded and the op reports real counters. The thread is a daemon so a second
    Ctrl-C can still force the process out.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # re-raised on the caller's thread below
            box["error"] = exc

    worker = threading.Thread(target=target, name="batch-assets-run", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)  # short waits: the main thread must run signal handlers promptly
    if "error" in box:
        raise box["error"]
    return box["result"]


def get_job(job_name: str) -> dg.JobDefinition:
    """The job with its resources bound as in the code location (the reconstructable target).

    Resources are built at call time, so they follow this process's environment.
    """
    from batch_assets.orchestration.jobs import JOBS
    from batch_assets.orchestration.resources import default_resources

    jobs = [job for job in JOBS if job.name == job_name]
    if not jobs:
        raise ConfigError(f"unknown job {job_name!r}", field="job")
    return dg.Definitions(jobs=jobs, resources=default_resources()).resolve_job_def(job_name)


def _validated_op_config(job_name: str, config: Any) -> dict[str, Any]:
    """The op config as a plain dict, validated as the CLI does it: ConfigError naming the field."""
    cls = CONFIG_CLASSES.get(job_name)
    if cls is None:
        raise ConfigError(f"unknown job {job_name!r}", field="job")
    if config is None:
        config = cls()
    elif isinstance(config, Mapping):
        try:
            config = cls(**dict(config))
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first.get("loc", ())) or None
            raise ConfigError(str(first.get("msg", "invalid value")), field=field) from None
    elif not isinstance(config, cls):
        raise ConfigError(f"expected {cls.__name__}, got {type(config).__name__}", field="config")
    config.to_engine_settings()
    return config.model_dump()


def build_run_config(
    job_name: str,
    config: Any,
    *,
    executor: str = "in_process",
    max_concurrent: int | None = None,
    executor_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run config for `job_name`: the job's op config, the executor and a WARNING console logger."""
    if executor not in EXECUTORS:
        raise ConfigError(f"must be one of {', '.join(EXECUTORS)}, got {executor!r}", field="executor")
    run_config: dict[str, Any] = {
        "ops": {CONFIG_OP[job_name]: {"config": _validated_op_config(job_name, config)}},
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

    `config` is the job's `dg.Config` object (SweepConfig, ExpiryConfig, ...) or a dict of its fields.
    `executor`: "in_process" (the CLI), "multiprocess" (ranges in parallel processes, at most
    `max_concurrent`) or "celery" (the sweep's ranges on celery workers; `executor_config`
    may set {"broker": "redis://..."}).
    Raises ConfigError (naming the field) before anything runs when the config is invalid.
    """
    name = CELERY_VARIANT.get(job_name, job_name) if executor == "celery" else job_name
    if executor == "celery" and name not in CELERY_VARIANT.values():
        raise ConfigError(f"{job_name} has no celery variant", field="executor")
    run_config = build_run_config(
        name, config, executor=executor, max_concurrent=max_concurrent, executor_config=executor_config
    )
    ensure_instance(settings)
    launch_id = uuid.uuid4().hex
    all_tags = {"batch_assets/launched_by": "cli", LAUNCH_ID_TAG: launch_id, **(tags or {})}
    with dg.DagsterInstance.get() as instance:
        try:
            result = _off_main_thread(
                lambda: dg.execute_job(
                    dg.build_reconstructable_job(__name__, "get_job", reconstructable_args=(name,)),
                    instance=instance,
                    run_config=run_config,
                    tags=all_tags,
                )
            )
        except dg.DagsterInvalidConfigError as exc:
            raise ConfigError(first_line(str(exc)), field="run_config") from None
        except Exception as exc:  # the run started (or not) and its execution broke: report it, with its id
            launched = _crashed_launch(instance, launch_id, exc)
        else:
            launched = _result_of(instance, result, settings)
    if launched.dagster_status != "SUCCESS" and name in SWEEP_JOBS:
        release_after_failure(launched.run_id, settings)
    return launched


LAUNCH_ID_TAG = "batch_assets/launch_id"


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


SWEEP_JOBS = ("customer_status_sweep_job", "customer_status_sweep_celery_job")


def release_after_failure(root_run_id: str, settings: Settings) -> None:
    """A failed sweep run (breaker, SIGTERM, lost lease, defect) gives back what it still holds.

    Best effort: with the database or the lock store down, lease and lock expire on their own
    (and a dead holder is taken over at once), and the run's outcome must still be reported.
    """
    from batch_assets.locking.lock import make_job_lock
    from batch_assets.locking.run_guard import release_failed_run
    from batch_assets.orchestration.ops.sweep import SWEEP_JOB_KEY

    try:
        url = normalize_url(settings.database_url) if settings.database_url else resolve_database_url(settings)
        engine = create_engine(url, pool_size=1, max_overflow=0)
        try:
            release_failed_run(engine, make_job_lock(engine, settings.redis_url), job_key=SWEEP_JOB_KEY,
                               root_run_id=root_run_id)
        finally:
            engine.dispose()
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        log.warning("run %s: lock and lease not released, they will expire: %s", root_run_id, error_text(exc))


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
        run_config = dict(parent.run_config)
        if executor == "in_process":
            run_config["execution"] = {"config": {"in_process": {}}}
        elif executor == "multiprocess":
            run_config["execution"] = {"config": {"multiprocess": {"max_concurrent": max_concurrent or 0}}}
        result = _off_main_thread(
            lambda: dg.execute_job(
                dg.build_reconstructable_job(__name__, "get_job", reconstructable_args=(parent.job_name,)),
                instance=instance,
                run_config=run_config,
                tags={"batch_assets/launched_by": "cli"},
                reexecution_options=dg.ReexecutionOptions.from_failure(run_id, instance),
            )
        )
        launched = _result_of(instance, result, settings)
    if launched.dagster_status != "SUCCESS" and parent.job_name in SWEEP_JOBS:
        release_after_failure(parent.root_run_id or parent.run_id, settings)
    return launched


MAPPED_RANGE_OP = "sweep_range"
"""The op a sweep maps over its cursor ranges: an unfinished step of it is an unfinished range."""
SUMMARY_READ_ATTEMPTS = 5


def _result_of(instance: dg.DagsterInstance, result: Any, settings: Settings) -> LaunchResult:
    run_id = result.run_id
    run = instance.get_run_by_id(run_id)
    status = run.status.value if run is not None else ("SUCCESS" if result.success else "FAILURE")
    try:
        summary = read_summary(run_id, settings)
        read_error = None
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        summary, read_error = None, f"the run's summary could not be read: {error_text(exc)}"
    summary = reconcile(summary, run_id=run_id, dagster_status=status, steps=step_outcomes(result.all_events),
                        error=_error_of(result) or read_error)
    return LaunchResult(run_id=run_id, dagster_status=status, summary=summary)


@dataclass(frozen=True)
class StepOutcomes:
    """Which steps of a run were planned and which of them succeeded (from the run's own events)."""

    planned: tuple[str, ...]
    succeeded: frozenset[str]

    @property
    def unfinished(self) -> list[str]:
        return [key for key in self.planned if key not in self.succeeded]


def step_outcomes(events: Sequence[Any]) -> StepOutcomes:
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
            if mapping_key:
                planned.setdefault(f"{MAPPED_RANGE_OP}[{mapping_key}]")
    return StepOutcomes(tuple(planned), frozenset(succeeded))


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
        ranges = [key[len(MAPPED_RANGE_OP) + 1:-1] for key in unfinished if key.startswith(f"{MAPPED_RANGE_OP}[")]
        if ranges:
            merged["unfinished_ranges"] = ranges
            note = f"{len(ranges)} range(s) did not finish: {', '.join(ranges)}"
            if note not in str(merged.get("error") or ""):
                merged["error"] = f"{merged['error']}; {note}" if merged.get("error") else note
    return merged


def read_summary(run_id: str, settings: Settings) -> dict[str, Any] | None:
    """The run's summary from run history, or None.

    The final op's record when there is one; a mapped sweep that failed has no final op, only
    one record per range that recorded one; those are merged here (FAILURE wins, counters add
    up) and `reconcile` accounts for the ranges that recorded nothing. A database that is
    restarting is waited for a few seconds before this gives up.
    """
    url = normalize_url(settings.database_url) if settings.database_url else resolve_database_url(settings)
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        records = _with_db_retries(lambda: run_history.all_for_run(engine, run_id))
    finally:
        engine.dispose()
    if not records:
        return None
    final = [r for r in records if "range" not in r]
    if final or len(records) == 1:
        return dict((final or records)[-1])
    return merge_range_records(records)


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


def merge_range_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    from batch_assets.orchestration.ops.sweep import merge_summaries

    merged = merge_summaries(records)
    first = records[0]
    merged.update(
        run_id=first.get("run_id"),
        mode=first.get("mode"),
        run_date=first.get("run_date"),
        duration_s=max(float(r.get("duration_s") or 0) for r in records),
        error="; ".join(str(r["error"]) for r in records if r.get("error")) or None,
        resumable=merged["status"] != "SUCCESS",
    )
    return merged


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
