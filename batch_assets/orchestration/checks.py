"""Asset checks.

The checks of customer_status, review_triggers and outbox_events run inside every run that
materializes them (the sweep's asset job): each asset page shows current results. Every check
is also in `asset_checks_job`, started after the op jobs (CLI sweep, expiry, drain, relay).
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

from datetime import date

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from batch_assets.orchestration.resources import DatabaseResource

# The latest successful delta sweep: its run date and how many rows it could not evaluate.
LAST_DELTA_SQL = sa.text(
    """
    SELECT run_date, coalesce((summary->>'failed')::bigint, 0) AS failed
      FROM ba_run_history
     WHERE job LIKE 'customer_status%' AND mode = 'delta' AND status = 'SUCCESS'
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
    from batch_assets.outbox.relay import backlog

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


ASSET_CHECKS = [
    no_overdue_active_customers,
    review_triggers_unique,
    no_payment_stuck_in_processing,
    failed_subscriptions,
    dead_letter_queue_size,
    outbox_backlog,
]
SWEEP_CHECKS = [no_overdue_active_customers, review_triggers_unique, outbox_backlog]
"""The checks of the sweep's assets: selected with them, so they run in the runs that materialize them."""

asset_checks_job = dg.define_asset_job(
    "asset_checks_job",
    selection=dg.AssetSelection.checks(*ASSET_CHECKS),
    description="Evaluate every asset check (started after each successful CLI sweep, expiry, drain and relay).",
)
