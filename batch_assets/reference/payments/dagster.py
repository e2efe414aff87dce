"""The payment queue in Dagster: the worker's config, op and job, its asset, checks and drain sensor
(docs/guide/payment-queue.md).

Lineage: payments ─▶ payment_status.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import dataclasses
import json
import time
from typing import Any

import dagster as dg
from pydantic import Field

from batch_assets import (
    BREAKER_CODES,
    IN_PROGRESS,
    LIMITS_URL_VAR,
    STATUSES,
    DatabaseResource,
    Handler,
    JobLockResource,
    QueueJob,
    QueueSettings,
    QueueWorkConfig,
    Settings,
    build_queue_job,
    env_if_set,
    fail_if_dead,
    markdown_table,
    observable_table,
)
from batch_assets.reference.payments import sql
from batch_assets.reference.payments.declaration import PAYMENTS_QUEUE
from batch_assets.reference.payments.handler import PAYMENT_HANDLER_VAR, default_handler
from batch_assets.reference.payments.queue import dlq_size, queue_stats

NIGHTLY = "nightly_jobs"
QUEUE_DRAIN_INTERVAL_S = 30
"""The next drain starts this many seconds after the previous one finished."""
QUEUE_DRAIN_MAX_SECONDS = 300
"""A sensor-started drain stops claiming after this long (the next one picks up the rest)."""


# --- config ------------------------------------------------------------------------------


class QueueDrainConfig(QueueWorkConfig):
    """The payment worker: a drain, or the resident worker. Unset = the payments queue's declared value
    (`declaration.PAYMENTS_QUEUE`)."""


# --- the handler (docs/guide/payment-queue.md) -----------------------------------------------------------------


class PaymentHandlerResource(dg.ConfigurableResource):
    """The payments' handler of a worker run (docs/guide/payment-queue.md): BATCH_ASSETS_PAYMENT_HANDLER when set,
    else the POST
    to BATCH_ASSETS_LIMITS_URL, else the simulated handler (demo). Both reach it only through EnvVar."""

    plugin: str | None = Field(
        default=None, description="`module:function` of your own handler (EnvVar BATCH_ASSETS_PAYMENT_HANDLER). "
        "Unset: the limits service, else the simulation.")
    limits_url: str | None = Field(
        default=None, description="The limits service (EnvVar BATCH_ASSETS_LIMITS_URL). Unset: the simulation.")

    def handler(self, settings: QueueSettings) -> Handler:
        """The handler for one run with `settings` (an unimportable plug-in: ConfigError naming the variable)."""
        return default_handler(self.limits_url or None, settings.http_timeout_s, concurrency=settings.concurrency,
                               plugin=(self.plugin or "").strip() or None)


def payment_resources(settings: Settings) -> dict[str, Any]:
    """The payment job's own resource: the handler, its variables bound by EnvVar when they are set."""
    return {"payment_handler": PaymentHandlerResource(plugin=env_if_set(PAYMENT_HANDLER_VAR),
                                                      limits_url=env_if_set(LIMITS_URL_VAR))}


# --- the job: the one queue-job builder, with the payments' handler resource and report -----------------------


def _handler(resources: Any, settings: QueueSettings) -> Handler:
    return resources.payment_handler.handler(settings)


def _report(context: dg.OpExecutionContext, engine: Any, summary: dict[str, Any], result: Any, run: Any) -> None:
    """payment_status after a drain: numbers, so the UI's Plots tab charts them across drains."""
    stats = queue_stats(engine)
    context.log_event(
        dg.AssetMaterialization(
            asset_key="payment_status",
            description="payment queue drain" if run.drain else "resident payment worker",
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
                "payments_by_status": status_table(stats),
                "duration_s": summary["duration_s"],
            },
        )
    )


_BUILT = build_queue_job(QueueJob(
    PAYMENTS_QUEUE, job="payment_queue_drain_job", op="drain_payment_queue", config=QueueDrainConfig,
    description="The payment worker: drain the queue once (drain=True) or stay resident until stopped; claim due "
    "payments, call the handler, record results in bulk.",
    resource_keys=("payment_handler",), handler=_handler, report=_report, progress_asset="payment_status",
    resources=payment_resources,
))
payment_queue_drain_job = _BUILT.job


# --- assets and checks ------------------------------------------------------------------------

payments = observable_table(
    "payments",
    "SELECT status, count(*) AS n, max(created_at)::text AS latest FROM payments GROUP BY status",
    "Payments (written by other services); processed by the payment queue.",
)
def payment_status_metadata(engine: Any) -> dict[str, Any]:
    """The numbers of payment_status shown between drains: counts by status, the oldest due payment, the DLQ."""
    stats = queue_stats(engine)
    return {"oldest_due_s": float(stats["oldest_due_s"]), "dlq_size": int(stats["dlq_size"]),
            "payments_by_status": status_table(stats),
            # The four statuses by name; another service's status of its own (say 'new') only in the count of
            # unknown ones, so it can never overwrite a real count's key.
            **{f"payments_{k.lower()}": stats["by_status"][k] for k in STATUSES},
            "payments_unknown_status": int(stats["unknown_status"])}


def status_table(stats: dict[str, Any]) -> dg.MetadataValue:
    """`queue_stats`'s counts by status as a table: the one scan of payments a drain or an observation makes
    for its numbers (counting them again would read the whole table a second time, DONE rows and all)."""
    return markdown_table(("status", "rows"), sorted(stats["by_status"].items()))


@dg.multi_observable_source_asset(
    specs=[dg.AssetSpec(
        "payment_status",
        deps=["payments"],
        group_name=NIGHTLY,
        description="Status of payments (NEW / PROCESSING / DONE / FAILED), maintained by payment_queue_drain_job; "
        "payment_queue_drain_sensor is its automation (a drain when payments are due, an observation otherwise).",
        kinds={"postgres"},
    )],
    name="observe_payment_status",
)
def payment_status(database: DatabaseResource) -> Any:
    """Observe payment_status (no payment is touched)."""
    yield dg.ObserveResult(asset_key="payment_status", metadata=payment_status_metadata(database.get_engine()))


payment_status_observation_job = dg.define_asset_job(
    "payment_status_observation_job",
    selection=dg.AssetSelection.assets("payment_status"),
    description="Observe payment_status (counts by status, oldest due payment, DLQ size); no payment is touched.",
)



@dg.asset_check(asset="payment_status", description="No payment is stuck in PROCESSING past its claim lease.")
def no_payment_stuck_in_processing(database: DatabaseResource) -> dg.AssetCheckResult:
    with database.get_engine().connect() as conn:
        stuck, oldest = conn.execute(sql.STUCK_PAYMENTS_SQL).one()
    return dg.AssetCheckResult(
        passed=int(stuck) == 0, metadata={"stuck": int(stuck), "oldest_claimed_until": str(oldest or "")}
    )


@dg.asset_check(
    asset="payment_status",
    description="Size of the dead-letter queue (FAILED payments); warns when not empty (`queue dlq replay`).",
)
def dead_letter_queue_size(database: DatabaseResource) -> dg.AssetCheckResult:
    size = dlq_size(database.get_engine())
    return dg.AssetCheckResult(passed=size == 0, severity=dg.AssetCheckSeverity.WARN, metadata={"dlq_size": size})


# --- the drain sensor ---------------------------------------------------------------------------


OBSERVE_EVERY_S = 300
"""While nothing is due, the drain sensor observes payment_status at most this often (only when it changed)."""


def _seconds_until_due(database: DatabaseResource) -> float | None:
    """Seconds until the next payment is due (<= 0: one is due now), None when nothing is queued."""
    with database.get_engine().connect() as conn:
        value = conn.exec_driver_sql(sql.NEXT_DUE_IN).scalar()
    return None if value is None else float(value)


def _idle_observation(context: dg.SensorEvaluationContext, database: DatabaseResource, reason: str) -> dg.SensorResult:
    """A skipped tick; every OBSERVE_EVERY_S, an observation of payment_status when its counts changed (no run)."""
    state = json.loads(context.cursor) if context.cursor else {}
    if time.time() - float(state.get("observed_at") or 0) < OBSERVE_EVERY_S:
        return dg.SensorResult(skip_reason=dg.SkipReason(reason))
    metadata = payment_status_metadata(database.get_engine())
    digest = json.dumps(sorted((k, v) for k, v in metadata.items() if isinstance(v, int) and k != "oldest_due_s"))
    cursor = json.dumps({"observed_at": time.time(), "digest": digest})
    if digest == state.get("digest"):
        return dg.SensorResult(skip_reason=dg.SkipReason(reason), cursor=cursor)
    observation = dg.AssetObservation(
        asset_key="payment_status",
        description="observed by payment_queue_drain_sensor while nothing was due (no run)",
        metadata=metadata,
    )
    return dg.SensorResult(skip_reason=dg.SkipReason(reason), cursor=cursor, asset_events=[observation])


def payment_queue_drain(context: dg.SensorEvaluationContext, database: DatabaseResource,
                        job_lock: JobLockResource) -> dg.SensorResult:
    """A drain only when a payment is due, QUEUE_DRAIN_INTERVAL_S after the last one finished; never two at once.

    While nothing is due no run starts ("quiet when idle", docs/production/operations.md); payment_status still gets
    fresh
    numbers, as an observation on a tick.
    """
    records = context.instance.get_run_records(
        filters=dg.RunsFilter(job_name=payment_queue_drain_job.name), limit=1
    )
    last = records[0] if records else None
    died = None
    if last is not None:
        run = last.dagster_run
        # A drain whose process died is failed here by the watchdog's rule (orchestration.watchdog), so payments
        # never stop being drained behind it (the next one starts at once); one that never started is failed by
        # Dagster's run monitoring.
        if run.status in IN_PROGRESS:
            died = fail_if_dead(context.instance, database.get_engine(), last, job_lock.redis_url)
            if died is None:
                return dg.SensorResult(skip_reason=dg.SkipReason(f"drain {run.run_id} is {run.status.value}"))
    due_in = _seconds_until_due(database)
    if due_in is None or due_in > 0:
        reason = "no payment queued" if due_in is None else f"no payment due (next in {due_in:.0f}s)"
        return _idle_observation(context, database, reason)
    if last is not None and died is None:
        finished = last.end_time or (last.update_timestamp.timestamp() if last.update_timestamp else 0.0)
        wait_s = finished + QUEUE_DRAIN_INTERVAL_S - time.time()
        if wait_s > 0:
            return dg.SensorResult(skip_reason=dg.SkipReason(f"payments due; next drain in {wait_s:.0f}s"))
    # The run key names the previous run, so two racing ticks can never start two drains after it.
    previous = last.dagster_run.run_id if last is not None else "none"
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                job_name=payment_queue_drain_job.name,
                run_key=f"drain-after:{previous}",
                run_config=dg.RunConfig(
                    ops={"drain_payment_queue": QueueDrainConfig(max_seconds=QUEUE_DRAIN_MAX_SECONDS, drain=True)}
                ),
            )
        ]
    )


def build_sensors(status: dg.DefaultSensorStatus) -> list[dg.SensorDefinition]:
    return [
        dg.sensor(
            name="payment_queue_drain_sensor",
            # The observation job makes the sensor payment_status's automation in the UI (it observes the
            # asset on idle ticks itself, without a run).
            jobs=[payment_queue_drain_job, payment_status_observation_job],
            minimum_interval_seconds=10,
            default_status=status,
            description=f"Starts a payment queue drain when payments are due, at least {QUEUE_DRAIN_INTERVAL_S}s "
            "after the last one finished; never two at once, none while a resident `queue work` run (the same "
            "job) is running, and none while nothing is due (then it observes payment_status instead).",
        )(payment_queue_drain),
    ]


SPEC = dataclasses.replace(
    _BUILT,
    assets=[payments, payment_status],
    asset_checks=[no_payment_stuck_in_processing, dead_letter_queue_size],
    sensors=build_sensors,
    asset_jobs=[payment_status_observation_job],
)
