"""A CLI run's outcome, made truthful: the run's summary from run history, reconciled with what Dagster says of the
run and of each of its steps (a range that never recorded a summary is a range that did not finish).

Run history is the first source. A summary it lacks (its insert failed: a grant revoked, a lock held too long) is
read from the run's own events, where each op also puts its summary (the step's output or failure metadata,
`ops.SUMMARY_KEY`), so the numbers reported are always those of the rows the run committed: never zero for work
done, and never a range counted twice (each range is taken from one source)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.db.engine import is_transient
from batch_assets.errors import BatchAssetsError, first_line
from batch_assets.orchestration.ops import SUMMARY_KEY
from batch_assets.orchestration.spec import JobSpec


@dataclass(frozen=True)
class LaunchResult:
    run_id: str
    dagster_status: str
    """The Dagster run status: SUCCESS, FAILURE, CANCELED, ..."""
    summary: dict[str, Any] | None
    """The job's summary (the JSON summary's keys); a FAILURE summary when the run failed before recording one."""


SUMMARY_READ_ATTEMPTS = 5


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


def read_summary(run_id: str, engine: sa.Engine, spec: JobSpec, events: Sequence[Any] = ()) -> dict[str, Any] | None:
    """The run's summary from run history, else from the run's `events`, or None.

    The final op's record when there is one; a mapped sweep that failed has no final op, only
    one record per range that recorded one; those are merged here (FAILURE wins, counters add
    up) and `reconcile` accounts for the ranges that recorded nothing. A summary run history
    lacks comes from the events: the final op's, else each range's that run history does not
    have. A database that is restarting is waited for a few seconds before this gives up.
    """
    records = with_db_retries(lambda: run_history.all_for_run(engine, run_id))
    final = [r for r in records if "range" not in r]
    if final:
        return dict(final[-1])
    in_events, event_ranges = summaries_in_events(events, spec.mapped_op)
    if in_events is not None:
        return in_events
    parts = {str(r.get("range")): dict(r) for r in records}
    for part in event_ranges:
        parts.setdefault(str(part.get("range")), part)
    ranges = list(parts.values())
    if not ranges:
        return None
    if len(ranges) == 1 or spec.merge_records is None:
        return ranges[-1]
    return spec.merge_records(ranges)


def summaries_in_events(events: Sequence[Any], mapped_op: str | None) -> tuple[dict[str, Any] | None,
                                                                                 list[dict[str, Any]]]:
    """(the last summary a step other than a mapped range put in its metadata, or None; each range's last one)."""
    final: dict[str, Any] | None = None
    ranges: dict[str, dict[str, Any]] = {}
    prefix = f"{mapped_op}[" if mapped_op else None
    for event in events:
        value = _summary_in(event)
        if value is None:
            continue
        if prefix is not None and str(event.step_key or "").startswith(prefix):
            value.pop("owner", None)
            ranges[str(event.step_key)] = value
        else:
            final = value
    return final, list(ranges.values())


def _summary_in(event: Any) -> dict[str, Any] | None:
    metadata: Any = None
    if event.is_step_failure:
        failure = event.step_failure_data.user_failure_data
        metadata = failure.metadata if failure is not None else None
    elif event.is_successful_output:
        metadata = event.step_output_data.metadata
    entry = (metadata or {}).get(SUMMARY_KEY)
    value = getattr(entry, "value", None)
    return dict(value) if isinstance(value, Mapping) else None


def with_db_retries(work: Any, attempts: int = SUMMARY_READ_ATTEMPTS) -> Any:
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


def error_of(result: Any) -> str | None:
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
