"""The payment queue's store: the `payments` table (docs/reference/tables.md, docs/guide/payment-queue.md) declared
as a generic queue."""

from __future__ import annotations

from batch_assets import QueueSpec, QueueStore

QUEUE_NAME = "payments"

PAYMENTS_SPEC = QueueSpec(
    name=QUEUE_NAME, table="payments", key="id", columns=("id", "amount_cents"), priority="priority",
    key_type="uuid",
    # The names migrations 0001, 0002 and 0006 gave the payments' indexes, trigger and channel.
    prefix="payments", channel="batch_assets_payments_due", rank_function="payment_claim_rank",
    timestamps=("created_at",),
)
PAYMENTS = QueueStore(PAYMENTS_SPEC)
"""Every statement on `payments`: the worker's, the CLI's, Dagster's and the tests'."""
