"""Schedules: daily delta, weekly full, nightly subscription expiry, the outbox relay.

Each runs in BATCH_ASSETS_TIMEZONE (default "UTC"), uses a run key per tick (a tick
never starts two runs) and is safe against overlap through the job lock: a run that
finds the lock held ends SKIPPED. Scheduled runs pass the tick's date as run date,
so a late or re-evaluated tick computes the day it was meant for.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import dagster as dg

from batch_assets.orchestration.config import ExpiryConfig, OutboxRelayConfig, SweepConfig, zone
from batch_assets.orchestration.jobs import customer_status_sweep_job, outbox_relay_job, subscription_expiry_job
from batch_assets.settings import load_settings


def schedule_timezone() -> str:
    """The execution time zone of every schedule (validated: an unknown zone names BATCH_ASSETS_TIMEZONE)."""
    name = load_settings().timezone
    zone(name)
    return name


TIMEZONE = schedule_timezone()


def _tick_date(context: dg.ScheduleEvaluationContext) -> str:
    when = context.scheduled_execution_time
    if when is None:  # evaluated outside the daemon (e.g. a test without a time)
        return ""
    return when.astimezone(zone(TIMEZONE)).date().isoformat()


def _sweep_request(context: dg.ScheduleEvaluationContext, mode: str) -> dg.RunRequest:
    run_date = _tick_date(context)
    config = SweepConfig(mode=mode, run_date=run_date or None)
    return dg.RunRequest(
        run_key=f"{mode}:{run_date or 'now'}",
        run_config=dg.RunConfig(ops={"plan_sweep": config}),
        tags={"batch_assets/mode": mode, "batch_assets/run_date": run_date},
    )


@dg.schedule(
    name="daily_delta_schedule",
    cron_schedule="0 2 * * *",
    job=customer_status_sweep_job,
    execution_timezone=TIMEZONE,
    description="Delta sweep every day at 02:00: customers due on the run date or not computed yet.",
)
def daily_delta_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    return _sweep_request(context, "delta")


@dg.schedule(
    name="weekly_full_schedule",
    cron_schedule="0 3 * * 0",
    job=customer_status_sweep_job,
    execution_timezone=TIMEZONE,
    description="Full sweep every Sunday at 03:00 (every ACTIVE customer, in cursor ranges).",
)
def weekly_full_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    return _sweep_request(context, "full")


@dg.schedule(
    name="nightly_subscription_expiry_schedule",
    cron_schedule="30 0 * * *",
    job=subscription_expiry_job,
    execution_timezone=TIMEZONE,
    description="Expire subscriptions past their expiry date every night at 00:30.",
)
def nightly_subscription_expiry_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    run_date = _tick_date(context)
    return dg.RunRequest(
        run_key=f"expiry:{run_date or 'now'}",
        run_config=dg.RunConfig(ops={"expire_subscriptions": ExpiryConfig(run_date=run_date or None)}),
        tags={"batch_assets/run_date": run_date},
    )


@dg.schedule(
    name="outbox_relay_schedule",
    cron_schedule="*/5 * * * *",
    job=outbox_relay_job,
    execution_timezone=TIMEZONE,
    description="Relay pending outbox events every 5 minutes.",
)
def outbox_relay_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    when = context.scheduled_execution_time
    key = when.astimezone(zone(TIMEZONE)).isoformat(timespec="minutes") if when else "now"
    return dg.RunRequest(
        run_key=f"outbox:{key}",
        run_config=dg.RunConfig(ops={"relay_outbox_events": OutboxRelayConfig()}),
    )


SCHEDULES = [daily_delta_schedule, weekly_full_schedule, nightly_subscription_expiry_schedule, outbox_relay_schedule]
