"""The jobs. Each one ends in an op that records the run's summary in run history.

Executors: every job has Dagster's default executor (multiprocess, or `in_process`
through run config — the CLI uses in-process). Under multiprocess, the sweep's
cursor ranges run in parallel processes; `customer_status_sweep_celery_job` is the
same graph on the celery executor (ranges run on celery workers; broker from
BATCH_ASSETS_CELERY_BROKER_URL, default redis://127.0.0.1:6379/0). docs/KUBERNETES.md
shows the same graph on the Kubernetes executor.
"""

from __future__ import annotations

import os

import dagster as dg
from dagster_celery import celery_executor

from batch_assets.orchestration.ops.jobs import drain_payment_queue, expire_subscriptions, relay_outbox_events
from batch_assets.orchestration.ops.sweep import plan_sweep, summarise_sweep, sweep_range

CELERY_BROKER_VAR = "BATCH_ASSETS_CELERY_BROKER_URL"
DEFAULT_CELERY_BROKER = "redis://127.0.0.1:6379/0"


@dg.graph(description="Customer-status sweep: plan cursor ranges, sweep each (mapped), summarise.")
def customer_status_sweep() -> None:
    tasks = plan_sweep()
    summarise_sweep(tasks.map(sweep_range).collect())


customer_status_sweep_job = customer_status_sweep.to_job(
    name="customer_status_sweep_job",
    description="Recompute age_category / next_review_date (delta, full or config-change) over cursor ranges.",
    tags={"batch_assets/kind": "sweep"},
)


def celery_broker_url() -> str:
    return os.environ.get(CELERY_BROKER_VAR, "").strip() or DEFAULT_CELERY_BROKER


def _celery_config(config: dict) -> dict:
    # The same Redis serves as broker and result backend.
    return {"broker": config["broker"], "backend": config["broker"]}


celery_on_redis_executor = celery_executor.configured(
    _celery_config,
    name="celery",
    config_schema={
        "broker": dg.Field(
            str,
            is_required=False,
            default_value=celery_broker_url(),
            description=f"Redis URL of the celery broker and result backend "
            f"(default {CELERY_BROKER_VAR} or {DEFAULT_CELERY_BROKER}).",
        )
    },
)

customer_status_sweep_celery_job = customer_status_sweep.to_job(
    name="customer_status_sweep_celery_job",
    description="The customer-status sweep with its cursor ranges executed on celery workers.",
    executor_def=celery_on_redis_executor,
    tags={"batch_assets/kind": "sweep"},
)


@dg.job(description="Expire ACTIVE subscriptions past their expiry date (nightly), or retry FAILED ones.",
        tags={"batch_assets/kind": "expiry"})
def subscription_expiry_job() -> None:
    expire_subscriptions()


@dg.job(description="The payment worker: drain the queue once (drain=True) or stay resident until stopped; "
        "claim due payments, call the handler, record results in bulk.",
        tags={"batch_assets/kind": "queue"})
def payment_queue_drain_job() -> None:
    drain_payment_queue()


@dg.job(description="Relay PENDING outbox events to the sink and mark them SENT.",
        tags={"batch_assets/kind": "outbox"})
def outbox_relay_job() -> None:
    relay_outbox_events()


JOBS = [
    customer_status_sweep_job,
    customer_status_sweep_celery_job,
    subscription_expiry_job,
    payment_queue_drain_job,
    outbox_relay_job,
]
