"""The four ops of a ranged sweep, built for one `SweepJob`:

    plan       validates the config, fixes the run date once, prepares the sweep (ConfigError naming the attribute
               before any write), takes the run's lock + lease as its owner, registers the ranges' checkpoint
               generation and maps one `RangeTask` per cursor range (a delta is one range);
    range      (mapped) joins the lock and lease, runs the engine on its range with its own checkpoint and
               progress, fails on FAILURE so a re-execution from failure resumes exactly the unfinished ranges;
    summarise  merges the ranges, records the run summary in run history, releases lock and lease;
    report     the assets' materializations: numbers, failures by kind, cursor ranges (charted in Plots).
"""

# No `from __future__ import annotations`: Dagster reads the op annotations at runtime.

import json
import time
from collections.abc import Iterator, Mapping
from datetime import date
from typing import Any, cast

import dagster as dg
import sqlalchemy as sa

from batch_assets.engine.definition import RunContext, Sweep
from batch_assets.engine.ranges import CursorRange
from batch_assets.engine.result import SKIPPED, SUCCESS, SweepResult
from batch_assets.engine.runner import run_sweep
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import BatchAssetsError, ConfigError, LockNotAcquired, error_text
from batch_assets.locking.run_guard import (
    acquire_run_lock,
    joined_guard,
    release_failed_run,
    release_run_lock,
    run_owner,
)
from batch_assets.orchestration.budget import APP_DATABASE_POOL
from batch_assets.orchestration.config import JobConfig
from batch_assets.orchestration.executors import in_one_process
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
from batch_assets.orchestration.sweep_job.definition import (
    PrepareContext,
    Prepared,
    RangeTask,
    SweepJob,
    SweepNames,
    ranges_of,
)
from batch_assets.orchestration.sweep_job.summaries import (
    RANGE_COLUMNS,
    merge_summaries,
    record_range,
    started_at_of,
)
from batch_assets.shutdown import STOP


def root_run_id(context: dg.OpExecutionContext) -> str:
    return context.run.root_run_id or context.run_id


def prepare(job: SweepJob, engine: sa.Engine, resources: Any) -> Prepared:
    """The sweep checked against the database; a ConfigError (naming the attribute) fails the step cleanly."""
    try:
        return job.prepare(PrepareContext(engine=engine, resources=resources))
    except ConfigError as exc:
        raise config_failure(exc) from None


def in_process(context: dg.OpExecutionContext, names: SweepNames) -> bool:
    """Whether every op of this run executes in this process (`ranges_executor`'s rule for the op job and the asset
    job, which carry it; an executor variant's steps run elsewhere)."""
    plan_op = {names.job: names.plan_op, names.asset_job: f"{names.graph}.{names.plan_op}"}.get(context.job_name)
    return plan_op is not None and in_one_process(context.run.run_config, plan_op, ranges_of)


def range_failure(label: str, exc: BaseException, cursor_range: CursorRange) -> dg.Failure:
    """The step failure of a range whose lock store or database went away outside the engine's retries: resumable
    from its checkpoint; the launch counts it as an unfinished range."""
    if isinstance(exc, LockNotAcquired):
        return dg.Failure(description=f"{label}: lost the run's lock to another run: {exc}", allow_retries=False)
    return dg.Failure(
        description=f"{label} did not finish: {error_text(exc)}",
        metadata={"range": cursor_range.key, "resumable": "True", "error": error_text(exc)},
        allow_retries=False,
    )


def plan_op(job: SweepJob, names: SweepNames, config: type[JobConfig]) -> dg.OpDefinition:
    @dg.op(name=names.plan_op, out=dg.DynamicOut(RangeTask, description="One task per cursor range."),
           tags={"kind": "sweep"}, config_schema=cast(Any, config.to_config_schema()),
           required_resource_keys=job.keys.all() | set(job.resource_keys),
           description="Validate the run config, fix the run date, take the run's lock and lease, register the "
           "ranges' checkpoint generation (resuming an unfinished one) and map the cursor ranges.")
    def plan(context: dg.OpExecutionContext) -> Iterator[dg.DynamicOutput[RangeTask]]:
        started_at = utcnow()
        resources = context.resources
        try:
            # A value the launchpad's types let through (`workers: 100000`) fails with one line naming the field.
            run_config = config.from_values(dict(context.op_config or {}))
        except ConfigError as exc:
            raise config_failure(exc) from None
        chosen: Any = validated_plan(run_config)
        run_date = resolve_run_date(chosen, getattr(resources, job.keys.calendar))
        engine = getattr(resources, job.keys.database).get_engine()
        prepared = prepare(job, engine, resources)
        mode = chosen.mode
        count = 1 if mode == "delta" else chosen.ranges
        settings = SweepSettings(**{f: getattr(chosen, f) for f in SweepSettings.model_fields})
        lock = getattr(resources, job.keys.job_lock).lock_for(engine)
        owner = run_owner(root_run_id(context), single_process=in_process(context, names))
        try:
            acquire_run_lock(engine, lock, job_key=names.lock, owner=owner, settings=settings)
        except LockNotAcquired as exc:
            summary = empty_summary(
                SKIPPED, context.run_id, reason=str(exc), mode=mode, run_date=run_date.isoformat(), pages=0,
                decrypted=0, triggers=0, audit_events=0, conflicts=0, resumed_from=None,
            )
            finish(context, engine, summary=summary, started_at=started_at, mode=mode, run_date=run_date,
                   output_metadata=False)
            return
        try:
            if count == 1:
                ranges = [CursorRange()]
            else:
                with engine.connect() as conn:
                    ranges = prepared.plan_ranges(conn, count)
            fingerprint = f"{prepared.fingerprint}:{run_date}"
            # Decided once, here, for every range: whatever order and timing the ranges then run in, a range that
            # finished in the generation this run resumes is not read again.
            generation = getattr(resources, job.keys.checkpoints).store(engine).begin(
                names.checkpoint, mode, [r.key for r in ranges], fingerprint=fingerprint, run_id=context.run_id,
                run_date=run_date,
            )
        except BaseException:
            release_run_lock(engine, lock, job_key=names.lock, owner=owner)
            raise
        resumed = f"resumes generation {generation.id} ({len(generation.finished)} range(s) finished)" \
            if generation.resumed else f"checkpoint generation {generation.id}"
        described = f" {prepared.describe};" if prepared.describe else ";"
        context.log.info(f"{job.name} mode={mode} run_date={run_date} ranges={len(ranges)} owner={owner}"
                         f"{described} {resumed}")
        for index, cursor_range in enumerate(ranges):
            yield dg.DynamicOutput(
                RangeTask(index=index, count=len(ranges), cursor_range=cursor_range, mode=mode, run_date=run_date,
                          settings=settings, owner=owner, started_at=started_at, fingerprint=fingerprint,
                          generation=generation.id),
                mapping_key=f"r{index:03d}_of_{len(ranges):03d}",
            )

    return plan


def range_op(job: SweepJob, names: SweepNames) -> dg.OpDefinition:
    @dg.op(name=names.range_op, tags={"kind": "sweep"}, pool=APP_DATABASE_POOL,
           required_resource_keys=job.keys.all() | set(job.resource_keys),
           description="Sweep one cursor range under the run's lock and lease, resuming from its checkpoint.")
    def sweep_range(context: dg.OpExecutionContext, task: RangeTask) -> dict:
        resources = context.resources
        settings, cursor_range, label = task.settings, task.cursor_range, task.label
        engine = getattr(resources, job.keys.database).get_engine(min_pool_size=settings.pool_size)
        lock = getattr(resources, job.keys.job_lock).lock_for(engine)
        # Written only while the run's lease is the run's: a range that lost it cannot move its checkpoint.
        checkpoints = getattr(resources, job.keys.checkpoints).store(engine).in_generation(task.generation) \
            .fenced_by(names.lock, task.owner)
        progress = OpProgress(context, label=label, asset_key=names.asset, every_pages=settings.summary_every_pages)
        definition: Sweep | None = None
        try:
            prepared = job.prepare(PrepareContext(engine=engine, resources=resources))
            definition = prepared.definition(task.mode, task.run_date)
            # A checkpoint is resumed only by a run of the same sweep (declaration, rules) and run date.
            ctx = RunContext(run_id=context.run_id, mode=task.mode, run_date=task.run_date,
                             fingerprint=f"{prepared.fingerprint}:{task.run_date}")
            with stop_on_interrupt(), progress, joined_guard(
                engine, lock, job_key=names.lock, owner=task.owner, settings=settings
            ) as guard:
                result: SweepResult = run_sweep(engine, definition, settings, ctx, guard=guard,
                                                checkpoints=checkpoints, stop=STOP, cursor_range=cursor_range,
                                                progress=progress)
        except ConfigError as exc:
            raise config_failure(exc) from None
        except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
            raise range_failure(label, exc, cursor_range) from None
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Run termination (DagsterExecutionInterruptedError): the engine drained and recorded its low
                # watermark; give back the run's lock and lease now (the summary op will not run).
                try:
                    release_failed_run(engine, lock, job_key=names.lock, root_run_id=root_run_id(context))
                finally:
                    log_termination(context, task, names, definition, checkpoints)
            raise
        summary = result.to_summary()
        summary.update(range=cursor_range.key, owner=task.owner, started_at=task.started_at.isoformat())
        metadata = summary_metadata(summary)
        try:
            record_range(engine, run_id=context.run_id, job=context.job_name, summary=summary, task=task)
        except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
            # The step's own outcome (below) is what the run's outcome is made of; the record only carries the
            # numbers of a range whose run has no summary op, and so do the step's metadata (summary_metadata).
            context.log.warning(f"{label}: summary not recorded in run history: {error_text(exc)}")
        if result.status != SUCCESS:
            # Fail the step (not just the run) so a re-execution from failure resumes this range.
            reason = summary.get("stopped_reason") or result.status
            raise dg.Failure(description=f"{label} ended {result.status}: {reason}", metadata=metadata,
                             allow_retries=False)
        context.add_output_metadata(metadata)
        return summary

    return sweep_range


def log_termination(context: dg.OpExecutionContext, task: RangeTask, names: SweepNames, definition: Sweep | None,
                    checkpoints: Any) -> None:
    """One log line when a run is terminated: what this range drained and where its checkpoint stands, shown by the
    reader's `display_cursor` (nothing sensitive, never a date derived from the data)."""
    if definition is None:
        context.log.warning(f"{task.label} terminated before its sweep was prepared: the next run starts it over")
        return
    try:
        saved = checkpoints.load(names.checkpoint, task.mode, task.cursor_range.key, task.fingerprint)
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        context.log.warning(f"{task.label} terminated; its checkpoint could not be read: {error_text(exc)}")
        return
    if saved is None:
        context.log.warning(f"{task.label} terminated before its first checkpoint: the next run starts it over")
        return
    counters = saved.counters or {}
    done = ", ".join(f"{k} {int(counters.get(k) or 0):,}" for k in ("scanned", "changed", "failed", "pages"))
    reader = definition.reader
    shown = json.dumps(reader.display_cursor(None if saved.cursor is None else reader.open_cursor(saved.cursor)))
    context.log.warning(
        f"{task.label} terminated: the pages in flight were drained and written ({done}); checkpoint "
        f"{'finished' if saved.finished else 'at ' + shown}; "
        f"the next {task.mode} run for the same sweep and run date resumes from it"
    )


def summarise_op(job: SweepJob, names: SweepNames) -> dg.OpDefinition:
    keys = job.keys

    @dg.op(name=names.summarise_op, tags={"kind": "sweep"}, required_resource_keys={keys.database, keys.job_lock},
           description=f"Merge the ranges, record the run summary, release lock and lease ({names.report_op} reports "
           "the assets).")
    def summarise(context: dg.OpExecutionContext, results: list[dict]) -> dict:
        if not results:
            # The plan op mapped no range: the run was SKIPPED (recorded there) and holds no lock.
            context.log.info("no cursor range ran (the run was skipped); nothing to summarise")
            return {}
        engine = getattr(context.resources, keys.database).get_engine()
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
            release_run_lock(engine, getattr(context.resources, keys.job_lock).lock_for(engine), job_key=names.lock,
                             owner=first.get("owner") or run_owner(root_run_id(context)))
        context.log.info(f"sweep summary recorded in {time.monotonic() - started:.2f}s")
        return summary

    return summarise


def main_metadata(job: SweepJob, summary: Mapping[str, Any], ranges: list, engine: sa.Engine) -> dict[str, Any]:
    """The main asset's metadata of one run: its numbers, failures by kind and cursor ranges, plus the sweep's own."""
    metadata = {
        "run_date": str(summary.get("run_date")), "mode": str(summary.get("mode")), **run_numbers(summary),
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
    if job.report_metadata is not None:
        metadata.update(job.report_metadata(summary, engine))
    return metadata


def report_op(job: SweepJob, names: SweepNames, asset_key: dg.AssetKey) -> dg.OpDefinition:
    outputs = [names.asset, *(extra.key for extra in job.extra_assets)]

    @dg.op(name=names.report_op, out={key: dg.Out(dg.Nothing, is_required=False) for key in outputs},
           ins={"source": dg.In(dg.Nothing)}, tags={"kind": "sweep"}, required_resource_keys={job.keys.database},
           description="Report the sweep's assets with numeric metadata (charted in Plots); nothing for a skipped run.")
    def report(context: dg.OpExecutionContext, summary: dict, ranges: list) -> Iterator[dg.Output]:
        # In the asset job these are the graph asset's outputs; in the op jobs the CLI launches, the same metadata
        # is logged as AssetMaterialization events.
        if not summary:  # the plan op was skipped (another run held the lock): nothing was materialized
            context.log.info("the sweep was skipped: no materialization")
            return
        run_date, mode = str(summary.get("run_date")), str(summary.get("mode"))
        common = {"run_date": run_date, "mode": mode, **run_numbers(summary)}
        engine = getattr(context.resources, job.keys.database).get_engine()
        reports: dict[str, tuple[dg.AssetKey, str, dict[str, Any]]] = {
            names.asset: (asset_key, f"{mode} sweep for {run_date}", main_metadata(job, summary, ranges, engine)),
        }
        for extra in job.extra_assets:
            reports[extra.key] = (dg.AssetKey(extra.key), extra.materialization.format(mode=mode, run_date=run_date),
                                  {**common, **extra.metadata(summary)})
        for output, (key, description, metadata) in reports.items():
            if context.has_assets_def:
                yield dg.Output(None, output, metadata=metadata)
            else:
                context.log_event(dg.AssetMaterialization(asset_key=key, description=description, metadata=metadata,
                                                          tags={"mode": mode, "run_date": run_date}))

    return report
