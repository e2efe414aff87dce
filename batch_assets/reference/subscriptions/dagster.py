"""The nightly subscription expiry in Dagster: config, op, job, assets, check and schedules
(docs/guide/subscriptions.md).

Lineage: subscriptions, enrollments ─▶ subscription_status.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

from collections.abc import Callable
from typing import Any

import dagster as dg

from batch_assets import (
    APP_DATABASE_POOL,
    SKIPPED,
    STOP,
    AlertsResource,
    CalendarResource,
    DatabaseResource,
    JobLockResource,
    JobSpec,
    LockNotAcquired,
    OpProgress,
    config_class,
    config_of,
    config_schema_of,
    counts_table,
    empty_summary,
    finish,
    observable_table,
    resolve_run_date,
    run_numbers,
    schedule_timezone,
    stop_on_interrupt,
    tick_date,
    utcnow,
    validated_plan,
)
from batch_assets.reference.subscriptions import sql
from batch_assets.reference.subscriptions.expiry import ExpiryJobSettings, run_expiry_job

NIGHTLY = "nightly_jobs"


# --- config ------------------------------------------------------------------------------


ExpiryConfig = config_class(
    ExpiryJobSettings, "ExpiryConfig",
    "Nightly subscription expiry (docs/guide/subscriptions.md), derived from ExpiryJobSettings. run_date: expire "
    "ACTIVE subscriptions with expiry_date before it (default today).",
    fields=("run_date", "allow_distant_run_date", "retry_failed", "batch_size", "max_retries"),
)
"""The run config: launchpad fields, defaults and descriptions derived from ExpiryJobSettings; `to_settings()`
builds the settings model (every bound and cross-field rule, one place)."""


# --- op and job ----------------------------------------------------------------------------


@dg.op(tags={"kind": "expiry"}, pool=APP_DATABASE_POOL, config_schema=config_schema_of(ExpiryConfig))
def expire_subscriptions(
    context: dg.OpExecutionContext,
    database: DatabaseResource,
    job_lock: JobLockResource,
    alerts: AlertsResource,
    calendar: CalendarResource,
) -> dict:
    """Expire ACTIVE subscriptions past their expiry date (or retry FAILED ones) under the job lock."""

    started_at = utcnow()
    plan = validated_plan(config_of(ExpiryConfig, context))  # a bad field: one line naming it, no stack trace
    run_date = resolve_run_date(plan, calendar)
    engine = database.get_engine()
    mode = "retry_failed" if plan.retry_failed else "nightly"
    progress = OpProgress(context, label="subscription expiry", asset_key="subscription_status")
    try:
        with stop_on_interrupt(), progress:
            result = run_expiry_job(
                engine,
                run_date=run_date,
                settings=plan.engine,
                run_id=context.run_id,
                retry_failed=plan.retry_failed,
                lock=job_lock.lock_for(engine),
                stop=STOP,
                progress=progress,
            )
    except LockNotAcquired as exc:
        summary = empty_summary(SKIPPED, context.run_id, reason=str(exc), run_date=run_date.isoformat(), mode=mode)
        return finish(context, engine, summary=summary, started_at=started_at, mode=mode, run_date=run_date)
    _alert_expiry(context, alerts, result, plan.engine.max_retries)
    summary = finish(
        context, engine, summary=result.to_summary(context.run_id), started_at=started_at, mode=mode,
        run_date=run_date,
    )
    _, table = counts_table(engine, sql.SUBSCRIPTIONS_BY_STATUS, label="status")
    context.log_event(
        dg.AssetMaterialization(
            asset_key="subscription_status",
            description=f"{mode} expiry for {run_date}",
            metadata={
                "run_date": str(run_date),
                "expired": summary["changed"],
                "failed": summary["failed"],
                "enrollments_deleted": int(summary.get("enrollments_deleted") or 0),
                "subscriptions_by_status": table,
                **run_numbers(summary),
            },
        )
    )
    return summary


def _alert_expiry(context: dg.OpExecutionContext, alerts: AlertsResource, result: Any, max_retries: int) -> None:
    """Alert (log + webhook) on retries exhausted and on a run ended by consecutive batch failures; ids only."""
    base = {"run_id": context.run_id, "job": context.job_name, "run_date": result.run_date.isoformat()}
    if result.exhausted:
        text = (f"batch_assets: {result.exhausted} subscription(s) reached the maximum retry count "
                f"({max_retries}) in run {context.run_id}; they stay FAILED")
        context.log.error(text)
        alerts.send(text, {**base, "kind": "retries_exhausted", "count": result.exhausted,
                           "max_retries": max_retries, "subscription_ids": list(result.exhausted_ids)})
    if result.stopped_by == "batch_failures":
        text = f"batch_assets: subscription expiry run {context.run_id} FAILED: {result.error}"
        context.log.error(text)
        alerts.send(text, {**base, "kind": "batch_failures", "status": "FAILURE",
                           "batch_retries": result.batch_retries})


@dg.job(description="Expire ACTIVE subscriptions past their expiry date (nightly), or retry FAILED ones.",
        tags={"batch_assets/kind": "expiry"})
def subscription_expiry_job() -> None:
    expire_subscriptions()


# --- assets and check ------------------------------------------------------------------------

subscriptions = observable_table(
    "subscriptions",
    "SELECT status, count(*) AS n, NULL::text AS latest FROM subscriptions GROUP BY status",
    "Subscriptions (written by other services); expired nightly.",
)
enrollments = observable_table(
    "enrollments",
    "SELECT 'ALL' AS status, count(*) AS n, max(id)::text AS latest FROM enrollments",
    "Enrollments of subscriptions (written by other services); deleted with an expired subscription.",
)
subscription_status = dg.AssetSpec(
    "subscription_status",
    deps=["subscriptions", "enrollments"],
    group_name=NIGHTLY,
    description="Status of subscriptions (ACTIVE / EXPIRED / FAILED), maintained by subscription_expiry_job.",
    kinds={"postgres"},
)



@dg.asset_check(
    asset="subscription_status",
    description="Count of FAILED subscriptions; warns when any exist "
    "(retry with `subscriptions expire --retry-failed`).",
)
def failed_subscriptions(database: DatabaseResource) -> dg.AssetCheckResult:
    with database.get_engine().connect() as conn:
        count_, max_retries = conn.execute(sql.FAILED_SUBSCRIPTIONS_SQL).one()
    return dg.AssetCheckResult(
        passed=int(count_) == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"failed": int(count_), "max_retry_count": int(max_retries)},
    )


# --- schedules -------------------------------------------------------------------------------


def _expiry_tick(retry_failed: bool, timezone: str) -> Callable[[dg.ScheduleEvaluationContext], dg.RunRequest]:
    prefix = "expiry-retry" if retry_failed else "expiry"

    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        run_date = tick_date(context, timezone)
        config = ExpiryConfig(run_date=run_date or None, retry_failed=retry_failed)
        return dg.RunRequest(
            run_key=f"{prefix}:{run_date or 'now'}",
            run_config=dg.RunConfig(ops={"expire_subscriptions": config}),
            tags={"batch_assets/run_date": run_date, "batch_assets/mode": "retry_failed" if retry_failed
                  else "nightly"},
        )

    return evaluate


def build_schedules(timezone: str, status: dg.DefaultScheduleStatus) -> list[dg.ScheduleDefinition]:
    """Nightly expiry at 00:30 and the retry of FAILED subscriptions at 06:30."""
    tz = schedule_timezone(timezone)
    return [
        dg.ScheduleDefinition(
            name="nightly_subscription_expiry_schedule",
            cron_schedule="30 0 * * *",
            job=subscription_expiry_job,
            execution_fn=_expiry_tick(False, tz),
            execution_timezone=tz,
            default_status=status,
            description="Expire subscriptions past their expiry date every night at 00:30.",
        ),
        dg.ScheduleDefinition(
            name="failed_subscriptions_retry_schedule",
            cron_schedule="30 6 * * *",
            job=subscription_expiry_job,
            execution_fn=_expiry_tick(True, tz),
            execution_timezone=tz,
            default_status=status,
            description="Retry FAILED subscriptions (`subscriptions expire --retry-failed`) every day at 06:30, "
            "until the maximum retry count; reaching it raises an alert.",
        ),
    ]


SPEC = JobSpec(
    job=subscription_expiry_job,
    config=ExpiryConfig,
    config_op="expire_subscriptions",
    assets=[subscriptions, enrollments, subscription_status],
    asset_checks=[failed_subscriptions],
    schedules=build_schedules,
)
