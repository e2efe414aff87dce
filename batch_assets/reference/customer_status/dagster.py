"""The customer-status sweep in Dagster, built by the one sweep-job builder with its own hooks: a third mode
(config-change), the date-of-birth key as a per-run resource, the triggers and events it writes as extra assets,
its own checks, schedules and rules sensor. Lineage:

    customers ─▶ customer_status ─▶ review_triggers
                                └─▶ outbox_events
"""

# No `from __future__ import annotations`: Dagster reads the check annotations at runtime.

import dataclasses
from collections.abc import Mapping
from datetime import date
from typing import Any

import dagster as dg
import sqlalchemy as sa

from batch_assets import (
    CursorRange,
    DatabaseResource,
    ExtraAsset,
    PrepareContext,
    Prepared,
    Sweep,
    SweepJob,
    SweepSchedule,
    asset_job_run_config,
    build_sweep_job,
    celery_on_redis_executor,
    counts_table,
    even_split,
    observable_table,
    records_table,
)
from batch_assets.reference.customer_status import sql
from batch_assets.reference.customer_status.job import CustomerStatusSettings
from batch_assets.reference.customer_status.names import NAMES, SWEEP_JOB_KEY
from batch_assets.reference.customer_status.resources import encryption_resources
from batch_assets.reference.customer_status.rules_store import current_rules, settled_rules
from batch_assets.reference.customer_status.sensor import sensors_for
from batch_assets.reference.customer_status.sweep import CustomerStatusSweep

GROUP = "customer_status"


def split_key_space(count: int) -> list[CursorRange]:
    """`count` contiguous inclusive UUID ranges of equal width covering the whole key space: customer ids are random
    UUIDs, so equal widths hold about equal rows, and the range keys of existing checkpoints stay the same."""
    return even_split("uuid", count)


def prepare(ctx: PrepareContext) -> Prepared:
    """The key (a missing or malformed one stops the run before any read) and the rules in force."""
    cipher = ctx.resources.encryption.cipher()
    with ctx.engine.connect() as conn:
        version, rules = current_rules(conn)

    def definition(mode: str, run_date: date) -> Sweep:
        previous = None
        if mode == "config-change":
            with ctx.engine.connect() as conn:
                previous = settled_rules(conn)
        return CustomerStatusSweep(mode, cipher=cipher, run_date=run_date, rules=rules, previous_rules=previous)

    return Prepared(definition=definition, plan_ranges=lambda conn, count: split_key_space(count),
                    fingerprint=rules.fingerprint, describe=f"rules v{version} ({rules.fingerprint})")


def status_metadata(summary: Mapping[str, Any], engine: sa.Engine) -> dict[str, Any]:
    counts, categories = counts_table(engine, sql.CATEGORY_COUNTS, label="age_category")
    return {"decrypted": int(summary.get("decrypted") or 0), "active_customers": sum(counts.values()),
            "counts_by_category": categories}


def checks(asset_key: dg.AssetKey) -> list[dg.AssetChecksDefinition]:
    @dg.asset_check(asset=asset_key, name="no_overdue_active_customers",
                    description="After the last successful delta, no ACTIVE customer is still due on or before its "
                    "run date (rows the run could not evaluate are allowed, up to its failed count).")
    def no_overdue_active_customers(database: DatabaseResource) -> dg.AssetCheckResult:
        with database.get_engine().connect() as conn:
            last = conn.execute(sql.LAST_DELTA_SQL).first()
            if last is None:
                return dg.AssetCheckResult(passed=True, metadata={"last_delta_run_date": "none yet"})
            run_date: date = last.run_date
            overdue = int(conn.execute(sql.OVERDUE_SQL, {"run_date": run_date}).scalar_one())
        return dg.AssetCheckResult(
            passed=overdue <= int(last.failed),
            metadata={"last_delta_run_date": str(run_date), "overdue": overdue, "failed_in_run": int(last.failed)},
        )

    @dg.asset_check(asset="review_triggers", name="review_triggers_unique",
                    description="Review triggers are unique per customer, category and date.")
    def review_triggers_unique(database: DatabaseResource) -> dg.AssetCheckResult:
        with database.get_engine().connect() as conn:
            duplicates = int(conn.execute(sql.DUPLICATE_TRIGGERS_SQL).scalar_one())
        return dg.AssetCheckResult(passed=duplicates == 0, metadata={"duplicate_keys": duplicates})

    return [no_overdue_active_customers, review_triggers_unique]


customers = observable_table(
    "customers",
    "SELECT status, count(*) AS n, max(updated_at)::text AS latest FROM customers GROUP BY status",
    "Customers (written by other services); ACTIVE rows are swept.",
)

SWEEP = SweepJob(
    name="customer_status",
    description="Recompute age_category / next_review_date of ACTIVE customers (delta, full or config-change) over "
    "cursor ranges",
    prepare=prepare,
    source=dg.AssetKey("customers"),
    source_asset=customers,
    modes=("delta", "full", "config-change"),
    settings=CustomerStatusSettings,
    config_name="SweepConfig",
    names=NAMES,
    group=GROUP,
    resource_keys=("encryption",),
    resources=encryption_resources,
    report_metadata=status_metadata,
    extra_assets=(
        ExtraAsset("review_triggers",
                   "One review trigger per category change (unique per customer, category and effective date); "
                   "written by the sweep in the page write of the status.",
                   lambda summary: {"triggers": int(summary.get("triggers") or 0)},
                   materialization="review triggers written by the {mode} sweep for {run_date}"),
        ExtraAsset("outbox_events",
                   "age_category_changed events, one per changed customer, written by the sweep with the status; "
                   "relayed by outbox_relay_job.",
                   lambda summary: {"events": int(summary.get("audit_events") or 0)},
                   materialization="age_category_changed events written by the {mode} sweep for {run_date}"),
    ),
    checks=checks,
    schedules=(
        SweepSchedule("delta", "0 2 * * *", name="daily_delta_schedule",
                      description="Delta sweep every day at 02:00: customers due on the run date or not computed yet."),
        SweepSchedule("full", "0 3 * * 0", name="weekly_full_schedule",
                      description="Full sweep every Sunday at 03:00 (every ACTIVE customer, in cursor ranges)."),
    ),
    variants={"celery": celery_on_redis_executor},
)

_BUILT = build_sweep_job(SWEEP)
SPEC = dataclasses.replace(_BUILT, sensors=sensors_for(_BUILT.asset_jobs[0]))

SweepConfig: Any = SPEC.config
"""The run config: launchpad fields, defaults and descriptions derived from CustomerStatusSettings."""
customer_status_sweep_job = SPEC.job
customer_status_sweep_celery_job = SPEC.variants["celery"]
customer_status_asset_job = SPEC.asset_jobs[0]
SWEEP_ASSET_KEYS = [dg.AssetKey("customer_status"), dg.AssetKey("review_triggers"), dg.AssetKey("outbox_events")]
SWEEP_TAGS = dict(customer_status_sweep_job.tags)


def sweep_run_config(config: Any) -> dict:
    """Run config of customer_status_asset_job for one sweep (plan_sweep's config, nested under the graph)."""
    return asset_job_run_config(NAMES, config.model_dump(mode="json"))


__all__ = ["SPEC", "SWEEP_ASSET_KEYS", "SWEEP_JOB_KEY", "SWEEP_TAGS", "SweepConfig", "customer_status_asset_job",
           "customer_status_sweep_celery_job", "customer_status_sweep_job", "records_table", "sweep_run_config"]
