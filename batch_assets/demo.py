"""`batch-assets demo`: the README's main job, end to end, on whatever database is configured.

With no variables set it starts the embedded PostgreSQL, migrates, seeds, and
runs each job as a Dagster run, printing what each did. Safe to run again: it
seeds only empty tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from batch_assets.errors import EXIT_FAILED, EXIT_OK
from batch_assets.settings import Settings


def _count(engine: sa.Engine, table: str) -> int:
    # `table` comes from the fixed tuple below, never from input.
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar() or 0)  # noqa: S608


def run_demo(
    settings: Settings,
    *,
    rows: int,
    emit: Callable[[dict[str, Any]], None],
    err: Callable[[str], None],
) -> int:
    from batch_assets.db.engine import connected_engine, describe_target
    from batch_assets.db.migrate import LIBRARY, labels, migrate
    from batch_assets.orchestration.outbox_job import OutboxRelayConfig
    from batch_assets.reference.customer_status.crypto import cipher_from_settings
    from batch_assets.reference.customer_status.dagster import SweepConfig
    from batch_assets.reference.migrations import REFERENCE
    from batch_assets.reference.payments.dagster import QueueDrainConfig
    from batch_assets.reference.subscriptions.dagster import ExpiryConfig
    from batch_assets.run_dates import today_in

    run_date = today_in(settings.timezone)
    cipher = cipher_from_settings(settings)
    engine = connected_engine(settings)
    err(f"database: {describe_target(engine.url)} ({'embedded' if settings.embedded else 'configured'})")
    applied = migrate(engine, (LIBRARY, REFERENCE))
    err(f"migrations applied: {labels(applied)}")

    seeded: dict[str, int] = {}
    if _count(engine, "customers") == 0:
        from batch_assets.reference.customer_status.rules_store import rules_in_force
        from batch_assets.reference.customer_status.seed import seed_customers

        report = seed_customers(engine, cipher, rows, run_date=run_date, bad_fraction=0.002, seed=7,
                                rules=rules_in_force(engine))
        seeded["customers"] = report.rows
        err(f"seeded {report.rows:,} customers in {report.duration_s:.1f}s")
    if _count(engine, "subscriptions") == 0:
        from batch_assets.reference.subscriptions.seed import seed_subscriptions

        seeded["subscriptions"] = seed_subscriptions(engine, rows, seed=7, run_date=run_date)
        err(f"seeded {seeded['subscriptions']:,} subscriptions")
    if _count(engine, "payments") == 0:
        from batch_assets.reference.payments.seed import seed_payments

        seeded["payments"] = seed_payments(engine, min(rows, 2_000), seed=7)
        err(f"seeded {seeded['payments']:,} payments")

    steps: list[tuple[str, str, Any]] = [
        ("full sweep", "customer_status_sweep_job", SweepConfig(mode="full", run_date=run_date.isoformat())),
        ("delta sweep", "customer_status_sweep_job", SweepConfig(mode="delta", run_date=run_date.isoformat())),
        ("subscription expiry", "subscription_expiry_job", ExpiryConfig(run_date=run_date.isoformat())),
        ("payment queue drain", "payment_queue_drain_job", QueueDrainConfig(max_seconds=60)),
        ("outbox relay", "outbox_relay_job", OutboxRelayConfig()),
    ]
    results: dict[str, Any] = {}
    worst = EXIT_OK
    from batch_assets.orchestration.launch import launch_job

    for label, job, config in steps:
        err(f"--- {label} ({job})")
        result = launch_job(job, config, settings=settings)
        summary = dict(result.summary or {"status": "FAILURE"})
        summary["run_id"] = result.run_id
        results[label] = summary
        err("    " + ", ".join(f"{k}={summary.get(k)}" for k in
                              ("status", "scanned", "changed", "unchanged", "failed", "duration_s")))
        if summary.get("status") == "FAILURE":
            worst = EXIT_FAILED
    err("open the Dagster UI on the same instance: make ui  (or: batch-assets ui)")
    emit({"status": "SUCCESS" if worst == EXIT_OK else "FAILURE", "run_date": run_date.isoformat(),
          "seeded": seeded, "jobs": results})
    return worst
