"""Run summaries in `ba_run_history`: how a job's numbers reach the CLI and the UI."""

from __future__ import annotations

import json
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa

INSERT_SUMMARY = sa.text(
    """
    INSERT INTO ba_run_history (run_id, job, mode, run_date, status, started_at, summary)
    VALUES (:run_id, :job, :mode, :run_date, :status, :started_at, CAST(:summary AS jsonb))
    """
)
# :run_id — the Dagster run id
LATEST_SUMMARY = sa.text(
    "SELECT summary FROM ba_run_history WHERE run_id = :run_id ORDER BY id DESC LIMIT 1"
)


def empty_summary(status: str, run_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """A summary with the JSON summary's keys and zero counters (a skipped run, or a failure before any work)."""
    return {
        "status": status,
        "run_id": run_id,
        "scanned": 0,
        "changed": 0,
        "unchanged": 0,
        "failed": 0,
        "failed_by_type": {},
        "duration_s": 0.0,
        **extra,
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, (date, datetime)):
        return value.isoformat()
    return str(value)


def record(
    target: sa.Engine | sa.Connection,
    *,
    run_id: str,
    job: str,
    status: str,
    started_at: datetime,
    summary: dict[str, Any],
    mode: str | None = None,
    run_date: date | None = None,
) -> None:
    """Insert a run's summary: in a transaction of its own on an engine, or in the caller's on a connection (a
    job's ops pass one whose transaction is bounded: db.timeouts.bounded)."""
    params = {
        "run_id": run_id,
        "job": job,
        "mode": mode,
        "run_date": run_date,
        "status": status,
        "started_at": started_at,
        "summary": json.dumps(summary, default=_jsonable),
    }
    if isinstance(target, sa.Connection):
        target.execute(INSERT_SUMMARY, params)
        return
    with target.begin() as conn:
        conn.execute(INSERT_SUMMARY, params)


ALL_SUMMARIES = sa.text("SELECT summary FROM ba_run_history WHERE run_id = :run_id ORDER BY id")
# :run_id — the Dagster run id


def all_for_run(engine: sa.Engine, run_id: str) -> list[dict[str, Any]]:
    """Every summary a run recorded, oldest first (a failed mapped sweep records one per failed range)."""
    with engine.connect() as conn:
        return [dict(s) for s in conn.execute(ALL_SUMMARIES, {"run_id": run_id}).scalars()]


def latest(engine: sa.Engine, run_id: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        return conn.execute(LATEST_SUMMARY, {"run_id": run_id}).scalar()
