"""The jobs. Each one ends in an op that records the run's summary in run history.

* `customer_status_asset_job` materializes customer_status, review_triggers and outbox_events
  (the graph-backed multi-asset over the sweep graph) and runs their checks in the same run:
  the schedules and the rules sensor start it, and so does "Materialize" in the UI.
* `customer_status_sweep_job` is the same graph as an op job, the one the CLI launches
  (`batch-assets sweep customer-status`); its runs report the same assets.
* `customer_status_sweep_celery_job` runs the cursor ranges on celery workers (broker from
  BATCH_ASSETS_CELERY_BROKER_URL, default redis://127.0.0.1:6379/0); it needs a worker, and a run
  fails when none shows up within `worker_wait_s`. docs/KUBERNETES.md shows the Kubernetes executor.

Executors: Dagster's default (multiprocess, or `in_process` through run config — the CLI uses
in-process); under multiprocess the cursor ranges run in parallel processes.
"""

from __future__ import annotations

import dagster as dg

from batch_assets.orchestration.assets import SWEEP_ASSET_KEYS, report_customer_status
from batch_assets.orchestration.celery import (
    CELERY_BROKER_VAR,
    DEFAULT_CELERY_BROKER,
    celery_broker_url,
    celery_on_redis_executor,
)
from batch_assets.orchestration.ops.jobs import drain_payment_queue, expire_subscriptions, relay_outbox_events
from batch_assets.orchestration.ops.sweep import plan_sweep, summarise_sweep, sweep_range

__all__ = ["CELERY_BROKER_VAR", "DEFAULT_CELERY_BROKER", "JOBS", "celery_broker_url"]

SWEEP_TAGS = {"batch_assets/kind": "sweep"}


@dg.graph(description="Customer-status sweep: plan cursor ranges, sweep each (mapped), summarise, report.")
def customer_status_sweep_graph() -> None:
    ranges = plan_sweep().map(sweep_range).collect()
    report_customer_status(summarise_sweep(ranges), ranges)


customer_status_sweep_job = customer_status_sweep_graph.to_job(
    name="customer_status_sweep_job",
    description="Recompute age_category / next_review_date (delta, full or config-change) over cursor ranges "
    "(the job the CLI launches; customer_status_asset_job is the same sweep as assets).",
    tags=SWEEP_TAGS,
)

customer_status_asset_job = dg.define_asset_job(
    "customer_status_asset_job",
    selection=dg.AssetSelection.assets(*SWEEP_ASSET_KEYS),
    description="Materialize customer_status, review_triggers and outbox_events with the customer-status sweep "
    "(plan → cursor ranges → summary) and run their asset checks. Config: "
    "ops.customer_status_sweep.ops.plan_sweep.config (mode, run_date, ...).",
    tags=SWEEP_TAGS,
)

customer_status_sweep_celery_job = customer_status_sweep_graph.to_job(
    name="customer_status_sweep_celery_job",
    description="The customer-status sweep with its cursor ranges executed on celery workers. Needs a running "
    "celery worker on queue 'dagster' (see README); without one the run fails after worker_wait_s (30 s).",
    executor_def=celery_on_redis_executor,
    tags=SWEEP_TAGS,
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


@dg.job(description="Relay PENDING outbox events to the sink and mark them SENT (one pass, or follow).",
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
"""The op jobs (what the CLI launches by name); the asset jobs are wired in definitions.py."""

ASSET_JOBS = [customer_status_asset_job]
