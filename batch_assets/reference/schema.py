"""The reference project's tables, declared once: its migration set (reference/migrations) creates them, and a
test compares the two."""

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
    # Claim order with aging: payment_claim_rank(next_attempt_at, priority).
    sa.Index("payments_claim_rank_idx", sa.text("payment_claim_rank(next_attempt_at, priority)")),
    sa.Index("payments_processing_idx", "claimed_until"),
    sa.Index("payments_failed_idx", "id"),
)

rules = sa.Table(
    "ba_rules",
    metadata,
    sa.Column("version", sa.BigInteger, primary_key=True),
    sa.Column("rules", JSONB, nullable=False),
    sa.Column("fingerprint", sa.Text, nullable=False),
    sa.Column("created_at", TZ, nullable=False),
)
