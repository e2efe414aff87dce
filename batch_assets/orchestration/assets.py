"""Assets and lineage.

The business tables (written by other services) are observable source assets. What
the jobs produce are external asset specs that the jobs' ops materialize or observe
at runtime, so the UI shows the lineage

    customers ─▶ customer_status ─▶ review_triggers
                                └─▶ outbox_events
    subscriptions, enrollments ─▶ subscription_status
    payments ─▶ payment_status
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import dagster as dg
import sqlalchemy as sa

from batch_assets.orchestration.resources import DatabaseResource

BUSINESS_TABLES = "business_tables"
CUSTOMER_STATUS = "customer_status"
NIGHTLY = "nightly_jobs"

# Table names are module constants (never input); each query counts rows by status.
_OBSERVE_SQL = {
    "customers": "SELECT status, count(*) AS n, max(updated_at)::text AS latest FROM customers GROUP BY status",
    "subscriptions": "SELECT status, count(*) AS n, NULL::text AS latest FROM subscriptions GROUP BY status",
    "enrollments": "SELECT 'ALL' AS status, count(*) AS n, max(id)::text AS latest FROM enrollments",
    "payments": "SELECT status, count(*) AS n, max(created_at)::text AS latest FROM payments GROUP BY status",
}

_DESCRIPTIONS = {
    "customers": "Customers (written by other services); ACTIVE rows are swept.",
    "subscriptions": "Subscriptions (written by other services); expired nightly.",
    "enrollments": "Enrollments of subscriptions (written by other services); deleted with an expired subscription.",
    "payments": "Payments (written by other services); processed by the payment queue.",
}


def observe_table(engine: sa.Engine, table: str) -> dg.ObserveResult:
    """Row counts by status as metadata; the data version changes whenever they do."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(_OBSERVE_SQL[table]).all()
    counts = {str(r.status): int(r.n) for r in rows}
    latest = max((r.latest for r in rows if r.latest), default="")
    version = ";".join(f"{k}={v}" for k, v in sorted(counts.items())) + f";{latest}"
    body = "\n".join(f"| {k} | {v:,} |" for k, v in sorted(counts.items()))
    return dg.ObserveResult(
        data_version=dg.DataVersion(version),
        metadata={
            "rows": sum(counts.values()),
            "rows_by_status": dg.MetadataValue.md("| status | rows |\n|---|---:|\n" + (body or "| (none) | 0 |")),
        },
    )


def _observable_table(table: str) -> dg.SourceAsset:
    @dg.observable_source_asset(name=table, group_name=BUSINESS_TABLES, description=_DESCRIPTIONS[table])
    def _observe(database: DatabaseResource) -> dg.ObserveResult:
        return observe_table(database.get_engine(), table)

    return _observe


customers = _observable_table("customers")
subscriptions = _observable_table("subscriptions")
enrollments = _observable_table("enrollments")
payments = _observable_table("payments")

customer_status = dg.AssetSpec(
    "customer_status",
    deps=["customers"],
    group_name=CUSTOMER_STATUS,
    description="age_category and next_review_date of ACTIVE customers, maintained by customer_status_sweep_job.",
    kinds={"postgres"},
)
review_triggers = dg.AssetSpec(
    "review_triggers",
    deps=["customer_status"],
    group_name=CUSTOMER_STATUS,
    description="One review trigger per category change (unique per customer, category and effective date).",
    kinds={"postgres"},
)
outbox_events = dg.AssetSpec(
    "outbox_events",
    deps=["customer_status"],
    group_name=CUSTOMER_STATUS,
    description="age_category_changed events, one per changed customer; relayed to the sink by outbox_relay_job.",
    kinds={"postgres"},
)
subscription_status = dg.AssetSpec(
    "subscription_status",
    deps=["subscriptions", "enrollments"],
    group_name=NIGHTLY,
    description="Status of subscriptions (ACTIVE / EXPIRED / FAILED), maintained by subscription_expiry_job.",
    kinds={"postgres"},
)
payment_status = dg.AssetSpec(
    "payment_status",
    deps=["payments"],
    group_name=NIGHTLY,
    description="Status of payments (NEW / PROCESSING / DONE / FAILED), maintained by payment_queue_drain_job.",
    kinds={"postgres"},
)

SOURCE_ASSETS = [customers, subscriptions, enrollments, payments]
ASSET_SPECS = [customer_status, review_triggers, outbox_events, subscription_status, payment_status]

business_tables_observation_job = dg.define_asset_job(
    "business_tables_observation_job",
    selection=dg.AssetSelection.assets(*(asset.key for asset in SOURCE_ASSETS)),
    description="Observe the business tables (row counts by status).",
)
