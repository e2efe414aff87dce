"""Schedules: daily delta, weekly full, nightly subscription expiry, retry of FAILED subscriptions, the relay.

Built by `build_schedules` when the code location loads (definitions.py), never at import:
the execution time zone is BATCH_ASSETS_TIMEZONE (default "UTC") and the default status is
RUNNING unless BATCH_ASSETS_AUTOMATION=off (CONTRACT §8). Each schedule uses a run key per
tick (a tick never starts two runs) and is safe against overlap through the job lock: a run
that finds the lock held ends SKIPPED. Scheduled runs pass the tick's date as run date, so a
late or re-evaluated tick computes the day it was meant for. The sweeps target the assets
(customer_status_asset_job), so the asset pages show their automation.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

from collections.abc import Callable
from datetime import datetime

import dagster as dg

from batch_assets.orchestration.config import ExpiryConfig, OutboxRelayConfig, SweepConfig, zone
from batch_assets.orchestration.jobs import customer_status_asset_job, outbox_relay_job, subscription_expiry_job

SWEEP_GRAPH_NODE = "customer_status_sweep"
"""The graph-backed asset's node in customer_status_asset_job: its ops' config nests under it."""


def schedule_timezone(name: str) -> str:
    """The execution time zone of every schedule (validated: an unknown zone names BATCH_ASSETS_TIMEZONE)."""
    zone(name)
    return name


def automation_status(running: bool) -> dg.DefaultScheduleStatus:
    return dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED


def sweep_run_config(config: SweepConfig) -> dict:
    """Run config of customer_status_asset_job for one sweep (plan_sweep's config, nested under the graph)."""
    return {"ops": {SWEEP_GRAPH_NODE: {"ops": {"plan_sweep": {"config": config.model_dump()}}}}}


def _tick_date(context: dg.ScheduleEvaluationContext, timezone: str) -> str:
    when = context.scheduled_execution_time
    if when is None:  # evaluated outside the daemon (e.g. a test without a time)
        return ""
    return when.astimezone(zone(timezone)).date().isoformat()


def _tick_minute(when: datetime | None, timezone: str) -> str:
    return when.astimezone(zone(timezone)).isoformat(timespec="minutes") if when else "now"


def _sweep(mode: str, timezone: str) -> Callable[[dg.ScheduleEvaluationContext], dg.RunRequest]:
    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        run_date = _tick_date(context, timezone)
        return dg.RunRequest(
            run_key=f"{mode}:{run_date or 'now'}",
            run_config=sweep_run_config(SweepConfig(mode=mode, run_date=run_date or None)),
            tags={"batch_assets/mode": mode, "batch_assets/run_date": run_date},
        )

    return evaluate


def _expiry(retry_failed: bool, timezone: str) -> Callable[[dg.ScheduleEvaluationContext], dg.RunRequest]:
    prefix = "expiry-retry" if retry_failed else "expiry"

    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        run_date = _tick_date(context, timezone)
        config = ExpiryConfig(run_date=run_date or None, retry_failed=retry_failed)
        return dg.RunRequest(
            run_key=f"{prefix}:{run_date or 'now'}",
            run_config=dg.RunConfig(ops={"expire_subscriptions": config}),
            tags={"batch_assets/run_date": run_date, "batch_assets/mode": "retry_failed" if retry_failed
                  else "nightly"},
        )

    return evaluate


def _relay(timezone: str) -> Callable[[dg.ScheduleEvaluationContext], dg.RunRequest]:
    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        return dg.RunRequest(
            run_key=f"outbox:{_tick_minute(context.scheduled_execution_time, timezone)}",
            run_config=dg.RunConfig(ops={"relay_outbox_events": OutboxRelayConfig()}),
        )

    return evaluate


def build_schedules(timezone: str, *, running: bool) -> list[dg.ScheduleDefinition]:
    """Every schedule, in `timezone`, RUNNING or STOPPED by default."""
    tz = schedule_timezone(timezone)
    status = automation_status(running)
    return [
        dg.ScheduleDefinition(
            name="daily_delta_schedule",
            cron_schedule="0 2 * * *",
            job=customer_status_asset_job,
            execution_fn=_sweep("delta", tz),
            execution_timezone=tz,
            default_status=status,
            description="Delta sweep every day at 02:00: customers due on the run date or not computed yet.",
        ),
        dg.ScheduleDefinition(
            name="weekly_full_schedule",
            cron_schedule="0 3 * * 0",
            job=customer_status_asset_job,
            execution_fn=_sweep("full", tz),
            execution_timezone=tz,
            default_status=status,
            description="Full sweep every Sunday at 03:00 (every ACTIVE customer, in cursor ranges).",
        ),
        dg.ScheduleDefinition(
            name="nightly_subscription_expiry_schedule",
            cron_schedule="30 0 * * *",
            job=subscription_expiry_job,
            execution_fn=_expiry(False, tz),
            execution_timezone=tz,
            default_status=status,
            description="Expire subscriptions past their expiry date every night at 00:30.",
        ),
        dg.ScheduleDefinition(
            name="failed_subscriptions_retry_schedule",
            cron_schedule="30 6 * * *",
            job=subscription_expiry_job,
            execution_fn=_expiry(True, tz),
            execution_timezone=tz,
            default_status=status,
            description="Retry FAILED subscriptions (`subscriptions expire --retry-failed`) every day at 06:30, "
            "until the maximum retry count; reaching it raises an alert.",
        ),
        dg.ScheduleDefinition(
            name="outbox_relay_schedule",
            cron_schedule="*/5 * * * *",
            job=outbox_relay_job,
            execution_fn=_relay(tz),
            execution_timezone=tz,
            default_status=status,
            description="Relay pending outbox events every 5 minutes, a safety net: for latency under a second run "
            "`batch-assets outbox relay --follow` (the job lock keeps one relay at a time).",
        ),
    ]
