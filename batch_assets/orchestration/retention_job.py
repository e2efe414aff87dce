"""Retention in Dagster (docs/production/operations.md): its config, op, job and daily schedule.

The schedule and `batch-assets retention run` start the same job; the op runs `run_retention`
(bounded batches, short transactions) and records a JSON summary with the count per table.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import dagster as dg

from batch_assets.db.privileges import LEDGER, RUN_HISTORY, table
from batch_assets.orchestration.automation import schedule_timezone, tick_date
from batch_assets.orchestration.budget import APP_DATABASE_POOL
from batch_assets.orchestration.config import config_class
from batch_assets.orchestration.ops import (
    SUCCESS,
    config_of,
    config_schema_of,
    empty_summary,
    finish,
    stop_on_interrupt,
    utcnow,
    validated_plan,
)
from batch_assets.orchestration.resources import DatabaseResource
from batch_assets.orchestration.spec import JobSpec
from batch_assets.retention.prune import RetentionSettings, run_retention
from batch_assets.shutdown import STOP

RetentionConfig = config_class(
    RetentionSettings, "RetentionConfig",
    "Retention (`retention run`, docs/reference/cli.md), derived from RetentionSettings.")


@dg.op(tags={"kind": "retention"}, pool=APP_DATABASE_POOL, config_schema=config_schema_of(RetentionConfig))
def prune_retention(context: dg.OpExecutionContext, database: DatabaseResource) -> dict:
    """Delete SENT outbox events, run history and finished checkpoints older than the cutoff, batch by batch."""
    started_at = utcnow()
    settings = validated_plan(config_of(RetentionConfig, context))  # a bad field: one line naming it
    engine = database.get_engine()
    with stop_on_interrupt():
        result = run_retention(engine, settings, stop=STOP.is_set)
    deleted = result.deleted
    summary = {**empty_summary(SUCCESS, context.run_id), **result.to_summary()}
    summary["scanned"] = summary["changed"] = sum(deleted.values())
    summary["duration_s"] = round(result.duration_s, 3)
    context.log.info(f"retention: deleted {deleted} in {result.batches} batch(es), "
                     f"longest {result.longest_batch_s:.3f}s")
    return finish(context, engine, summary=summary, started_at=started_at)


@dg.job(description="Retention: delete SENT outbox events, run history and finished checkpoints older than "
        "older_than_days (30), in bounded batches with short transactions. Never a business row, a PENDING event "
        "or a checkpoint of an unfinished generation.", tags={"batch_assets/kind": "retention"})
def retention_job() -> None:
    prune_retention()


def build_schedules(timezone: str, status: dg.DefaultScheduleStatus) -> list[dg.ScheduleDefinition]:
    tz = schedule_timezone(timezone)

    def tick(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        return dg.RunRequest(run_key=f"retention:{tick_date(context, tz) or 'now'}")

    return [dg.ScheduleDefinition(
        name="daily_retention_schedule", cron_schedule="15 4 * * *", job=retention_job, execution_fn=tick,
        execution_timezone=tz, default_status=status,
        description="Retention every day at 04:15 (older than 30 days).",
    )]


SPEC = JobSpec(job=retention_job, config=RetentionConfig, config_op="prune_retention", schedules=build_schedules,
               privileges=(*table("SELECT, DELETE", "outbox_events"), *table("SELECT, DELETE", "ba_run_history"),
                           *table("SELECT, DELETE", "ba_checkpoints"), *LEDGER, *RUN_HISTORY))
