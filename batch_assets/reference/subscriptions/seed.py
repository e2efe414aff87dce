"""Bulk-insert subscriptions and their enrollments with COPY, deterministic under a seed.

Ids are set explicitly (a contiguous block above both the current maximum and the
sequence, taken under an EXCLUSIVE table lock so concurrent inserts wait) and the
bigserial sequences are moved past the block before commit, so later inserts by other
services that rely on the sequence never collide with seeded rows.

Failing rows for demos (`failing_fraction`): the realistic per-record failure is a
business rule in the database that refuses to drop an enrollment. The seed installs such
a rule as a trigger (`ba_demo_enrollment_guard`: enrollments of the course under audit,
course_id = AUDIT_COURSE_ID, cannot be deleted) and gives a fraction of the expired
subscriptions one such enrollment; their expiry then fails and is marked FAILED. The
trigger is installed only when failing_fraction > 0 (never by migrations).
"""

from __future__ import annotations

import math
import random
import uuid
from datetime import date, timedelta
from typing import Any

import sqlalchemy as sa

from batch_assets import ConfigError, driver_connection

AUDIT_COURSE_ID = -1
"""course_id whose enrollments the demo guard trigger refuses to delete."""

# Static DDL of the demo guard (no parameters); idempotent.
DEMO_GUARD_DDL = (
    """
CREATE OR REPLACE FUNCTION ba_demo_enrollment_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'enrollment % is in a course under audit and cannot be deleted', OLD.id
        USING ERRCODE = 'P0001';
END;
$$
""",
    "DROP TRIGGER IF EXISTS ba_demo_enrollment_guard ON enrollments",
    """
CREATE TRIGGER ba_demo_enrollment_guard
    BEFORE DELETE ON enrollments
    FOR EACH ROW WHEN (OLD.course_id = -1) EXECUTE FUNCTION ba_demo_enrollment_guard()
""",
)

# Next free id of a bigserial table: above both max(id) and its sequence's last value.
_NEXT_ID_SQL = {
    "subscriptions": """
SELECT greatest((SELECT coalesce(max(id), 0) FROM subscriptions),
                coalesce(pg_sequence_last_value(pg_get_serial_sequence('subscriptions', 'id')::regclass), 0)) + 1
""",
    "enrollments": """
SELECT greatest((SELECT coalesce(max(id), 0) FROM enrollments),
                coalesce(pg_sequence_last_value(pg_get_serial_sequence('enrollments', 'id')::regclass), 0)) + 1
""",
}
# %(table)s is bound as a value (the sequence is looked up by the server), %(last)s the new last value.
_SETVAL_SQL = "SELECT setval(pg_get_serial_sequence(%(table)s, 'id'), %(last)s)"
_CHUNK = 5000


def _check_arguments(rows: int, expired_fraction: float, failing_fraction: float, enrollments_per: int) -> None:
    """ConfigError naming the first invalid argument."""
    for name, count in (("rows", rows), ("enrollments_per", enrollments_per)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"must be a whole number >= 0, got {count!r}", field=name)
    for name, value in (("expired_fraction", expired_fraction), ("failing_fraction", failing_fraction)):
        if not (0.0 <= value <= 1.0):
            raise ConfigError(f"must be within [0, 1], got {value!r}", field=name)


def seed_subscriptions(
    engine: sa.Engine,
    rows: int,
    *,
    seed: int | None = None,
    expired_fraction: float = 0.3,
    enrollments_per: int = 2,
    run_date: date | None = None,
    failing_fraction: float = 0.0,
) -> int:
    """Insert `rows` ACTIVE subscriptions (a fraction already past `run_date`) with enrollments; returns rows.

    Exactly round(rows * expired_fraction) rows have expiry_date < run_date, spread evenly;
    a `failing_fraction` of those get an enrollment whose deletion the demo guard refuses.
    """
    _check_arguments(rows, expired_fraction, failing_fraction, enrollments_per)
    if rows == 0:
        return 0
    run_date = run_date or date.today()
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    raw = engine.raw_connection()
    try:
        pg = driver_connection(raw)
        with pg.cursor() as cur:
            if failing_fraction > 0:
                for ddl in DEMO_GUARD_DDL:
                    cur.execute(ddl)
            cur.execute("LOCK TABLE subscriptions, enrollments IN EXCLUSIVE MODE")
            first: dict[str, int] = {}
            for table, statement in _NEXT_ID_SQL.items():
                cur.execute(statement)
                row = cur.fetchone()
                if row is None:  # nextval always returns a row
                    raise RuntimeError(f"no next id for {table}")
                first[table] = int(row[0])
            sub_id, enr_id = first["subscriptions"], first["enrollments"]
            expired_seen = 0
            # One chunk at a time: COPY its subscriptions, then its enrollments (one COPY per
            # statement on a connection), so memory is bounded by the chunk size.
            for chunk_start in range(0, rows, _CHUNK):
                subs: list[tuple[object, ...]] = []
                enrollments: list[tuple[int, int, int]] = []
                for i in range(chunk_start, min(rows, chunk_start + _CHUNK)):
                    expired = _picked(i, expired_fraction)
                    failing = False
                    if expired:
                        expiry = run_date - timedelta(days=rng.randint(1, 365))
                        failing = _picked(expired_seen, failing_fraction)
                        expired_seen += 1
                    else:
                        expiry = run_date + timedelta(days=rng.randint(0, 365))
                    subs.append((sub_id + i, uuid.UUID(int=rng.getrandbits(128), version=4), expiry, "ACTIVE", 0))
                    courses = [rng.randint(1, 5000) for _ in range(enrollments_per)]
                    if failing:
                        courses = [AUDIT_COURSE_ID, *courses[1:]]
                    for course in courses:
                        enrollments.append((enr_id, sub_id + i, course))
                        enr_id += 1
                _copy(cur, "COPY subscriptions (id, customer_id, expiry_date, status, retry_count) FROM STDIN", subs)
                _copy(cur, "COPY enrollments (id, subscription_id, course_id) FROM STDIN", enrollments)
            cur.execute(_SETVAL_SQL, {"table": "subscriptions", "last": sub_id + rows - 1})
            if enr_id > first["enrollments"]:
                cur.execute(_SETVAL_SQL, {"table": "enrollments", "last": enr_id - 1})
        raw.commit()
    except BaseException:
        raw.rollback()
        raise
    finally:
        raw.close()
    return rows


def _copy(cur: Any, statement: str, rows: list[Any]) -> None:
    if not rows:
        return
    with cur.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)


def _picked(i: int, fraction: float) -> bool:
    """Whether item i is one of round(n * fraction) items spread evenly over 0..n-1 (no state, no memory)."""
    return math.floor((i + 1) * fraction + 0.5) > math.floor(i * fraction + 0.5)
