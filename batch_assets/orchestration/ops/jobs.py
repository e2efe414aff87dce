"""Ops of the single-step jobs: subscription expiry, payment queue drain, outbox relay."""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import dataclasses
import threading
import time
from typing import Any

import dagster as dg
import sqlalchemy as sa

from batch_assets.alerts import send_alert
from batch_assets.engine.result import FAILURE, SKIPPED, SUCCESS
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import ConfigError, LockNotAcquired
from batch_assets.orchestration.config import ExpiryConfig, OutboxRelayConfig, QueueDrainConfig
from batch_assets.orchestration.metadata import counts_table, run_numbers
from batch_assets.orchestration.ops.common import (
    config_failure,
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
    """Process due payments: until nothing is due (drain), or resident until stopped or max_seconds."""
    from batch_assets.domains.payments.handler import default_handler, plugin_spec_from_environment
    from batch_assets.domains.payments.queue import queue_stats
    from batch_assets.domains.payments.worker import BREAKER_CODES, run_worker

    started_at = utcnow()
    plan = validated_plan(config)
    settings = load_settings()
    try:  # an unimportable BATCH_ASSETS_PAYMENT_HANDLER fails the run before anything is claimed
        handler = default_handler(
            settings.limits_url, plan.engine.http_timeout_s, concurrency=plan.engine.concurrency,
            plugin=plugin_spec_from_environment(),
        )
    except ConfigError as exc:
        raise config_failure(exc) from None
    # The worker runs on two connections of its own; the pool serves the bookkeeping around it.
    engine = database.get_engine(min_pool_size=4)
    progress = OpProgress(context, label="payment queue", asset_key="payment_status")
    with stop_on_interrupt(), progress:
        result = _run_draining(
            lambda: run_worker(
                engine, plan.engine, handler=handler, stop=STOP, max_seconds=plan.max_seconds, drain=plan.drain,
                progress=progress,
            ),
            grace_s=plan.engine.drain_timeout_s + 30,
        )
    summary = finish(context, engine, summary=result.to_summary(context.run_id), started_at=started_at)
    stats = queue_stats(engine)
    _, table = status_counts(engine, PAYMENT_COUNTS)
    context.log_event(
        dg.AssetMaterialization(
            asset_key="payment_status",
            description="payment queue drain" if plan.drain else "resident payment worker",
            # Numbers, so the UI's Plots tab charts them across drains.
            metadata={
                "done": summary["changed"],
                "retried": int(summary.get("retried") or 0),
                "failed": summary["failed"],
                "throughput_per_s": float(result.per_s),
                "oldest_due_s": float(stats["oldest_due_s"]),
                "dlq_size": int(stats["dlq_size"]),
                "breaker_state": BREAKER_CODES[result.breaker],
                "breaker": dg.MetadataValue.text(result.breaker),
                "breaker_opened": result.breaker_opened,
                "payments_by_status": table,
                "duration_s": summary["duration_s"],
            },
        )
    )
    return summary


def _run_draining(fn: Any, *, grace_s: float) -> Any:
    """Run the worker in a thread of its own and wait for it here.

    A run termination (Dagster raises DagsterExecutionInterruptedError on the op's thread) then
    lands in this wait, not inside the worker's event loop: STOP is set, the worker gives back its
    claims and writes its results (up to `grace_s`), and only then does the interruption go on.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # re-raised on the op's thread below
            box["error"] = exc

    worker = threading.Thread(target=target, name="payment-worker", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except BaseException:
        STOP.set()
        worker.join(grace_s)
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


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
