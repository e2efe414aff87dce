"""Every table, declared once (the migrations create them; a test compares the two)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import BYTEA, JSONB, UUID

metadata = sa.MetaData()

TZ = sa.DateTime(timezone=True)

customers = sa.Table(
    "customers",
    metadata,
    sa.Column("id", UUID(as_uuid=True), primary_key=True),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("encrypted_dob", BYTEA, nullable=True),
    sa.Column("age_category", sa.Text, nullable=True),
    sa.Column("next_review_date", sa.Date, nullable=True),
    sa.Column("updated_at", TZ, nullable=True),
    sa.Column("review_failure", sa.Text, nullable=True),
    sa.Index("customers_due_idx", sa.text("(coalesce(next_review_date, '-infinity'::date))"), "id"),
)

review_triggers = sa.Table(
    "review_triggers",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("customer_id", UUID(as_uuid=True), nullable=False),
    sa.Column("from_category", sa.Text, nullable=False),
    sa.Column("to_category", sa.Text, nullable=False),
    sa.Column("effective_date", sa.Date, nullable=False),
    sa.Column("created_at", TZ, nullable=False),
    sa.Index("review_triggers_natural_key", "customer_id", "to_category", "effective_date", unique=True),
)

outbox_events = sa.Table(
    "outbox_events",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("aggregate_id", UUID(as_uuid=True), nullable=False),
    sa.Column("event_type", sa.Text, nullable=False),
    sa.Column("payload", JSONB, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("created_at", TZ, nullable=False),
    sa.Column("sent_at", TZ, nullable=True),
    sa.Column("claimed_by", sa.Text, nullable=True),
    sa.Column("claimed_until", TZ, nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Index("outbox_events_pending_idx", "id"),
)

subscriptions = sa.Table(
    "subscriptions",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("customer_id", UUID(as_uuid=True), nullable=True),
    sa.Column("expiry_date", sa.Date, nullable=True),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("retry_count", sa.Integer, nullable=False),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Index("subscriptions_expiring_idx", "expiry_date", "id"),
    sa.Index("subscriptions_failed_idx", "id"),
)

enrollments = sa.Table(
    "enrollments",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("subscription_id", sa.BigInteger, sa.ForeignKey("subscriptions.id"), nullable=False),
    sa.Column("course_id", sa.BigInteger, nullable=True),
    sa.Index("enrollments_subscription_idx", "subscription_id"),
)

payments = sa.Table(
    "payments",
    metadata,
    sa.Column("id", UUID(as_uuid=True), primary_key=True),
    sa.Column("amount_cents", sa.BigInteger, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("next_attempt_at", TZ, nullable=False),
    sa.Column("claimed_until", TZ, nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("created_at", TZ, nullable=False),
    sa.Column("processed_at", TZ, nullable=True),
    sa.Column("claim_token", UUID(as_uuid=True), nullable=True),
    sa.Column("priority", sa.SmallInteger, nullable=False, server_default=sa.text("0")),
    sa.Index("payments_new_due_idx", "next_attempt_at", "created_at"),
    # Claim order with aging (migration 0002): payment_claim_rank(next_attempt_at, priority).
    sa.Index("payments_claim_rank_idx", sa.text("payment_claim_rank(next_attempt_at, priority)")),
    sa.Index("payments_processing_idx", "claimed_until"),
    sa.Index("payments_failed_idx", "id"),
)

queue_state = sa.Table(
    "ba_queue_state",
    metadata,
    sa.Column("queue", sa.Text, primary_key=True),
    sa.Column("breaker", sa.Text, nullable=False),
    sa.Column("breaker_since", TZ, nullable=False),
    sa.Column("cooldown_s", sa.Double, nullable=True),
    sa.Column("failures_in_row", sa.Integer, nullable=False),
    sa.Column("recorded_by", sa.Text, nullable=True),
    sa.Column("updated_at", TZ, nullable=False),
)

# rate_limit_per_s across all workers (migration 0007): the next free call slot of each queue.
queue_rate = sa.Table(
    "ba_queue_rate",
    metadata,
    sa.Column("queue", sa.Text, primary_key=True),
    sa.Column("next_slot", TZ, nullable=False),
    sa.Column("updated_at", TZ, nullable=False),
)

# max_in_flight across all workers (migration 0007): slot k of a queue, its holder and lease.
queue_slots = sa.Table(
    "ba_queue_slots",
    metadata,
    sa.Column("queue", sa.Text, primary_key=True),
    sa.Column("slot", sa.Integer, primary_key=True),
    sa.Column("holder", UUID(as_uuid=True), nullable=True),
    sa.Column("lease_until", TZ, nullable=True),
)

rules = sa.Table(
    "ba_rules",
    metadata,
    sa.Column("version", sa.BigInteger, primary_key=True),
    sa.Column("rules", JSONB, nullable=False),
    sa.Column("fingerprint", sa.Text, nullable=False),
    sa.Column("created_at", TZ, nullable=False),
)

job_locks = sa.Table(
    "ba_job_locks",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("locked_at", TZ, nullable=False),
    sa.Column("lock_until", TZ, nullable=False),
    sa.Column("min_until", TZ, nullable=False),
)

leases = sa.Table(
    "ba_leases",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("acquired_at", TZ, nullable=False),
    sa.Column("heartbeat_at", TZ, nullable=False),
    sa.Column("expires_at", TZ, nullable=False),
)

checkpoints = sa.Table(
    "ba_checkpoints",
    metadata,
    sa.Column("sweep", sa.Text, primary_key=True),
    sa.Column("mode", sa.Text, primary_key=True),
    sa.Column("range_key", sa.Text, primary_key=True),
    sa.Column("cursor", JSONB, nullable=True),
    sa.Column("rules_fingerprint", sa.Text, nullable=True),
    sa.Column("run_id", sa.Text, nullable=True),
    sa.Column("run_date", sa.Date, nullable=True),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("counters", JSONB, nullable=False),
    sa.Column("updated_at", TZ, nullable=False),
    sa.Column("generation", sa.Text, nullable=True),
)

run_history = sa.Table(
    "ba_run_history",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("job", sa.Text, nullable=False),
    sa.Column("mode", sa.Text, nullable=True),
    sa.Column("run_date", sa.Date, nullable=True),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("started_at", TZ, nullable=False),
    sa.Column("finished_at", TZ, nullable=False),
    sa.Column("summary", JSONB, nullable=False),
    sa.Index("ba_run_history_job_idx", "job", "finished_at"),
)

schema_versions = sa.Table(
    "ba_schema_versions",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("applied_at", TZ, nullable=False),
)
