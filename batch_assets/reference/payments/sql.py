"""Named statements of the payment queue. Bound parameters only.

The queue's statements (claims, fenced results, stats, DLQ) belong to the payments' store
(`store.PAYMENTS`, written by `batch_assets.queue.statements` from its spec); the names below are those
texts, for the sensor, the asset checks, the bench and the tests. Only COPY is the payments' own.
"""

from __future__ import annotations

import sqlalchemy as sa

from batch_assets.reference.payments.store import PAYMENTS

CLAIM = PAYMENTS.sql.claim
"""The claim statement (`%(n)s`, `%(lease_s)s`, `%(token)s`), see `Statements.claim`."""
NEXT_DUE_IN = PAYMENTS.sql.next_due_in
"""Seconds until the earliest payment is due (<= 0: due now; NULL: nothing queued)."""
DUE_CHANNEL = PAYMENTS.sql.channel
"""The channel the payments_notify_due triggers notify (migrations 0002 and 0006)."""
LISTEN_DUE = PAYMENTS.sql.listen

# STUCK_PAYMENTS_SQL — PROCESSING payments past their claim lease or without one, and the oldest lease (asset check).
STUCK_PAYMENTS_SQL = sa.text(PAYMENTS.sql.stuck)


# COPY_PAYMENTS — bulk insert of new payments (psycopg COPY); other columns take their defaults.
COPY_PAYMENTS = "COPY payments (id, amount_cents, priority) FROM STDIN"
