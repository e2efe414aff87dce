"""Asset checks, run by `asset_checks_job` (after each successful sweep, expiry or drain, and from the UI)."""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

from datetime import date

import dagster as dg
import sqlalchemy as sa

from batch_assets.orchestration.resources import DatabaseResource

# The latest successful delta sweep: its run date and how many rows it could not evaluate.
LAST_DELTA_SQL = sa.text(
    """
    SELECT run_date, coalesce((summary->>'failed')::bigint, 0) AS failed
      FROM ba_run_history
     WHERE job LIKE 'customer_status_sweep%' AND mode = 'delta' AND status = 'SUCCESS'
     ORDER BY finished_at DESC
     LIMIT 1
    """
)
# :run_date — ACTIVE customers still due on or before it (index customers_due_idx).
OVERDUE_SQL = sa.text(
    """
    SELECT count(*) FROM customers
     WHERE status = 'ACTIVE'
       AND coalesce(next_review_date, '-infinity'::date) <= :run_date
       AND next_review_date IS NOT NULL
    """
)
DUPLICATE_TRIGGERS_SQL = sa.text(
    """
    SELECT count(*) FROM (
        SELECT 1 FROM review_triggers
         GROUP BY customer_id, to_category, effective_date
        HAVING count(*) > 1
    ) d
    """
)
STUCK_PAYMENTS_SQL = sa.text(
    "SELECT count(*), min(claimed_until)::text FROM payments WHERE status = 'PROCESSING' AND claimed_until < now()"
)
FAILED_SUBSCRIPTIONS_SQL = sa.text(
    "SELECT count(*), coalesce(max(retry_count), 0) FROM subscriptions WHERE status = 'FAILED'"
)
DLQ_SQL = sa.text("SELECT count(*) FROM payments WHERE status = 'FAILED'")


@dg.asset_check(
    asset="customer_status",
    description="After the last successful delta, no ACTIVE customer is still due on or before its run date "
    "(rows the run could not evaluate are allowed, up to its failed count).",
)
def no_overdue_active_customers(database: DatabaseResource) -> dg.AssetCheckResult:
    with database.get_engine().connect() as conn:
        last = conn.execute(LAST_DELTA_SQL).first()
        if last is None:
            return dg.AssetCheckResult(passed=True, metadata={"last_delta_run_date": "none yet"})
        run_date: date = last.run_date
        overdue = int(conn.execute(OVERDUE_SQL, {"run_date": run_date}).scalar_one())
    return dg.AssetCheckResult(
        passed=overdue <= int(last.failed),
        metadata={"last_delta_run_date": str(run_date), "overdue": overdue, "failed_in_run": int(last.failed)},
    )


@dg.asset_check(asset="review_triggers", description="Review triggers are unique per customer, category and date.")
def review_triggers_unique(database: DatabaseResource) -> dg.AssetCheckResult:
    with database.get_engine().connect() as conn:
        duplicates = int(conn.execute(DUPLICATE_TRIGGERS_SQL).scalar_one())
    return dg.AssetCheckResult(passed=duplicates == 0, metadata={"duplicate_keys": duplicates})


@dg.asset_check(asset="payment_status", description="No payment is stuck in PROCESSING past its claim lease.")
def no_payment_stuck_in_processing(database: DatabaseResource) -> dg.AssetCheckResult:
    with database.get_engine().connect() as conn:
        stuck, oldest = conn.execute(STUCK_PAYMENTS_SQL).one()
    return dg.AssetCheckResult(
        passed=int(stuck) == 0, metadata={"stuck": int(stuck), "oldest_claimed_until": str(oldest or "")}
    )


@dg.asset_check(
    asset="subscription_status",
    description="Count of FAILED subscriptions; warns when any exist "
    "(retry with `subscriptions expire --retry-failed`).",
)
def failed_subscriptions(database: DatabaseResource) -> dg.AssetCheckResult:
    with database.get_engine().connect() as conn:
        count, max_retries = conn.execute(FAILED_SUBSCRIPTIONS_SQL).one()
    return dg.AssetCheckResult(
        passed=int(count) == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"failed": int(count), "max_retry_count": int(max_retries)},
    )


@dg.asset_check(
    asset="payment_status",
    description="Size of the dead-letter queue (FAILED payments); warns when not empty (`queue dlq replay`).",
)
def dead_letter_queue_size(database: DatabaseResource) -> dg.AssetCheckResult:
    with database.get_engine().connect() as conn:
        size = int(conn.execute(DLQ_SQL).scalar_one())
    return dg.AssetCheckResult(passed=size == 0, severity=dg.AssetCheckSeverity.WARN, metadata={"dlq_size": size})


ASSET_CHECKS = [
    no_overdue_active_customers,
    review_triggers_unique,
    no_payment_stuck_in_processing,
    failed_subscriptions,
    dead_letter_queue_size,
]

asset_checks_job = dg.define_asset_job(
    "asset_checks_job",
    selection=dg.AssetSelection.checks(*ASSET_CHECKS),
    description="Evaluate every asset check (run after each successful sweep, expiry and drain).",
)
