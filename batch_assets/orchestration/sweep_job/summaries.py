"""A ranged sweep's run summary: the ranges' summaries merged, each range's own record, and giving back a failed
run's lock and lease."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.db.engine import translate_errors
from batch_assets.db.timeouts import bounded
from batch_assets.engine.result import FAILURE, FAILURE_KINDS, SUCCESS
from batch_assets.errors import BatchAssetsError, error_text
from batch_assets.locking.lock import make_job_lock
from batch_assets.locking.run_guard import release_failed_run

log = logging.getLogger(__name__)

ADDITIVE = ("scanned", "changed", "unchanged", "failed", "pages", "decrypted", "triggers", "audit_events",
            "conflicts")
"""Summary counters that add up over a run's ranges."""
RANGE_COLUMNS = ("range", "scanned", "changed", "failed", "conflicts", "pages", "duration_s", "resumed_from")
"""The columns of the cursor-ranges table in an asset's metadata."""


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


def record_range(engine: sa.Engine, *, run_id: str, job: str, summary: dict[str, Any], task: Any) -> None:
    """Record one range's summary in run history (a FAILURE one carries the error and is resumable), so a run
    whose summary op never runs (a range failed) still reports what every range did.

    `task` is the range's task (index, count, started_at, mode, run_date)."""
    record = dict(summary)
    record["run_id"] = run_id
    record.pop("owner", None)
    status = record["status"] = SUCCESS if summary.get("status") == SUCCESS else FAILURE
    if status == FAILURE:
        record["error"] = f"range {task.index + 1}/{task.count} ({summary.get('range')}): " \
                          f"{summary.get('stopped_reason') or summary.get('status')}"
        # The range's checkpoint is its low watermark: the next run (or a re-execution from failure) resumes it.
        record["resumable"] = True
    record["duration_s"] = round((datetime.now(UTC) - task.started_at).total_seconds(), 3)
    with translate_errors(engine), bounded(engine) as conn:
        run_history.record(conn, run_id=run_id, job=job, status=status, started_at=task.started_at, summary=record,
                           mode=task.mode, run_date=task.run_date)


def started_at_of(results: Sequence[dict]) -> datetime:
    for part in results:
        if part.get("started_at"):
            return datetime.fromisoformat(part["started_at"])
    return datetime.now(UTC)


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
