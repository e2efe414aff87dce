"""The outbox relay in Dagster: config, op, job, backlog check and schedule (PENDING → sink → SENT).

The events are the customer-status sweep's `outbox_events` asset; the relay observes it.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import dagster as dg
from pydantic import Field

from batch_assets.db.privileges import GUARDED, table
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import LockNotAcquired
from batch_assets.locking.guard import job_guard
from batch_assets.orchestration.automation import schedule_timezone, tick_minute
from batch_assets.orchestration.budget import APP_DATABASE_POOL
from batch_assets.orchestration.config import config_class
from batch_assets.orchestration.metadata import counts_table, run_numbers
from batch_assets.orchestration.ops import (
    FAILURE,
    SKIPPED,
    SUCCESS,
    config_of,
    config_schema_of,
    empty_summary,
    finish,
    stop_on_interrupt,
    utcnow,
    validated_plan,
)
from batch_assets.orchestration.resources import DatabaseResource, JobLockResource
from batch_assets.orchestration.spec import JobSpec
from batch_assets.outbox import sql
from batch_assets.outbox.relay import backlog, follow_outbox, relay_outbox
from batch_assets.outbox.settings import OutboxRelayJobSettings
from batch_assets.outbox.sinks import (
    DEFAULT_NATS_STREAM,
    DEFAULT_STREAM,
    JsonLinesSink,
    NatsJetStreamSink,
    RabbitMQSink,
    RedisStreamSink,
    Sink,
)
from batch_assets.settings import OUTBOX_SINK_VAR, Settings, check_outbox_sink
from batch_assets.shutdown import STOP

OUTBOX_RELAY_JOB_KEY = "outbox_relay"


# --- config ------------------------------------------------------------------------------


OutboxRelayConfig = config_class(
    OutboxRelayJobSettings, "OutboxRelayConfig", "The outbox relay (PENDING → sink → SENT).",
    fields=("follow", "follow_seconds", "batch_size", "claim_lease_s", "send_timeout_s"),
)


# --- sinks (one resource class per broker; BATCH_ASSETS_OUTBOX_SINK picks one in the definitions) -----------


class OutboxSinkResource(dg.ConfigurableResource):
    """Where the relay sends: `open_sink(timeout_s)` gives a Sink whose `send_batch` returns only once every
    event was confirmed."""

    def open_sink(self, timeout_s: float) -> Sink:
        raise NotImplementedError


class FileSinkResource(OutboxSinkResource):
    """A JSON-lines file, fsynced per batch (BATCH_ASSETS_OUTBOX_SINK=file:PATH, or unset)."""

    path: str = Field(description="The file: BATCH_ASSETS_OUTBOX_SINK=file:PATH, unset "
                      "<BATCH_ASSETS_HOME>/outbox.jsonl (resolved when the code location loads).")

    def open_sink(self, timeout_s: float) -> Sink:
        return JsonLinesSink(self.path)


class RedisSinkResource(OutboxSinkResource):
    """A Redis stream, one entry per event with its id (BATCH_ASSETS_OUTBOX_SINK=redis://...)."""

    url: str = Field(description="Redis URL (EnvVar BATCH_ASSETS_OUTBOX_SINK).")
    stream: str = Field(default=DEFAULT_STREAM, description="The stream events are XADDed to.")

    def open_sink(self, timeout_s: float) -> Sink:
        return RedisStreamSink(self.url, self.stream, timeout_s=timeout_s)


class RabbitMQSinkResource(OutboxSinkResource):
    """RabbitMQ with publisher confirms, message_id = the event id (BATCH_ASSETS_OUTBOX_SINK=amqp://...)."""

    url: str = Field(description="AMQP URL (EnvVar BATCH_ASSETS_OUTBOX_SINK).")
    exchange: str = Field(default=DEFAULT_STREAM, description="Durable topic exchange, declared when missing.")
    queue: str = Field(default=DEFAULT_STREAM, description="Durable queue bound to the exchange, declared when "
                       "missing; empty: declare none (consumers bind their own).")
    routing_key: str = Field(default="", description="Routing key of every message. Empty: the event type.")
    binding_key: str = Field(default="#", description="The queue's binding to the exchange.")

    def open_sink(self, timeout_s: float) -> Sink:
        return RabbitMQSink(self.url, exchange=self.exchange, queue=self.queue, routing_key=self.routing_key or None,
                            binding_key=self.binding_key, timeout_s=timeout_s)


class NatsSinkResource(OutboxSinkResource):
    """NATS JetStream, header Nats-Msg-Id = the event id, every PubAck awaited (BATCH_ASSETS_OUTBOX_SINK=nats://...)."""

    url: str = Field(description="NATS URL (EnvVar BATCH_ASSETS_OUTBOX_SINK).")
    stream: str = Field(default=DEFAULT_NATS_STREAM, description="The JetStream stream, created when missing.")
    subject: str = Field(default=DEFAULT_STREAM, description="Subject prefix: events go to <subject>.<event type>; "
                         "a stream created here holds <subject>.>.")

    def open_sink(self, timeout_s: float) -> Sink:
        return NatsJetStreamSink(self.url, stream=self.stream, subject=self.subject, timeout_s=timeout_s)


def sink_resources(settings: Settings) -> dict[str, OutboxSinkResource]:
    """The sink resource BATCH_ASSETS_OUTBOX_SINK names (checked by load_settings); a URL reaches it as an EnvVar."""
    target = settings.outbox_sink or check_outbox_sink(None, settings.home)
    if target.kind == "file":
        return {"outbox_sink": FileSinkResource(path=target.location)}
    url: Any = dg.EnvVar(OUTBOX_SINK_VAR)
    if target.kind == "redis":
        return {"outbox_sink": RedisSinkResource(url=url)}
    if target.kind == "amqp":
        return {"outbox_sink": RabbitMQSinkResource(url=url)}
    return {"outbox_sink": NatsSinkResource(url=url)}


# --- op and job ----------------------------------------------------------------------------


def _relay_summary(outcome: Any, run_id: str, *, follow: bool) -> dict[str, Any]:
    """The relay's RelayResult as a JSON summary (scanned = changed = events sent).

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


@dg.op(tags={"kind": "outbox"}, pool=APP_DATABASE_POOL, config_schema=config_schema_of(OutboxRelayConfig))
def relay_outbox_events(
    context: dg.OpExecutionContext,
    database: DatabaseResource,
    job_lock: JobLockResource,
    outbox_sink: OutboxSinkResource,
) -> dict:
    """Send PENDING outbox events to the sink and mark them SENT, one relay at a time (job lock)."""

    started_at = utcnow()
    plan = validated_plan(config_of(OutboxRelayConfig, context))  # a bad field: one line naming it, no stack trace
    engine = database.get_engine()
    sink = outbox_sink.open_sink(plan.send_timeout_s)
    try:
        with stop_on_interrupt(), job_guard(
            engine, job_key=OUTBOX_RELAY_JOB_KEY, run_id=context.run_id, settings=RELAY_GUARD,
            lock=job_lock.lock_for(engine),
        ) as guard:
            if plan.follow:
                deadline = time.monotonic() + plan.follow_seconds if plan.follow_seconds else None
                context.log.info("outbox relay: following (woken by notifications) until stopped")
                outcome = follow_outbox(
                    engine, sink=sink, owner=guard.owner, settings=plan, stop=STOP,
                    alive=lambda: guard.alive() and (deadline is None or time.monotonic() < deadline),
                )
                if not guard.alive():  # another relay took lock or lease over: this one must not go on
                    outcome = dataclasses.replace(outcome, error="LeaseLost")
            else:
                outcome = relay_outbox(engine, sink=sink, owner=guard.owner, settings=plan, stop=STOP)
    except LockNotAcquired as exc:
        summary = empty_summary(SKIPPED, context.run_id, reason=str(exc))
        return finish(context, engine, summary=summary, started_at=started_at)
    finally:
        sink.close()
    summary = finish(context, engine, summary=_relay_summary(outcome, context.run_id, follow=plan.follow),
                     started_at=started_at)
    pending, oldest_s = backlog(engine)
    _, table = counts_table(engine, sql.EVENTS_BY_STATUS, label="status")
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


@dg.job(description="Relay PENDING outbox events to the sink and mark them SENT (one pass, or follow).",
        tags={"batch_assets/kind": "outbox"})
def outbox_relay_job() -> None:
    relay_outbox_events()


# --- check and schedule ----------------------------------------------------------------------

DEFAULT_MAX_PENDING = 10_000
DEFAULT_MAX_OLDEST_PENDING_S = 600.0


class OutboxBacklogConfig(dg.Config):
    """Thresholds of the outbox backlog check (a warning past either one)."""

    max_pending: int = Field(
        default=DEFAULT_MAX_PENDING, ge=0, le=10**9, description="Warn when more events than this are PENDING."
    )
    max_oldest_pending_s: float = Field(
        default=DEFAULT_MAX_OLDEST_PENDING_S, ge=0, le=30 * 24 * 3600,
        description="Warn when the oldest PENDING event is older than this many seconds.",
    )


@dg.asset_check(
    asset="outbox_events",
    description="Relay backlog: PENDING events and the age of the oldest one; warns past the configured "
    "thresholds (the relay is down, slow or failing).",
)
def outbox_backlog(config: OutboxBacklogConfig, database: DatabaseResource) -> dg.AssetCheckResult:
    pending, oldest_s = backlog(database.get_engine())
    return dg.AssetCheckResult(
        passed=pending <= config.max_pending and oldest_s <= config.max_oldest_pending_s,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "pending": pending,
            "oldest_pending_s": round(oldest_s, 3),
            "max_pending": config.max_pending,
            "max_oldest_pending_s": config.max_oldest_pending_s,
        },
    )


def _relay_tick(timezone: str) -> Callable[[dg.ScheduleEvaluationContext], dg.RunRequest | dg.SkipReason]:
    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        # Quiet when idle (docs/production/operations.md): no relay run while no event is PENDING (a claimed one
        # whose send is under
        # way is still PENDING, so a crashed relay's events are picked up by the next tick's run).
        pending, _ = backlog(context.resources.database.get_engine())
        if pending == 0:
            return dg.SkipReason("no outbox event pending: no relay run")
        return dg.RunRequest(
            run_key=f"outbox:{tick_minute(context.scheduled_execution_time, timezone)}",
            run_config=dg.RunConfig(ops={"relay_outbox_events": OutboxRelayConfig()}),
        )

    return evaluate


def build_schedules(timezone: str, status: dg.DefaultScheduleStatus) -> list[dg.ScheduleDefinition]:
    tz = schedule_timezone(timezone)
    return [
        dg.ScheduleDefinition(
            name="outbox_relay_schedule",
            cron_schedule="*/5 * * * *",
            job=outbox_relay_job,
            execution_fn=_relay_tick(tz),
            required_resource_keys={"database"},
            execution_timezone=tz,
            default_status=status,
            description="Relay pending outbox events every 5 minutes (no run when none is pending), a safety net: "
            "for latency under a second run `batch-assets outbox relay --follow` (the job lock keeps one relay at a "
            "time).",
        ),
    ]


SPEC = JobSpec(
    job=outbox_relay_job,
    config=OutboxRelayConfig,
    config_op="relay_outbox_events",
    asset_checks=[outbox_backlog],
    schedules=build_schedules,
    resources=sink_resources,
    privileges=(*table("SELECT, UPDATE", "outbox_events"), *GUARDED),
)
