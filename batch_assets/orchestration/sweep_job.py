"""A sweep as a Dagster job: the shape of the customer-status sweep, built for any sweep (`build_sweep_job`).

    plan          validates the config, fixes the run date once, takes the run's lock + lease as its owner,
                  registers the ranges' checkpoint generation and maps one `RangeTask` per cursor range
                  (bounds from the table's key distribution; a delta is one range);
    sweep_range   (mapped) joins the lock and lease, runs the engine on its range with its own checkpoint and
                  progress, fails on FAILURE so a re-execution from failure resumes the unfinished ranges;
    summarise     merges the ranges, records the run summary in run history, releases lock and lease;
    report        the asset's materialization: numbers, failures by kind, cursor ranges (charted in Plots).

Jobs: `<name>` (the op job the CLI launches) and `<name>_asset_job` (the same graph as a graph-backed asset,
what the schedules start). Checks: rows still overdue after the last delta, failures by kind of the last run.

What is particular to a sweep is a `SweepJob`: its name, modes, schedules and `prepare`, which checks the
sweep against the database and builds its engine plug-in. The generic pieces the customer-status sweep's own
module shares live here too (`merge_summaries`, `record_range`, `merge_range_records`, `release_job_lock`).
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Literal, cast

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from batch_assets import run_history
from batch_assets.engine.definition import Sweep
from batch_assets.engine.ranges import CursorRange
from batch_assets.engine.result import FAILURE, FAILURE_KINDS, SKIPPED, SUCCESS, SweepResult
from batch_assets.engine.runner import run_sweep
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import BatchAssetsError, ConfigError, LockNotAcquired, error_text
from batch_assets.locking.lock import make_job_lock
from batch_assets.locking.run_guard import (
    acquire_run_lock,
    joined_guard,
    release_failed_run,
    release_run_lock,
    run_owner,
)
from batch_assets.orchestration.automation import schedule_timezone, tick_date
from batch_assets.orchestration.budget import APP_DATABASE_POOL
from batch_assets.orchestration.config import JobConfig, config_class
from batch_assets.orchestration.executors import in_one_process, ranges_executor
from batch_assets.orchestration.metadata import records_table, run_numbers
from batch_assets.orchestration.ops import (
    config_failure,
    empty_summary,
    finish,
    resolve_run_date,
    stop_on_interrupt,
    summary_metadata,
    utcnow,
    validated_plan,
)
from batch_assets.orchestration.progress import OpProgress
from batch_assets.orchestration.resources import (
    CalendarResource,
    CheckpointsResource,
    DatabaseResource,
    JobLockResource,
)
from batch_assets.orchestration.spec import JobSpec
from batch_assets.settings_model import DatedSettings
from batch_assets.shutdown import STOP

log = logging.getLogger(__name__)

ADDITIVE = ("scanned", "changed", "unchanged", "failed", "pages", "decrypted", "triggers", "audit_events",
            "conflicts")
"""Summary counters that add up over a run's ranges."""
RANGE_COLUMNS = ("range", "scanned", "changed", "failed", "conflicts", "pages", "duration_s", "resumed_from")
DEFAULT_RANGES = 4
MAX_RANGES = 256
SWEEP_TAGS = {"batch_assets/kind": "sweep"}


# --- what a sweep gives the factory ----------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """A sweep checked against the database for one run: its engine plug-in and how its key space splits."""

    definition: Callable[[str, date], Sweep]
    """(mode, run date) → the engine plug-in (one per range op)."""
    plan_ranges: Callable[[sa.Connection, int], list[CursorRange]]
    """(connection, wanted count) → contiguous ranges covering the key space (bounds from the key distribution)."""
    fingerprint: str
    """What a checkpoint must match to be resumed, besides the run date (e.g. the declaration's hash)."""
    overdue: Callable[[sa.Connection, date], int] | None = None
    """Rows still due on or before a run date (the rows-overdue check); None when the sweep has no due date."""


@dataclass(frozen=True)
class SweepJob:
    """One sweep's particulars; `build_sweep_job` makes its ops, graph, jobs, asset, checks and schedules."""

    name: str
    """Job, asset, lock and checkpoint name."""
    description: str
    modes: tuple[str, ...]
    prepare: Callable[[sa.Engine], Prepared]
    """Checks the sweep against the database (ConfigError naming the attribute) and builds what it runs."""
    source: dg.AssetKey
    """The table it reads (an upstream asset in the lineage)."""
    group: str = "declared"
    schedules: Mapping[str, str] = field(default_factory=dict)
    """mode → cron."""
    timezone: str | None = None
    """The schedules' time zone (None = BATCH_ASSETS_TIMEZONE)."""


class DeltaFullSettings(DatedSettings, SweepSettings):
    """A ranged sweep with a due date: delta (the due rows, one range) or full (cursor ranges)."""

    mode: Literal["delta", "full"] = Field(default="delta", description="delta | full.")
    ranges: int = Field(default=DEFAULT_RANGES, ge=1, le=MAX_RANGES,
                        description="Cursor ranges (one mapped op each) of a full run; a delta is always one range.")


class FullSettings(DatedSettings, SweepSettings):
    """A ranged sweep without a due date: full only."""

    mode: Literal["full"] = Field(default="full", description="full (the sweep has no due date).")
    ranges: int = Field(default=DEFAULT_RANGES, ge=1, le=MAX_RANGES,
                        description="Cursor ranges (one mapped op each).")


def ranges_of(op_config: Mapping[str, Any]) -> int:
    """How many cursor ranges a run has, from its plan op's config: a delta is one range."""
    mode = str(op_config.get("mode") or "full")
    if mode == "delta":
        return 1
    return int(op_config.get("ranges") or DEFAULT_RANGES)


def settings_class(job: SweepJob) -> type[DatedSettings]:
    return DeltaFullSettings if "delta" in job.modes else FullSettings


@dataclass(frozen=True)
class _Plan:
    mode: str
    ranges: int
    engine: SweepSettings


@dataclass(frozen=True)
class RangeTask:
    """What the plan op hands each mapped range op (plain data: it may travel to another process)."""

    index: int
    count: int
    cursor_range: CursorRange
    mode: str
    run_date: date
    settings: SweepSettings
    owner: str
    started_at: datetime
    fingerprint: str
    generation: str | None = None

    @property
    def label(self) -> str:
        return f"range {self.index + 1}/{self.count}" if self.count > 1 else "sweep"


# --- generic pieces (the customer-status sweep uses them too) -----------------------------------------


def root_run_id(context: dg.OpExecutionContext) -> str:
    return context.run.root_run_id or context.run_id


def in_process(context: dg.OpExecutionContext, plan_op: str) -> bool:
    """Whether every op of this run executes in this process (`ranges_executor`'s rule)."""
    return in_one_process(context.run.run_config, plan_op, ranges_of)


def merge_summaries(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One run summary from the ranges' summaries (counters add up; FAILURE wins over SUCCESS)."""
    merged: dict[str, Any] = {key: 0 for key in ADDITIVE}
    merged["failed_by_type"] = dict.fromkeys(FAILURE_KINDS, 0)
    for part in parts:
        for key in ADDITIVE:
            merged[key] += int(part.get(key) or 0)
        for kind, count in (part.get("failed_by_type") or {}).items():
            merged["failed_by_type"][kind] = merged["failed_by_type"].get(kind, 0) + int(count)
    statuses = {p.get("status") for p in parts}
    merged["status"] = FAILURE if FAILURE in statuses else SUCCESS
    resumed = {p.get("range", str(i)): p.get("resumed_from") for i, p in enumerate(parts) if p.get("resumed_from")}
    if not resumed:
        merged["resumed_from"] = None
    elif len(parts) == 1:
        merged["resumed_from"] = next(iter(resumed.values()))
    else:
        merged["resumed_from"] = resumed
    merged["ranges"] = len(parts)
    return merged


def merge_range_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The run summary of a sweep whose summary op never ran, from the ranges' own records."""
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


def record_range(context: dg.OpExecutionContext, engine: sa.Engine, summary: dict[str, Any], task: Any) -> None:
    """Record one range's summary in run history (a FAILURE one carries the error and is resumable).

    `task` is the range's task (index, count, started_at, mode, run_date)."""
    record = dict(summary)
    record["run_id"] = context.run_id
    record.pop("owner", None)
    status = record["status"] = SUCCESS if summary.get("status") == SUCCESS else FAILURE
    if status == FAILURE:
        record["error"] = f"range {task.index + 1}/{task.count} ({summary.get('range')}): " \
                          f"{summary.get('stopped_reason') or summary.get('status')}"
        # The range's checkpoint is its low watermark: the next run (or a re-execution from failure) resumes it.
        record["resumable"] = True
    record["duration_s"] = round((utcnow() - task.started_at).total_seconds(), 3)
    run_history.record(engine, run_id=context.run_id, job=context.job_name, status=status,
                       started_at=task.started_at, summary=record, mode=task.mode, run_date=task.run_date)


def started_at_of(results: Sequence[dict]) -> datetime:
    for part in results:
        if part.get("started_at"):
            return datetime.fromisoformat(part["started_at"])
    return utcnow()


def release_job_lock(job_key: str) -> Callable[[str, sa.Engine, str | None], None]:
    """A JobSpec's `release_after_failure` for a job whose lock and lease are named `job_key`.

    Best effort: with the database or the lock store down, lease and lock expire on their own (and a dead
    holder is taken over at once), and the run's outcome must still be reported."""

    def release(root_id: str, engine: sa.Engine, redis_url: str | None) -> None:
        try:
            release_failed_run(engine, make_job_lock(engine, redis_url), job_key=job_key, root_run_id=root_id)
        except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
            log.warning("run %s: lock and lease not released, they will expire: %s", root_id, error_text(exc))

    return release


def range_failure(label: str, exc: BaseException, cursor_range: CursorRange) -> dg.Failure:
    """The step failure of a range whose lock store or database went away outside the engine's retries."""
    if isinstance(exc, LockNotAcquired):
        return dg.Failure(description=f"{label}: lost the run's lock to another run: {exc}", allow_retries=False)
    return dg.Failure(
        description=f"{label} did not finish: {error_text(exc)}",
        metadata={"range": cursor_range.key, "resumable": "True", "error": error_text(exc)},
        allow_retries=False,
    )


def summarise_op(op_name: str, job_key: str, description: str | None = None) -> dg.OpDefinition:
    """The summary op of a ranged sweep: merge the ranges, record the run summary, release lock and lease."""

    @dg.op(name=op_name, tags={"kind": "sweep"}, description=description)
    def summarise(context: dg.OpExecutionContext, results: list[dict], database: DatabaseResource,
                  job_lock: JobLockResource) -> dict:
        if not results:
            # The plan op mapped no range: the run was SKIPPED (recorded there) and holds no lock.
            context.log.info("no cursor range ran (the run was skipped); nothing to summarise")
            return {}
        engine = database.get_engine()
        first = results[0]
        mode = first.get("mode")
        run_date = date.fromisoformat(first["run_date"]) if first.get("run_date") else None
        started = time.monotonic()
        try:
            summary = merge_summaries(results)
            summary.update(mode=mode, run_date=first.get("run_date"))
            started_at = started_at_of(results)
            summary["duration_s"] = round((utcnow() - started_at).total_seconds(), 3)
            summary = finish(context, engine, summary=summary, started_at=started_at, mode=mode, run_date=run_date)
        finally:
            release_run_lock(engine, job_lock.lock_for(engine), job_key=job_key,
                             owner=first.get("owner") or run_owner(root_run_id(context)))
        context.log.info(f"sweep summary recorded in {time.monotonic() - started:.2f}s")
        return summary

    return summarise


# --- the factory ------------------------------------------------------------------------------------


def build_sweep_job(job: SweepJob) -> JobSpec:  # noqa: C901 — the ops are closures over `job`, one each
    """The sweep's ops, graph, op job, graph-backed asset, asset job, checks and schedules, as a JobSpec."""
    name = job.name
    camel = "".join(part.title() for part in job.name.split("_"))
    config = config_class(settings_class(job), f"{camel}Config", f"{job.name}: {job.description}")
    asset_key = dg.AssetKey(name)
    plan_name, range_name = f"{name}__plan", f"{name}__sweep_range"

    def _prepared(database: DatabaseResource) -> tuple[sa.Engine, Prepared]:
        engine = database.get_engine()
        try:
            return engine, job.prepare(engine)
        except ConfigError as exc:
            raise config_failure(exc) from None

    @dg.op(name=plan_name, out=dg.DynamicOut(RangeTask, description="One task per cursor range."),
           tags={"kind": "sweep"}, config_schema=cast(Any, config.to_config_schema()))
    def plan(context: dg.OpExecutionContext, database: DatabaseResource, job_lock: JobLockResource,
             checkpoints: CheckpointsResource, calendar: CalendarResource) -> Iterator[dg.DynamicOutput[RangeTask]]:
        started_at = utcnow()
        try:
            run_config = config.from_values(dict(context.op_config or {}))
        except ConfigError as exc:
            raise config_failure(exc) from None
        chosen: Any = validated_plan(run_config)
        run_date = resolve_run_date(chosen, calendar)
        engine_settings = SweepSettings(**{f: getattr(chosen, f) for f in SweepSettings.model_fields})
        settings = _Plan(chosen.mode, 1 if chosen.mode == "delta" else chosen.ranges, engine_settings)
        engine, prepared = _prepared(database)
        owner = run_owner(root_run_id(context), single_process=in_process(context, plan_name))
        try:
            acquire_run_lock(engine, job_lock.lock_for(engine), job_key=name, owner=owner, settings=settings.engine)
        except LockNotAcquired as exc:
            summary = empty_summary(
                SKIPPED, context.run_id, reason=str(exc), mode=settings.mode, run_date=run_date.isoformat(), pages=0,
                decrypted=0, triggers=0, audit_events=0, conflicts=0, resumed_from=None,
            )
            finish(context, engine, summary=summary, started_at=started_at, mode=settings.mode, run_date=run_date,
                   output_metadata=False)
            return
        try:
            with engine.connect() as conn:
                ranges = prepared.plan_ranges(conn, settings.ranges)
            fingerprint = f"{prepared.fingerprint}:{run_date}"
            generation = checkpoints.store(engine).begin(
                name, settings.mode, [r.key for r in ranges], fingerprint=fingerprint, run_id=context.run_id,
                run_date=run_date,
            )
        except BaseException:
            release_run_lock(engine, job_lock.lock_for(engine), job_key=name, owner=owner)
            raise
        context.log.info(f"{name} mode={settings.mode} run_date={run_date} ranges={len(ranges)} owner={owner}; "
                         f"checkpoint generation {generation.id}{' (resumed)' if generation.resumed else ''}")
        for index, cursor_range in enumerate(ranges):
            yield dg.DynamicOutput(
                RangeTask(index=index, count=len(ranges), cursor_range=cursor_range, mode=settings.mode,
                          run_date=run_date, settings=settings.engine, owner=owner, started_at=started_at,
                          fingerprint=fingerprint, generation=generation.id),
                mapping_key=f"r{index:03d}_of_{len(ranges):03d}",
            )

    @dg.op(name=range_name, tags={"kind": "sweep"}, pool=APP_DATABASE_POOL)
    def sweep_range(context: dg.OpExecutionContext, task: RangeTask, database: DatabaseResource,
                    job_lock: JobLockResource, checkpoints: CheckpointsResource) -> dict:
        from batch_assets.engine.definition import RunContext

        settings, cursor_range, label = task.settings, task.cursor_range, task.label
        engine = database.get_engine(min_pool_size=settings.pool_size)
        progress = OpProgress(context, label=label, asset_key=name, every_pages=settings.summary_every_pages)
        try:
            prepared = job.prepare(engine)
            definition = prepared.definition(task.mode, task.run_date)
            ctx = RunContext(run_id=context.run_id, mode=task.mode, run_date=task.run_date,
                             fingerprint=task.fingerprint)
            with stop_on_interrupt(), progress, joined_guard(
                engine, job_lock.lock_for(engine), job_key=name, owner=task.owner, settings=settings
            ) as guard:
                result: SweepResult = run_sweep(
                    engine, definition, settings, ctx, guard=guard,
                    checkpoints=checkpoints.store(engine).in_generation(task.generation), stop=STOP,
                    cursor_range=cursor_range, progress=progress,
                )
        except ConfigError as exc:
            raise config_failure(exc) from None
        except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
            raise range_failure(label, exc, cursor_range) from None
        except BaseException as exc:
            if not isinstance(exc, Exception):  # run termination: give back the run's lock and lease now
                release_failed_run(engine, job_lock.lock_for(engine), job_key=name, root_run_id=root_run_id(context))
            raise
        summary = result.to_summary()
        summary.update(range=cursor_range.key, owner=task.owner, started_at=task.started_at.isoformat())
        metadata = summary_metadata(summary)
        try:
            record_range(context, engine, summary, task)
        except sa.exc.SQLAlchemyError as exc:
            context.log.warning(f"{label}: summary not recorded in run history: {error_text(exc)}")
        if result.status != SUCCESS:
            reason = summary.get("stopped_reason") or result.status
            raise dg.Failure(description=f"{label} ended {result.status}: {reason}", metadata=metadata,
                             allow_retries=False)
        context.add_output_metadata(metadata)
        return summary

    summarise = summarise_op(f"{name}__summarise", name)

    @dg.op(name=f"{name}__report", out={name: dg.Out(dg.Nothing, is_required=False)},
           ins={"source": dg.In(dg.Nothing)}, tags={"kind": "sweep"})
    def report(context: dg.OpExecutionContext, summary: dict, ranges: list) -> Iterator[dg.Output]:
        if not summary:
            context.log.info("the sweep was skipped: no materialization")
            return
        run_date, mode = str(summary.get("run_date")), str(summary.get("mode"))
        metadata = {
            "run_date": run_date, "mode": mode, **run_numbers(summary),
            "pages": int(summary.get("pages") or 0),
            "conflicts": int(summary.get("conflicts") or 0),
            "events": int(summary.get("audit_events") or 0),
            "ranges": int(summary.get("ranges") or 0),
            "failed_by_type": records_table(
                [{"kind": k, "rows": int(v)} for k, v in sorted((summary.get("failed_by_type") or {}).items())],
                ("kind", "rows"),
            ),
            "cursor_ranges": records_table(ranges, RANGE_COLUMNS),
        }
        if context.has_assets_def:
            yield dg.Output(None, name, metadata=metadata)
        else:
            context.log_event(dg.AssetMaterialization(asset_key=asset_key, description=f"{mode} sweep for {run_date}",
                                                      metadata=metadata, tags={"mode": mode, "run_date": run_date}))

    @dg.graph(name=f"{name}__graph", description=job.description)
    def op_graph() -> None:
        ranges = plan().map(sweep_range).collect()
        report(summarise(ranges), ranges)

    @dg.graph(name=name, ins={"source": dg.GraphIn()}, out={name: dg.GraphOut()}, description=job.description)
    def asset_graph(source: Any) -> Any:
        ranges = plan().map(sweep_range).collect()
        return report(summarise(ranges), ranges, source=source)

    asset = dg.AssetsDefinition.from_graph(
        asset_graph, keys_by_input_name={"source": job.source}, keys_by_output_name={name: asset_key},
        group_name=job.group, descriptions_by_output_name={name: job.description},
        tags_by_output_name={name: {"dagster/kind/postgres": ""}}, can_subset=False,
    )
    op_job = op_graph.to_job(name=name, description=f"{job.description} (the job the CLI launches; "
                             f"{name}_asset_job is the same sweep as an asset).", tags=SWEEP_TAGS,
                             executor_def=ranges_executor(plan_name, ranges_of))
    asset_job = dg.define_asset_job(
        f"{name}_asset_job", selection=dg.AssetSelection.assets(asset_key),
        description=f"Materialize {name} (plan → cursor ranges → summary) and run its checks. Config: "
        f"ops.{name}.ops.{plan_name}.config.", tags=SWEEP_TAGS,
        executor_def=ranges_executor(f"{name}.{plan_name}", ranges_of),
    )
    checks = _checks(job, asset_key)
    return JobSpec(
        job=op_job, config=config, config_op=plan_name, asset_jobs=[asset_job],
        assets=[asset, dg.AssetSpec(job.source, description=f"The table {name} sweeps (written by other services).",
                                    group_name=job.group)],
        asset_checks=checks, schedules=_schedule_builder(job, asset_job, config, plan_name),
        release_after_failure=release_job_lock(name), mapped_op=range_name, merge_records=merge_range_records,
    )


def _checks(job: SweepJob, asset_key: dg.AssetKey) -> list[dg.AssetChecksDefinition]:
    name = job.name

    @dg.asset_check(asset=asset_key, name=f"{name}_rows_overdue",
                    description="After the last successful delta, no row is still due on or before its run date "
                    "(rows the run could not compute are allowed, up to its failed count).")
    def rows_overdue(database: DatabaseResource) -> dg.AssetCheckResult:
        last = _last_run(database, name, "delta")
        if last is None:
            return dg.AssetCheckResult(passed=True, metadata={"last_delta_run_date": "none yet"})
        engine = database.get_engine()
        try:
            prepared = job.prepare(engine)
        except ConfigError as exc:
            return dg.AssetCheckResult(passed=False, metadata={"error": str(exc)})
        if prepared.overdue is None:
            return dg.AssetCheckResult(passed=True, metadata={"due": "none (full only)"})
        with engine.connect() as conn:
            overdue = prepared.overdue(conn, date.fromisoformat(str(last["run_date"])))
        failed = int(last.get("failed") or 0)
        return dg.AssetCheckResult(passed=overdue <= failed, metadata={
            "last_delta_run_date": str(last["run_date"]), "overdue": overdue, "failed_in_run": failed})

    @dg.asset_check(asset=asset_key, name=f"{name}_failures_by_kind",
                    description="The last run's failures by kind; fails when any was systemic (compute_error, "
                    "write_error): the team's function or the table needs a look.")
    def failures_by_kind(database: DatabaseResource) -> dg.AssetCheckResult:
        last = _last_run(database, name, None)
        if last is None:
            return dg.AssetCheckResult(passed=True, metadata={"last_run": "none yet"})
        kinds = {k: int(v) for k, v in (last.get("failed_by_type") or {}).items() if int(v)}
        systemic = sum(v for k, v in kinds.items() if k in ("compute_error", "write_error"))
        return dg.AssetCheckResult(passed=systemic == 0, metadata={
            "failed_by_type": records_table([{"kind": k, "rows": v} for k, v in sorted(kinds.items())],
                                            ("kind", "rows")),
            "systemic": systemic})

    return [rows_overdue, failures_by_kind]


LAST_RUN_SQL = sa.text("""
SELECT summary FROM ba_run_history
 WHERE job IN (:job, :asset_job) AND status = 'SUCCESS' AND NOT (summary ? 'range')
   AND (CAST(:mode AS text) IS NULL OR mode = :mode)
 ORDER BY finished_at DESC LIMIT 1
""")


def _last_run(database: DatabaseResource, name: str, mode: str | None) -> dict[str, Any] | None:
    with database.get_engine().connect() as conn:
        summary = conn.execute(LAST_RUN_SQL, {"job": name, "asset_job": f"{name}_asset_job", "mode": mode}).scalar()
    return dict(summary) if summary else None


def _schedule_builder(job: SweepJob, asset_job: Any, config: type[JobConfig], plan_name: str) -> Any:
    def build(timezone: str, status: dg.DefaultScheduleStatus) -> list[dg.ScheduleDefinition]:
        tz = schedule_timezone(job.timezone or timezone)
        schedules = []
        for mode, cron in job.schedules.items():
            schedules.append(dg.ScheduleDefinition(
                name=f"{job.name}_{mode}_schedule", cron_schedule=cron, job=asset_job,
                execution_fn=_tick(job.name, plan_name, config, mode, tz), execution_timezone=tz,
                default_status=status, description=f"{mode} sweep of {job.name} ({cron}, {tz}).",
            ))
        return schedules

    return build


def _tick(name: str, plan_name: str, config: type[JobConfig], mode: str,
          timezone: str) -> Callable[[dg.ScheduleEvaluationContext], dg.RunRequest]:
    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        run_date = tick_date(context, timezone)
        values = {"mode": mode, **({"run_date": run_date} if run_date else {})}
        return dg.RunRequest(
            run_key=f"{mode}:{run_date or 'now'}",
            run_config={"ops": {name: {"ops": {plan_name: {"config": values}}}}},
            tags={"batch_assets/mode": mode, "batch_assets/run_date": run_date},
        )

    return evaluate


def definitions_of(specs: Sequence[JobSpec]) -> dg.Definitions:
    """The Dagster definitions of some jobs (a component's `build_defs`): assets, checks, jobs and schedules in
    BATCH_ASSETS_TIMEZONE, RUNNING unless BATCH_ASSETS_AUTOMATION=off. Resources come from the code location."""
    from batch_assets.orchestration.automation import schedule_status
    from batch_assets.settings import automation_enabled, load_settings

    timezone = load_settings().timezone
    status = schedule_status(automation_enabled())
    return dg.Definitions(
        assets=[a for spec in specs for a in spec.assets],
        asset_checks=[c for spec in specs for c in spec.asset_checks],
        jobs=[j for spec in specs for j in (*spec.op_jobs, *spec.asset_jobs)],
        schedules=[s for spec in specs if spec.schedules for s in spec.schedules(timezone, status)],
    )
