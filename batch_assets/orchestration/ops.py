"""What every job's ops share: config failures, run dates, summaries in run history, stop handling."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, date, datetime
from typing import Any, TypeVar

import dagster as dg
import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.db.engine import translate_errors
from batch_assets.db.timeouts import bounded
from batch_assets.engine.result import FAILURE, SKIPPED, SUCCESS
from batch_assets.errors import BatchAssetsError, ConfigError, error_text
from batch_assets.orchestration.config import JobConfig
from batch_assets.orchestration.resources import CalendarResource
from batch_assets.run_history import empty_summary
from batch_assets.settings_model import DatedSettings
from batch_assets.shutdown import STOP

T = TypeVar("T")

SUMMARY_COUNTERS = ("scanned", "changed", "unchanged", "failed")


def config_failure(exc: ConfigError) -> dg.Failure:
    """A non-retriable failure naming the invalid field, raised before any read or write."""
    return dg.Failure(
        description=f"invalid configuration: {exc}",
        metadata={"field": exc.field or "", "error": str(exc)},
        allow_retries=False,
    )


C = TypeVar("C", bound=JobConfig)


def config_schema_of(config_class: type[JobConfig]) -> Any:
    """The op's `config_schema` for a JobConfig: Dagster checks the field types and Enums against it before the run
    starts (launchpad, GraphQL, `validate_run_config`); the op builds the config itself with `config_of`."""
    return config_class.to_config_schema()


def config_of(config_class: type[C], context: dg.OpExecutionContext) -> C:
    """The run's config from the op's raw config, checked like the CLI's (`from_values`): a value Dagster's schema
    lets through (`batch_size: 100000000`, `run_date: "tomorrow"`) fails the run with one line naming the field
    (`config_failure`, which the failure alert quotes), not a pydantic ValidationError and its stack trace.

    The first op of every job declares `config_schema=config_schema_of(X)` and calls this, instead of a
    `config: X` parameter (Dagster builds that one itself and a bound error escapes as a stack trace)."""
    try:
        return config_class.from_values(dict(context.op_config or {}))
    except ConfigError as exc:
        raise config_failure(exc) from None


def validated_plan(config: JobConfig, *checks: Callable[[], object]) -> Any:
    """`config.to_settings()` plus any extra checks; a ConfigError becomes `config_failure`.

    The first op of every job calls it before any read or write: a run launched from the UI, a
    schedule or a sensor gets exactly the validation the CLI ran before launching.
    """
    try:
        plan = config.to_settings()
        for check in checks:
            check()
    except ConfigError as exc:
        raise config_failure(exc) from None
    return plan


def resolve_run_date(plan: DatedSettings, calendar: CalendarResource) -> date:
    """The run date of a dated job: the configured one, within the calendar resource's window of today (unless
    allow_distant_run_date), else today in the calendar's time zone (once per run). A distant date or an unknown
    zone is `config_failure`, one line naming the field, before any read or write."""
    try:
        calendar.check_run_date(plan)
        return plan.run_date if plan.run_date is not None else calendar.today()
    except ConfigError as exc:
        raise config_failure(exc) from None


def utcnow() -> datetime:
    return datetime.now(UTC)


def failed_by_type_table(failed_by_type: Mapping[str, int]) -> dg.MetadataValue:
    rows = "\n".join(f"| {kind} | {count} |" for kind, count in sorted(failed_by_type.items()))
    return dg.MetadataValue.md("| kind | rows |\n|---|---|\n" + (rows or "| (none) | 0 |"))


SUMMARY_KEY = "batch_assets/summary"
"""The step metadata entry that carries a summary as JSON: how the CLI gets the numbers of a run whose run history
lacks them (run_results), so a run whose bookkeeping failed still reports every row it committed."""


def summary_metadata(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The summary as UI metadata: numbers as numbers, failures by kind as a table, and the whole as JSON
    (`SUMMARY_KEY`)."""
    metadata: dict[str, Any] = {}
    for key, value in summary.items():
        if key in ("failed_by_type", "retried_by_type") and isinstance(value, Mapping):
            metadata[key] = failed_by_type_table(value)
        elif isinstance(value, bool) or value is None:
            metadata[key] = dg.MetadataValue.text(str(value))
        elif isinstance(value, int | float):
            metadata[key] = value
        elif isinstance(value, str):
            metadata[key] = dg.MetadataValue.text(value)
        else:
            metadata[key] = dg.MetadataValue.json(json.loads(json.dumps(value, default=str)))
    metadata[SUMMARY_KEY] = dg.MetadataValue.json(json.loads(json.dumps(dict(summary), default=str)))
    return metadata


def finish(
    context: dg.OpExecutionContext,
    engine: sa.Engine,
    *,
    summary: dict[str, Any],
    started_at: datetime,
    mode: str | None = None,
    run_date: date | None = None,
    output_metadata: bool = True,
) -> dict[str, Any]:
    """Record the run's summary in run history (how the CLI gets it), then succeed, skip or fail the op.

    The summary counts what the run committed, and nothing that happens to its bookkeeping changes that: when run
    history does not take it (a grant revoked, a lock held too long), the op fails (the run's record is missing)
    and its failure carries the same summary, status FAILURE, which the CLI reads from the run's events."""
    status = summary.get("status", FAILURE)
    summary["run_id"] = context.run_id
    try:
        with translate_errors(engine), bounded(engine) as conn:
            run_history.record(conn, run_id=context.run_id, job=context.job_name, status=status,
                               started_at=started_at, summary=summary, mode=mode, run_date=run_date)
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        reason = f"the run's summary was not recorded in run history: {error_text(exc)}"
        unrecorded = {**summary, "status": FAILURE, "error": "; ".join(
            str(part) for part in (summary.get("error"), reason) if part)}
        raise dg.Failure(description=f"{context.job_name} ended FAILURE: {reason}",
                         metadata=summary_metadata(unrecorded), allow_retries=False) from None
    metadata = summary_metadata(summary)
    if status == FAILURE:
        reason = summary.get("error") or summary.get("stopped_reason") or summary.get("stopped_by") or "see metadata"
        raise dg.Failure(
            description=f"{context.job_name} ended FAILURE: {reason}",
            metadata=metadata,
            allow_retries=False,
        )
    if status == SKIPPED:
        context.log.warning(f"{context.job_name}: SKIPPED ({summary.get('reason', 'another run holds the lock')})")
    if output_metadata:
        context.add_output_metadata(metadata)
    return summary


def record_skipped(
    context: dg.OpExecutionContext,
    engine: sa.Engine,
    *,
    reason: str,
    started_at: datetime,
    mode: str | None = None,
    run_date: date | None = None,
    output_metadata: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    summary = empty_summary(SKIPPED, context.run_id, reason=reason, **extra)
    return finish(context, engine, summary=summary, started_at=started_at, mode=mode, run_date=run_date,
                  output_metadata=output_metadata)


@contextmanager
def stop_on_interrupt() -> Iterator[None]:
    """A run termination (DagsterExecutionInterruptedError, a BaseException) sets STOP so engines drain."""
    try:
        yield
    except BaseException as exc:
        if not isinstance(exc, Exception):
            STOP.set()
        raise


def run_in_thread(fn: Callable[[], T], *, name: str, grace_s: float | None = None) -> T:
    """Run `fn` in a daemon thread of its own and wait for it here, in short joins; its exception is re-raised here.

    Waiting in short joins keeps this thread free for what must happen on it: on the CLI's main
    thread, the signal handlers (SIGTERM/SIGINT set STOP, so the engine drains); on an op's thread,
    Dagster's run termination (DagsterExecutionInterruptedError lands in this wait, not inside the
    work). With `grace_s`, such an interruption sets STOP and gives the work up to `grace_s` to give
    back its claims and record its results before the interruption goes on. The thread is a daemon,
    so a second Ctrl-C can still force the process out.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # re-raised on the waiting thread below
            box["error"] = exc

    worker = threading.Thread(target=target, name=name, daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except BaseException:
        if grace_s is not None:
            STOP.set()
            worker.join(grace_s)
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


__all__ = [
    "FAILURE",
    "SKIPPED",
    "SUCCESS",
    "SUMMARY_KEY",
    "config_failure",
    "config_of",
    "config_schema_of",
    "empty_summary",
    "finish",
    "record_skipped",
    "resolve_run_date",
    "run_in_thread",
    "stop_on_interrupt",
    "summary_metadata",
    "utcnow",
    "validated_plan",
]
