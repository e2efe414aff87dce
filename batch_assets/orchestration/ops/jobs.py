"""Ops of the single-step jobs: subscription expiry, payment queue drain, outbox relay."""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import dataclasses
import time
from typing import Any

import dagster as dg
import sqlalchemy as sa

from batch_assets.alerts import send_alert
from batch_assets.engine.result import FAILURE, SKIPPED, SUCCESS
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import LockNotAcquired
from batch_assets.orchestration.config import ExpiryConfig, OutboxRelayConfig, QueueDrainConfig
from batch_assets.orchestration.metadata import counts_table, run_numbers
from batch_assets.orchestration.ops.common import (
    empty_summary,
    finish,
    resolve_run_date,
    stop_on_interrupt,
    utcnow,
    validated_plan,
)
from batch_assets.orchestration.progress import OpProgress
from batch_assets.orchestration.resources import DatabaseResource, JobLockResource
from batch_assets.settings import load_settings
from batch_assets.shutdown import STOP

OUTBOX_RELAY_JOB_KEY = "outbox_relay"

SUBSCRIPTION_COUNTS = sa.text("SELECT status, count(*) AS n FROM subscriptions GROUP BY status ORDER BY status")
PAYMENT_COUNTS = sa.text("SELECT status, count(*) AS n FROM payments GROUP BY status ORDER BY status")
OUTBOX_COUNTS = sa.text("SELECT status, count(*) AS n FROM outbox_events GROUP BY status ORDER BY status")


def status_counts(engine: sa.Engine, query: sa.TextClause) -> tuple[dict[str, int], dg.MetadataValue]:
    """Rows by status, as numbers and as a table."""
    return counts_table(engine, query, label="status")


@dg.op(tags={"kind": "expiry"})
def expire_subscriptions(
    context: dg.OpExecutionContext,
    config: ExpiryConfig,
    database: DatabaseResource,
    job_lock: JobLockResource,
) -> dict:
    """Expire ACTIVE subscriptions past their expiry date (or retry FAILED ones) under the job lock."""
    from batch_assets.domains.subscriptions.expiry import run_expiry_job

    started_at = utcnow()
    plan = validated_plan(config)
    run_date = resolve_run_date(plan.run_date)
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
    _alert_expiry(context, result, plan.engine.max_retries)
    summary = finish(
        context, engine, summary=result.to_summary(context.run_id), started_at=started_at, mode=mode,
        run_date=run_date,
    )
    _, table = status_counts(engine, SUBSCRIPTION_COUNTS)
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


def _alert_expiry(context: dg.OpExecutionContext, result: Any, max_retries: int) -> None:
    """Alert (log + webhook) on retries exhausted and on a run ended by consecutive batch failures; ids only."""
    webhook = load_settings().alert_webhook
    base = {"run_id": context.run_id, "job": context.job_name, "run_date": result.run_date.isoformat()}
    if result.exhausted:
        text = (f"batch_assets: {result.exhausted} subscription(s) reached the maximum retry count "
                f"({max_retries}) in run {context.run_id}; they stay FAILED")
        context.log.error(text)
        send_alert(text, {**base, "kind": "retries_exhausted", "count": result.exhausted,
                          "max_retries": max_retries, "subscription_ids": list(result.exhausted_ids)}, webhook)
    if result.stopped_by == "batch_failures":
        text = f"batch_assets: subscription expiry run {context.run_id} FAILED: {result.error}"
        context.log.error(text)
        send_alert(text, {**base, "kind": "batch_failures", "status": "FAILURE",
                          "batch_retries": result.batch_retries}, webhook)


@dg.op(tags={"kind": "queue"})
def drain_payment_queue(
    context: dg.OpExecutionContext,
    config: QueueDrainConfig,
    database: DatabaseResource,
) -> dict:
    """Process due payments until the queue is drained (or max_seconds pass)."""
    from batch_assets.domains.payments.handler import default_handler
    from batch_assets.domains.payments.worker import run_worker

    started_at = utcnow()
    plan = validated_plan(config)
    engine = database.get_engine(min_pool_size=plan.engine.concurrency + 2)
    settings = load_settings()
    handler = default_handler(settings.limits_url, plan.engine.http_timeout_s, concurrency=plan.engine.concurrency)
    progress = OpProgress(context, label="payment queue", asset_key="payment_status")
    try:
        with stop_on_interrupt(), progress:
            result = run_worker(
                engine, plan.engine, handler=handler, stop=STOP, max_seconds=plan.max_seconds, drain=True,
                progress=progress,
            )
    finally:
        handler.close()
    summary = finish(context, engine, summary=result.to_summary(context.run_id), started_at=started_at)
    counts, table = status_counts(engine, PAYMENT_COUNTS)
    context.log_event(
        dg.AssetMaterialization(
            asset_key="payment_status",
            description="payment queue drain",
            metadata={
                "done": summary["changed"],
                "retried": int(summary.get("retried") or 0),
                "failed": summary["failed"],
                "dlq_size": int(summary.get("dlq_size") or counts.get("FAILED", 0)),
                "payments_by_status": table,
                "duration_s": summary["duration_s"],
            },
        )
    )
    return summary


def _relay_summary(outcome: Any, run_id: str, *, follow: bool) -> dict[str, Any]:
    """The relay's RelayResult as a CONTRACT §2 summary (scanned = changed = events sent).

    One pass fails on its first send failure; follow mode retries those and fails only when it lost
    its lock or lease.
    """
    failed = outcome.error is not None and (not follow or outcome.error == "LeaseLost")
    summary = empty_summary(FAILURE if failed else SUCCESS, run_id)
    summary.update(
        scanned=outcome.sent,
        changed=outcome.sent,
        sent=outcome.sent,
        batches=outcome.batches,
        send_failures=outcome.failures,
        duration_s=round(outcome.duration_s, 3),
    )
    if failed:
        summary["error"] = f"relay stopped by {outcome.error}; the batch stays PENDING"
        summary["failed_by_type"] = {outcome.error: 1}
    return summary


RELAY_GUARD = SweepSettings()
"""Lock 120 s renewed every 10 s by the heartbeat, lease 60 s: the same timings as the sweep's."""


@dg.op(tags={"kind": "outbox"})
def relay_outbox_events(
    context: dg.OpExecutionContext,
    config: OutboxRelayConfig,
    database: DatabaseResource,
    job_lock: JobLockResource,
) -> dict:
    """Send PENDING outbox events to the sink and mark them SENT, one relay at a time (job lock)."""
    from batch_assets.locking.guard import job_guard
    from batch_assets.outbox.relay import backlog, follow_outbox, make_sink, relay_outbox

    started_at = utcnow()
    plan = validated_plan(config)
    engine = database.get_engine()
    sink = make_sink(load_settings(), timeout_s=plan.engine.send_timeout_s)
    try:
        with stop_on_interrupt(), job_guard(
            engine, job_key=OUTBOX_RELAY_JOB_KEY, run_id=context.run_id, settings=RELAY_GUARD,
            lock=job_lock.lock_for(engine),
        ) as guard:
            if plan.follow:
                deadline = time.monotonic() + plan.follow_seconds if plan.follow_seconds else None
                context.log.info("outbox relay: following (woken by notifications) until stopped")
                outcome = follow_outbox(
                    engine, sink=sink, owner=guard.owner, settings=plan.engine, stop=STOP,
                    alive=lambda: guard.alive() and (deadline is None or time.monotonic() < deadline),
                )
                if not guard.alive():  # another relay took lock or lease over: this one must not go on
                    outcome = dataclasses.replace(outcome, error="LeaseLost")
            else:
                outcome = relay_outbox(engine, sink=sink, owner=guard.owner, settings=plan.engine, stop=STOP)
    except LockNotAcquired as exc:
        summary = empty_summary(SKIPPED, context.run_id, reason=str(exc))
        return finish(context, engine, summary=summary, started_at=started_at)
    finally:
        close = getattr(sink, "close", None)
        if close is not None:
            close()
    summary = finish(context, engine, summary=_relay_summary(outcome, context.run_id, follow=plan.follow),
                     started_at=started_at)
    pending, oldest_s = backlog(engine)
    _, table = status_counts(engine, OUTBOX_COUNTS)
    context.log_event(
        dg.AssetObservation(
            asset_key="outbox_events",
            description="outbox relay",
            metadata={
                "sent": int(summary.get("sent") or 0),
                "pending": pending,
                "oldest_pending_s": round(oldest_s, 3),
                "send_failures": int(summary.get("send_failures") or 0),
                "events_by_status": table,
                **run_numbers(summary),
            },
        )
    )
    return summary


__all__ = ["FAILURE", "drain_payment_queue", "expire_subscriptions", "relay_outbox_events"]
