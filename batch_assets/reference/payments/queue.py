"""The payment queue: the `payments` table as one instance of the generic queue.

`PAYMENTS` is its store (`batch_assets.queue.store.QueueStore`): every statement the worker, the CLI,
Dagster and the tests run on the table. The functions here are the payments' own calls over it
(enqueue with COPY, the DLQ, `queue stats`); claims and results go through the store.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from batch_assets import Claim, Outcome, ReplayCount
from batch_assets.reference.payments.seed import copy_payments
from batch_assets.reference.payments.store import PAYMENTS, PAYMENTS_SPEC, QUEUE_NAME

__all__ = [
    "AGING_INTERVAL_S", "MAX_AMOUNT_CENTS", "PAYMENTS", "PAYMENTS_SPEC", "PRIORITY_RANGE", "QUEUE_NAME", "dlq_list",
    "dlq_replay", "dlq_size", "enqueue", "queue_stats", "refuse_payment",
]

MAX_AMOUNT_CENTS = 2**53 - 1
"""The largest amount sent: a JSON number beyond 2^53 - 1 is not exact in many parsers (RFC 8259 §6), so
the limits service could check another amount than the one stored."""
AGING_INTERVAL_S = 60
"""A due payment gains one priority level per this many seconds (fixed by payment_claim_rank, migration 0002)."""
PRIORITY_RANGE = (-32768, 32767)


def refuse_payment(claim: Claim) -> Outcome | None:
    """`invalid_amount`: amount_cents outside 1..MAX_AMOUNT_CENTS (zero, negative, or too large to be exact in
    JSON) is not a payment the limits service can be asked about: FAILED without a call."""
    amount = claim.values["amount_cents"]
    if not 1 <= amount <= MAX_AMOUNT_CENTS:
        return Outcome.permanent("invalid_amount", f"amount_cents {amount} outside 1..{MAX_AMOUNT_CENTS}")
    return None


def enqueue(
    engine: sa.Engine,
    count: int,
    *,
    seed: int | None = None,
    amount_range: tuple[int, int] = (100, 100_000),
    priority: int = 0,
) -> int:
    """Insert `count` NEW payments at `priority`, due now, with COPY (one wake-up notification)."""
    return copy_payments(engine, count, seed=seed, amount_range=amount_range, priority=priority)


def dlq_list(engine: sa.Engine, limit: int = 100, *, after_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
    """FAILED payments in id order (at most `limit`, after `after_id`): id, amount_cents, attempts, last_error, …"""
    return PAYMENTS.dlq_list(engine, limit, after_id=after_id)


def dlq_size(engine: sa.Engine) -> int:
    """Number of FAILED payments."""
    return PAYMENTS.dlq_size(engine)


def dlq_replay(engine: sa.Engine, ids: Sequence[uuid.UUID | str] | None) -> ReplayCount:
    """FAILED → NEW (attempts 0, due now) for `ids`, or every FAILED payment when None (`QueueStore.dlq_replay`)."""
    return PAYMENTS.dlq_replay(engine, ids)


def queue_stats(engine: sa.Engine) -> dict[str, Any]:
    """`queue stats` of the payment queue (docs/guide/payment-queue.md; `QueueStore.stats`)."""
    return PAYMENTS.stats(engine)
