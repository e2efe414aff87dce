"""What every job's schedules and sensors share: default status, tick dates, runs in progress.

Schedules and sensors are built when the code location loads (definitions.py), never at import:
the execution time zone is BATCH_ASSETS_TIMEZONE and the default status is RUNNING unless
BATCH_ASSETS_AUTOMATION=off (docs/production/operations.md). Every schedule uses a run key per tick (a tick never
starts two runs) and is safe against overlap through its job lock: a run that finds the lock held
ends SKIPPED. Scheduled runs pass the tick's date as run date, so a late or re-evaluated tick
computes the day it was meant for.
"""

from __future__ import annotations

from datetime import datetime

import dagster as dg

from batch_assets.run_dates import zone

IN_PROGRESS = frozenset({
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
})


def schedule_timezone(name: str) -> str:
    """The execution time zone of every schedule (validated: an unknown zone names BATCH_ASSETS_TIMEZONE)."""
    zone(name)
    return name


def schedule_status(running: bool) -> dg.DefaultScheduleStatus:
    return dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED


def sensor_status(running: bool) -> dg.DefaultSensorStatus:
    return dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED


def tick_date(context: dg.ScheduleEvaluationContext, timezone: str) -> str:
    """The tick's date in `timezone` (YYYY-MM-DD), or "" when evaluated without a time."""
    when = context.scheduled_execution_time
    if when is None:  # evaluated outside the daemon (e.g. a test without a time)
        return ""
    return when.astimezone(zone(timezone)).date().isoformat()


def tick_minute(when: datetime | None, timezone: str) -> str:
    return when.astimezone(zone(timezone)).isoformat(timespec="minutes") if when else "now"
