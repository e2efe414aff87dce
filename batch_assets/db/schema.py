"""The library's own tables, declared once: the library's migration set creates them (a test compares the two).

Every name starts with `ba_`, so they live beside a team's own tables. A project that brings tables of its own
declares them beside its migrations (this repository's reference project: batch_assets/reference/schema.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, UUID

metadata = sa.MetaData()

TZ = sa.DateTime(timezone=True)

# The ledger of `db migrate`: one row per file applied, per migration set.
migrations = sa.Table(
    "ba_migrations",
    metadata,
    sa.Column("migration_set", sa.Text, primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("applied_at", TZ, nullable=False),
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

# rate_limit_per_s across all workers: the next free call slot of each queue.
queue_rate = sa.Table(
    "ba_queue_rate",
    metadata,
    sa.Column("queue", sa.Text, primary_key=True),
    sa.Column("next_slot", TZ, nullable=False),
    sa.Column("updated_at", TZ, nullable=False),
)

# max_in_flight across all workers: slot k of a queue, its holder and lease.
queue_slots = sa.Table(
    "ba_queue_slots",
    metadata,
    sa.Column("queue", sa.Text, primary_key=True),
    sa.Column("slot", sa.Integer, primary_key=True),
    sa.Column("holder", UUID(as_uuid=True), nullable=True),
    sa.Column("lease_until", TZ, nullable=True),
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

# The outbox of declared sweeps in a project without an outbox of its own (the shape of outbox_events).
outbox_events = sa.Table(
    "ba_outbox_events",
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
    sa.Index("ba_outbox_events_pending_idx", "id"),
)
