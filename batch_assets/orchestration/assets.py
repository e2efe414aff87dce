"""Assets and lineage.

The business tables (written by other services) are observable source assets.
`customer_status`, `review_triggers` and `outbox_events` are materializable: one
graph-backed multi-asset over the sweep's own graph (plan_sweep → sweep_range per
cursor range → summarise_sweep → report_customer_status), so "Materialize" in the UI
runs the same sweep as the CLI's job, with mode and run date in the launchpad config
(`ops.customer_status_sweep.ops.plan_sweep.config`). The nightly jobs' outputs
(subscription_status, payment_status) stay external specs their ops report at runtime.
The UI shows the lineage

    customers ─▶ customer_status ─▶ review_triggers
                                └─▶ outbox_events
    subscriptions, enrollments ─▶ subscription_status
    payments ─▶ payment_status
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import dagster as dg
import sqlalchemy as sa

from batch_assets.orchestration.metadata import counts_table, records_table, run_numbers
from batch_assets.orchestration.ops.sweep import plan_sweep, summarise_sweep, sweep_range
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

CATEGORY_COUNTS = sa.text(
    "SELECT coalesce(age_category, '(not computed)') AS category, count(*) AS n "
    "FROM customers WHERE status = 'ACTIVE' GROUP BY 1 ORDER BY 1"
)
RANGE_COLUMNS = ("range", "scanned", "changed", "failed", "pages", "duration_s", "resumed_from")


@dg.op(
    out={
        "customer_status": dg.Out(dg.Nothing, is_required=False),
        "review_triggers": dg.Out(dg.Nothing, is_required=False),
        "outbox_events": dg.Out(dg.Nothing, is_required=False),
    },
    ins={"customers": dg.In(dg.Nothing)},
    tags={"kind": "sweep"},
)
def report_customer_status(
    context: dg.OpExecutionContext, summary: dict, ranges: list, database: DatabaseResource
):
    """Report the sweep's three assets with numeric metadata (charted in Plots); nothing for a SKIPPED run.

    In the asset job these are the multi-asset's outputs (materializations of those assets); in the op
    jobs the CLI launches, the same metadata is logged as AssetMaterialization events.
    """
    if not summary:  # plan_sweep was skipped (another run held the lock): nothing was materialized
        context.log.info("the sweep was skipped: no materialization")
        return
    engine = database.get_engine()
    counts, categories = counts_table(engine, CATEGORY_COUNTS, label="age_category")
    run_date, mode = str(summary.get("run_date")), str(summary.get("mode"))
    common = {"run_date": run_date, "mode": mode, **run_numbers(summary)}
    reports = {
        "customer_status": (f"{mode} sweep for {run_date}", {
            **common,
            "pages": int(summary.get("pages") or 0),
            "decrypted": int(summary.get("decrypted") or 0),
            "ranges": int(summary.get("ranges") or 0),
            "active_customers": sum(counts.values()),
            "failed_by_type": records_table(
                [{"kind": k, "rows": int(v)} for k, v in sorted((summary.get("failed_by_type") or {}).items())],
                ("kind", "rows"),
            ),
            "counts_by_category": categories,
            "cursor_ranges": records_table(ranges, RANGE_COLUMNS),
        }),
        "review_triggers": (f"review triggers written by the {mode} sweep for {run_date}",
                            {**common, "triggers": int(summary.get("triggers") or 0)}),
        "outbox_events": (f"age_category_changed events written by the {mode} sweep for {run_date}",
                          {**common, "events": int(summary.get("audit_events") or 0)}),
    }
    for key, (description, metadata) in reports.items():
        if context.has_assets_def:
            yield dg.Output(None, key, metadata=metadata)
        else:
            context.log_event(dg.AssetMaterialization(
                asset_key=key, description=description, metadata=metadata, tags={"mode": mode, "run_date": run_date}
            ))


@dg.graph_multi_asset(
    outs={
        "customer_status": dg.AssetOut(
            group_name=CUSTOMER_STATUS,
            description="age_category and next_review_date of ACTIVE customers (the customer-status sweep).",
            kinds={"postgres"},
            is_required=False,
        ),
        "review_triggers": dg.AssetOut(
            group_name=CUSTOMER_STATUS,
            description="One review trigger per category change (unique per customer, category and effective date).",
            kinds={"postgres"},
            is_required=False,
        ),
        "outbox_events": dg.AssetOut(
            group_name=CUSTOMER_STATUS,
            description="age_category_changed events, one per changed customer; relayed by outbox_relay_job.",
            kinds={"postgres"},
            is_required=False,
        ),
    },
    ins={"customers": dg.AssetIn(dagster_type=dg.Nothing)},
    can_subset=False,
)
def customer_status_sweep(customers):  # noqa: ANN001, ANN201 - a graph body: Dagster wires the nodes
    """The customer-status sweep: plan cursor ranges, sweep each (mapped), summarise, report."""
    ranges = plan_sweep().map(sweep_range).collect()
    return report_customer_status(summarise_sweep(ranges), ranges, customers=customers)
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
ASSET_SPECS = [subscription_status, payment_status]
SWEEP_ASSETS = [customer_status_sweep]
SWEEP_ASSET_KEYS = [dg.AssetKey("customer_status"), dg.AssetKey("review_triggers"), dg.AssetKey("outbox_events")]

business_tables_observation_job = dg.define_asset_job(
    "business_tables_observation_job",
    selection=dg.AssetSelection.assets(*(asset.key for asset in SOURCE_ASSETS)),
    description="Observe the business tables (row counts by status).",
)
