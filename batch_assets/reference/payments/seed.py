"""Bulk-insert payments with COPY (`seed payments`, `queue enqueue`), deterministic under a seed."""

from __future__ import annotations

import random
import uuid

import sqlalchemy as sa

from batch_assets import ConfigError, driver_connection
from batch_assets.reference.payments import sql

ANALYZE_AFTER_ROWS = 1_000
"""A COPY of at least this many payments is followed by ANALYZE payments: without it the planner takes a burst of due
payments for a handful and each claim reads and sorts all of them (130 ms a claim at 100k due, against 1 ms).
Skipped by the server with a warning when the role does not own the table."""


def seed_payments(engine: sa.Engine, rows: int, *, seed: int | None = None) -> int:
    """Insert `rows` NEW payments due now via COPY; the same seed yields the same ids and amounts."""
    return copy_payments(engine, rows, seed=seed)


def copy_payments(
    engine: sa.Engine,
    count: int,
    *,
    seed: int | None = None,
    amount_range: tuple[int, int] = (100, 100_000),
    priority: int = 0,
) -> int:
    """COPY `count` payments (id, amount_cents, priority) in one transaction; returns the number inserted.

    One COPY is one statement, so the wake-up trigger sends one notification for all of them.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigError(f"must be a whole number >= 0, got {count!r}", field="count")
    lo, hi = (int(v) for v in amount_range)
    if lo < 0 or hi < lo:
        raise ConfigError(f"must be 0 <= low <= high, got {amount_range!r}", field="amount_range")
    if isinstance(priority, bool) or not isinstance(priority, int) or not -32768 <= priority <= 32767:
        raise ConfigError(f"must be a whole number in -32768..32767, got {priority!r}", field="priority")
    if count == 0:
        return 0
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    raw = engine.raw_connection()
    try:
        with driver_connection(raw).cursor() as cur, cur.copy(sql.COPY_PAYMENTS) as copy:
            for _ in range(count):
                copy.write_row((uuid.UUID(int=rng.getrandbits(128), version=4), rng.randint(lo, hi), priority))
        raw.commit()
        if count >= ANALYZE_AFTER_ROWS:
            # Fresh statistics, so the claims that follow plan on what is due (batch_assets.queue.connection).
            with driver_connection(raw).cursor() as cur:
                cur.execute("ANALYZE payments")
            raw.commit()
    except BaseException:
        raw.rollback()
        raise
    finally:
        raw.close()
    return count
