"""The customer-status sweep as ops over cursor ranges.

plan_sweep         validates config, fixes the run date once, takes lock + lease as the run's
                   owner and maps one output per UUID cursor range (delta: one range);
sweep_range        (mapped) joins the run's lock and lease, runs the engine on its range
                   with its own checkpoint and progress, fails on FAILURE so a re-execution
                   from failure resumes exactly the unfinished ranges from their checkpoints;
summarise_sweep    merges the ranges, records the summary in run history, releases lock and
                   lease, and reports customer_status, review_triggers and outbox_events.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import date, datetime
from typing import Any

import dagster as dg
import sqlalchemy as sa

from batch_assets.domains.customer_status.rules_store import current_rules
from batch_assets.engine.definition import UUID_MAX, CursorRange
from batch_assets.engine.result import FAILURE, FAILURE_KINDS, SKIPPED, SUCCESS
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import BatchAssetsError, LockNotAcquired, error_text
from batch_assets.locking.run_guard import (
    acquire_run_lock,
    joined_guard,
    release_failed_run,
    release_run_lock,
    run_owner,
)
from batch_assets.orchestration.config import SweepConfig
from batch_assets.orchestration.ops.common import (
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
    CheckpointsResource,
    DatabaseResource,
    EncryptionResource,
    JobLockResource,
)
from batch_assets.shutdown import STOP

SWEEP_JOB_KEY = "customer_status_sweep"
"""The lock and lease name shared by delta, full and config-change (they never overlap)."""

_ADDITIVE = ("scanned", "changed", "unchanged", "failed", "pages", "decrypted", "triggers", "audit_events")


def split_key_space(count: int) -> list[CursorRange]:
    """`count` contiguous inclusive UUID ranges covering the whole key space."""
    space = UUID_MAX.int + 1
    bounds = [space * i // count for i in range(count + 1)]
    return [CursorRange(uuid.UUID(int=bounds[i]), uuid.UUID(int=bounds[i + 1] - 1)) for i in range(count)]


def _root_run_id(context: dg.OpExecutionContext) -> str:
    return context.run.root_run_id or context.run_id


def _in_process(context: dg.OpExecutionContext) -> bool:
    """Whether every op of this run executes in this process (the in_process executor)."""
    execution = (context.run.run_config or {}).get("execution") or {}
    return "in_process" in (execution.get("config") or {})


@dg.op(
    out=dg.DynamicOut(dict, description="One task per cursor range."),
    tags={"kind": "sweep"},
)
def plan_sweep(
    context: dg.OpExecutionContext,
    config: SweepConfig,
    database: DatabaseResource,
    encryption: EncryptionResource,
    job_lock: JobLockResource,
) -> Iterator[dg.DynamicOutput[dict]]:
    """Validate the run config, fix the run date, take the run's lock + lease and map the cursor ranges."""
    started_at = utcnow()
    # A missing or malformed key stops the run here too, before any read.
    plan = validated_plan(config, encryption.cipher)
    run_date = resolve_run_date(plan.run_date)
    engine = database.get_engine()
    owner = run_owner(_root_run_id(context), single_process=_in_process(context))
    try:
        acquire_run_lock(
            engine, job_lock.lock_for(engine), job_key=SWEEP_JOB_KEY, owner=owner, settings=plan.engine
        )
    except LockNotAcquired as exc:
        summary = empty_summary(
            SKIPPED, context.run_id, reason=str(exc), mode=plan.mode, run_date=run_date.isoformat(), pages=0,
            decrypted=0, triggers=0, audit_events=0, resumed_from=None,
        )
        finish(context, engine, summary=summary, started_at=started_at, mode=plan.mode, run_date=run_date,
               output_metadata=False)
        return
    with engine.connect() as conn:
        version, rules = current_rules(conn)
    ranges = [CursorRange()] if plan.ranges == 1 else split_key_space(plan.ranges)
    context.log.info(
        f"sweep mode={plan.mode} run_date={run_date} ranges={len(ranges)} owner={owner} "
        f"rules v{version} ({rules.fingerprint})"
    )
    for index, cursor_range in enumerate(ranges):
        yield dg.DynamicOutput(
            {
                "index": index,
                "count": len(ranges),
                "lo": str(cursor_range.lo),
                "hi": str(cursor_range.hi),
                "mode": plan.mode,
                "run_date": run_date.isoformat(),
                "settings": plan.engine.as_dict(),
                "owner": owner,
                "started_at": started_at.isoformat(),
                "rules_fingerprint": rules.fingerprint,
            },
            mapping_key=f"r{index:03d}_of_{len(ranges):03d}",
        )


@dg.op(tags={"kind": "sweep"})
def sweep_range(
    context: dg.OpExecutionContext,
    task: dict,
    database: DatabaseResource,
    encryption: EncryptionResource,
    job_lock: JobLockResource,
    checkpoints: CheckpointsResource,
) -> dict:
    """Sweep one cursor range under the run's lock and lease, resuming from its checkpoint."""
    from batch_assets.domains.customer_status.job import run_customer_status_sweep

    settings = SweepSettings.build(**task["settings"])
    cursor_range = CursorRange.parse(task["lo"], task["hi"])
    run_date = date.fromisoformat(task["run_date"])
    engine = database.get_engine(min_pool_size=settings.pool_size)
    label = f"range {task['index'] + 1}/{task['count']}" if task["count"] > 1 else "sweep"
    progress = OpProgress(context, label=label, asset_key="customer_status", every_pages=settings.summary_every_pages)
    try:
        with stop_on_interrupt(), progress, joined_guard(
            engine, job_lock.lock_for(engine), job_key=SWEEP_JOB_KEY, owner=task["owner"], settings=settings
        ) as guard:
            result = run_customer_status_sweep(
                engine,
                encryption.cipher(),
                mode=task["mode"],
                run_date=run_date,
                settings=settings,
                run_id=context.run_id,
                guard=guard,
                checkpoints=checkpoints.store(engine),
                stop=STOP,
                cursor_range=cursor_range,
                progress=progress,
            )
    except LockNotAcquired as exc:
        raise dg.Failure(
            description=f"{label}: lost the run's lock to another run: {exc}", allow_retries=False
        ) from None
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        # The lock store or the database went away outside the engine's own retries (joining the
        # lock, loading rules or the checkpoint): the range did not run to its end. Fail the step
        # cleanly, resumable from its checkpoint; the launch counts it as an unfinished range.
        raise dg.Failure(
            description=f"{label} did not finish: {error_text(exc)}",
            metadata={"range": cursor_range.key, "resumable": "True", "error": error_text(exc)},
            allow_retries=False,
        ) from None
    except BaseException as exc:
        if not isinstance(exc, Exception):
            # Run termination (DagsterExecutionInterruptedError): the engine drained and recorded its
            # low watermark; give back the run's lock and lease now (the summary op will not run).
            release_failed_run(engine, job_lock.lock_for(engine), job_key=SWEEP_JOB_KEY,
                               root_run_id=_root_run_id(context))
        raise
    summary = result.to_summary()
    summary["range"] = cursor_range.key
    summary["owner"] = task["owner"]
    summary["started_at"] = task["started_at"]
    metadata = summary_metadata(summary)
    # Every range records its own numbers, so a run whose summary op never runs (a range failed)
    # still reports what every range did.
    try:
        record_range(context, engine, summary, task)
    except sa.exc.SQLAlchemyError as exc:
        # The step's own outcome (below) is what the run's outcome is made of; the record only
        # carries the numbers of a range whose run has no summary op.
        context.log.warning(f"{label}: summary not recorded in run history: {error_text(exc)}")
    if result.status != SUCCESS:
        # Fail the step (not just the run) so a re-execution from failure resumes this range.
        reason = summary.get("stopped_reason") or result.status
        raise dg.Failure(description=f"{label} ended {result.status}: {reason}", metadata=metadata,
                         allow_retries=False)
    context.add_output_metadata(metadata)
    return summary


def record_range(context: dg.OpExecutionContext, engine: sa.Engine, summary: dict[str, Any], task: dict) -> None:
    """Record one range's summary in run history (a FAILURE one carries the error and is resumable)."""
    from batch_assets import run_history

    record = dict(summary)
    record["run_id"] = context.run_id
    record.pop("owner", None)
    status = record["status"] = SUCCESS if summary.get("status") == SUCCESS else FAILURE
    if status == FAILURE:
        record["error"] = f"range {task['index'] + 1}/{task['count']} ({summary.get('range')}): " \
                          f"{summary.get('stopped_reason') or summary.get('status')}"
        # The range's checkpoint is its low watermark: the next run (or a re-execution from
        # failure) resumes it.
        record["resumable"] = True
    record["duration_s"] = round((utcnow() - datetime.fromisoformat(task["started_at"])).total_seconds(), 3)
    run_history.record(
        engine,
        run_id=context.run_id,
        job=context.job_name,
        status=status,
        started_at=datetime.fromisoformat(task["started_at"]),
        summary=record,
        mode=task["mode"],
        run_date=date.fromisoformat(task["run_date"]),
    )


def merge_summaries(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One run summary from the ranges' summaries (counters add up; FAILURE wins over SUCCESS)."""
    merged: dict[str, Any] = {key: 0 for key in _ADDITIVE}
    merged["failed_by_type"] = dict.fromkeys(FAILURE_KINDS, 0)
    for part in parts:
        for key in _ADDITIVE:
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


@dg.op(tags={"kind": "sweep"})
def summarise_sweep(
    context: dg.OpExecutionContext,
    results: list[dict],
    database: DatabaseResource,
    job_lock: JobLockResource,
) -> dict:
    """Merge the ranges, record the run summary, release lock and lease (report_customer_status reports the assets)."""
    if not results:
        # plan_sweep mapped no range: the run was SKIPPED (recorded there) and holds no lock.
        context.log.info("no cursor range ran (the run was skipped); nothing to summarise")
        return {}
    engine = database.get_engine()
    first = results[0] if results else {}
    mode = first.get("mode")
    run_date = date.fromisoformat(first["run_date"]) if first.get("run_date") else None
    started = time.monotonic()
    try:
        summary = merge_summaries(results)
        summary.update(mode=mode, run_date=first.get("run_date"))
        started_at = _started_at(context, results)
        summary["duration_s"] = round((utcnow() - started_at).total_seconds(), 3)
        summary = finish(context, engine, summary=summary, started_at=started_at, mode=mode, run_date=run_date)
    finally:
        release_run_lock(engine, job_lock.lock_for(engine), job_key=SWEEP_JOB_KEY,
                         owner=first.get("owner") or run_owner(_root_run_id(context)))
    context.log.info(f"sweep summary recorded in {time.monotonic() - started:.2f}s")
    return summary


def _started_at(context: dg.OpExecutionContext, results: Sequence[dict]) -> datetime:
    for part in results:
        if part.get("started_at"):
            return datetime.fromisoformat(part["started_at"])
    return utcnow()


__all__ = ["SKIPPED", "SWEEP_JOB_KEY", "merge_summaries", "plan_sweep", "split_key_space", "summarise_sweep",
           "sweep_range"]
