"""Retention in Dagster (CONTRACT §8): its config, op, job and daily schedule.

The schedule and `batch-assets retention run` start the same job; the op runs `run_retention`
(bounded batches, short transactions) and records a CONTRACT §2 summary with the count per table.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

from dataclasses import dataclass

import dagster as dg

from batch_assets.domains.retention.retention import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_OLDER_THAN_DAYS,
    MAX_BATCH_SIZE,
    MAX_OLDER_THAN_DAYS,
    RetentionSettings,
    run_retention,
)
from batch_assets.orchestration.automation import schedule_timezone, tick_date
from batch_assets.orchestration.config import JobConfig, count_field
from batch_assets.orchestration.ops import SUCCESS, empty_summary, finish, stop_on_interrupt, utcnow, validated_plan
from batch_assets.orchestration.resources import DatabaseResource
from batch_assets.orchestration.spec import JobSpec
from batch_assets.shutdown import STOP


@dataclass(frozen=True)
class RetentionPlan:
    settings: RetentionSettings


class RetentionConfig(JobConfig):
    """Retention (CONTRACT §2 `retention run`). 0 or missing = the documented default."""

    older_than_days: int = count_field(str(DEFAULT_OLDER_THAN_DAYS), maximum=MAX_OLDER_THAN_DAYS,
                                       description="Delete what is older than this many days.")
    batch_size: int = count_field(str(DEFAULT_BATCH_SIZE), maximum=MAX_BATCH_SIZE,
                                  description="Ids per delete transaction.")

    def to_settings(self) -> RetentionPlan:
        self.check_fields()
        return RetentionPlan(RetentionSettings(older_than_days=self.older_than_days or DEFAULT_OLDER_THAN_DAYS,
                                               batch_size=self.batch_size or DEFAULT_BATCH_SIZE))


@dg.op(tags={"kind": "retention"})
def prune_retention(context: dg.OpExecutionContext, config: RetentionConfig, database: DatabaseResource) -> dict:
    """Delete SENT outbox events, run history and finished checkpoints older than the cutoff, batch by batch."""
    started_at = utcnow()
    plan = validated_plan(config)
    engine = database.get_engine()
    with stop_on_interrupt():
        result = run_retention(engine, plan.settings, stop=STOP.is_set)
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


SPEC = JobSpec(job=retention_job, config=RetentionConfig, config_op="prune_retention", schedules=build_schedules)
