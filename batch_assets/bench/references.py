"""The two references the product is measured against, written from the contract alone.

Neither uses the engine, its SQL or its runner: only the contract's tables
(docs/reference/tables.md), its ciphertext format (the project's `DobCipher`, docs/reference/formats.md) and the
pure rule function (`evaluate`, docs/reference/rules.md). Both talk to PostgreSQL through one plain
psycopg connection.

- The **naive job** of seed 000: OFFSET pages, then one SELECT (load the row)
  and one UPDATE (save it, changed or not) per row, each in its own autocommit
  transaction. It runs on a sample of the table and is scaled to the whole
  table: per-row cost × rows, plus the OFFSET page queries, whose cost grows
  with the offset (sampled across the whole table and fitted to a line), so the
  estimate keeps the job's O(N²) reads.
- The **single-stream floor**: one connection, keyset pages of the narrow
  projection, decrypt and evaluate every row, skip unchanged rows, and write
  each page's changes in one transaction (one bulk UPDATE of category +
  next_review_date, the review triggers, and one bulk INSERT of the outbox
  events). What one straightforward stream achieves, with no pipelining.
"""

from __future__ import annotations

import math
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.rows import TupleRow

from batch_assets.db.engine import driver_connection
from batch_assets.errors import DecryptError
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.rules import Rules, evaluate, parse_dob

PAGE_SIZE = 1000
"""Page size of both references (the product's default page size too)."""

OFFSET_SAMPLES = 5
"""Offsets across the whole table at which the naive job's page query is timed."""


@contextmanager
def plain_connection(url: str, *, autocommit: bool) -> Iterator[psycopg.Connection[TupleRow]]:
    """One psycopg connection to `url`, outside any pool and any SQLAlchemy event."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    raw = engine.raw_connection()
    try:
        conn = driver_connection(raw)
        conn.autocommit = autocommit
        yield conn
    finally:
        raw.close()
        engine.dispose()


# --- the naive job of seed 000 ----------------------------------------------------------------

# NAIVE_PAGE — one OFFSET page of ids (the framework's Page<>). Parameters: offset int, limit int.
NAIVE_PAGE = "SELECT id FROM customers WHERE status = 'ACTIVE' ORDER BY id OFFSET %(offset)s LIMIT %(limit)s"

# NAIVE_LOAD — load one customer, the whole row. Parameters: id uuid.
NAIVE_LOAD = (
    "SELECT id, status, encrypted_dob, age_category, next_review_date, updated_at FROM customers WHERE id = %(id)s"
)

# NAIVE_SAVE — save one customer, whether it changed or not. Parameters: id uuid, category text,
# next_review_date date.
NAIVE_SAVE = (
    "UPDATE customers SET age_category = %(category)s, next_review_date = %(next_review_date)s, "
    "updated_at = now() WHERE id = %(id)s"
)


def run_naive(
    url: str, cipher: DobCipher, run_date: date, rules: Rules, *, sample_rows: int, table_rows: int
) -> dict[str, Any]:
    """Run the naive job over the first `sample_rows` rows and scale it to `table_rows`."""
    processed = failed = 0
    page_s = 0.0
    with plain_connection(url, autocommit=True) as conn:
        started = time.perf_counter()
        offset = 0
        while processed < sample_rows:
            page_started = time.perf_counter()
            ids = [r[0] for r in conn.execute(NAIVE_PAGE, {"offset": offset, "limit": PAGE_SIZE}).fetchall()]
            page_s += time.perf_counter() - page_started
            if not ids:
                break
            for customer_id in ids[: sample_rows - processed]:
                row = conn.execute(NAIVE_LOAD, {"id": customer_id}).fetchone()
                if row is None:
                    continue
                result = _evaluate(cipher, row[0], row[2], run_date, rules)
                if result is None:
                    failed += 1  # the seed's job logs and moves on
                else:
                    conn.execute(NAIVE_SAVE, {"id": row[0], "category": result[0], "next_review_date": result[1]})
                processed += 1
            offset += PAGE_SIZE
        elapsed = time.perf_counter() - started
        offsets = _offset_costs(conn, table_rows)
    per_row_s = (elapsed - page_s) / max(processed, 1)
    intercept_s, slope_s = _fit_line([(o, s) for o, s in offsets])
    pages = math.ceil(table_rows / PAGE_SIZE)
    # Σ over pages k of (a + b·k·P): the OFFSET walk makes the reads quadratic in the table size.
    pages_total_s = pages * intercept_s + slope_s * PAGE_SIZE * pages * (pages - 1) / 2
    estimated_s = table_rows * per_row_s + pages_total_s
    return {
        "sample_rows": processed,
        "sample_failed": failed,
        "sample_s": round(elapsed, 3),
        "sample_rows_per_s": round(processed / elapsed) if elapsed > 0 else None,
        "statements_per_row": 2,
        "per_row_ms": round(per_row_s * 1000, 4),
        "offset_page_ms": [{"offset": o, "ms": round(s * 1000, 3)} for o, s in offsets],
        "table_rows": table_rows,
        "estimated_s": round(estimated_s, 1),
        "estimated_rows_per_s": round(table_rows / estimated_s) if estimated_s > 0 else None,
        "estimated_offset_pages_s": round(pages_total_s, 1),
    }


def _offset_costs(conn: Any, table_rows: int) -> list[tuple[int, float]]:
    """Median time of the naive page query at offsets spread over the whole table."""
    last = max(table_rows - PAGE_SIZE, 0)
    costs = []
    for i in range(OFFSET_SAMPLES):
        offset = round(last * i / (OFFSET_SAMPLES - 1))
        times = []
        for _ in range(3):
            started = time.perf_counter()
            conn.execute(NAIVE_PAGE, {"offset": offset, "limit": PAGE_SIZE}).fetchall()
            times.append(time.perf_counter() - started)
        costs.append((offset, statistics.median(times)))
    return costs


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b·x; the slope is never negative."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var_x = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var_x if var_x else 0.0
    slope = max(slope, 0.0)
    return max(mean_y - slope * mean_x, 0.0), slope


# --- the single-stream floor --------------------------------------------------------------------

# FLOOR_FIRST_PAGE — the first keyset page of the narrow projection. Parameters: limit int.
FLOOR_FIRST_PAGE = (
    "SELECT id, encrypted_dob, age_category, next_review_date FROM customers "
    "WHERE status = 'ACTIVE' ORDER BY id LIMIT %(limit)s"
)

# FLOOR_NEXT_PAGE — the keyset page after the last id read. Parameters: after uuid, limit int.
FLOOR_NEXT_PAGE = (
    "SELECT id, encrypted_dob, age_category, next_review_date FROM customers "
    "WHERE status = 'ACTIVE' AND id > %(after)s ORDER BY id LIMIT %(limit)s"
)

# FLOOR_WRITE_ROWS — a page's changed rows in one statement.
# Parameters: ids uuid[], categories text[], dates date[].
FLOOR_WRITE_ROWS = """
UPDATE customers AS c
   SET age_category = v.category, next_review_date = v.next_review_date, updated_at = now()
  FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(categories)s AS text[]), CAST(%(dates)s AS date[]))
       AS v(id, category, next_review_date)
 WHERE c.id = v.id
"""

# FLOOR_WRITE_TRIGGERS — a page's review triggers (stored category replaced by another).
# Parameters: ids uuid[], from_categories text[], to_categories text[], effective_dates date[].
FLOOR_WRITE_TRIGGERS = """
INSERT INTO review_triggers (customer_id, from_category, to_category, effective_date)
SELECT * FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(from_categories)s AS text[]),
                     CAST(%(to_categories)s AS text[]), CAST(%(effective_dates)s AS date[]))
ON CONFLICT (customer_id, to_category, effective_date) DO NOTHING
"""

# FLOOR_WRITE_EVENTS — a page's age_category_changed events (ids and categories only).
# Parameters: ids uuid[], from_categories text[], to_categories text[].
FLOOR_WRITE_EVENTS = """
INSERT INTO outbox_events (aggregate_id, event_type, payload)
SELECT v.id, 'age_category_changed',
       jsonb_build_object('customer_id', v.id, 'from_category', v.from_category, 'to_category', v.to_category)
  FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(from_categories)s AS text[]), CAST(%(to_categories)s AS text[]))
       AS v(id, from_category, to_category)
"""


def run_floor(url: str, cipher: DobCipher, run_date: date, rules: Rules) -> dict[str, Any]:
    """One pass of the single-stream floor over every ACTIVE row."""
    scanned = changed = failed = events = triggers = pages = 0
    with plain_connection(url, autocommit=True) as conn:
        started = time.perf_counter()
        after: uuid.UUID | None = None
        while True:
            if after is None:
                rows = conn.execute(FLOOR_FIRST_PAGE, {"limit": PAGE_SIZE}).fetchall()
            else:
                rows = conn.execute(FLOOR_NEXT_PAGE, {"after": after, "limit": PAGE_SIZE}).fetchall()
            if not rows:
                break
            pages += 1
            scanned += len(rows)
            write: dict[str, list[Any]] = {"ids": [], "categories": [], "dates": []}
            event: dict[str, list[Any]] = {"ids": [], "from_categories": [], "to_categories": []}
            trigger: dict[str, list[Any]] = {"ids": [], "from_categories": [], "to_categories": [],
                                              "effective_dates": []}
            for customer_id, blob, stored_category, stored_date in rows:
                result = _evaluate(cipher, customer_id, blob, run_date, rules)
                if result is None:
                    failed += 1
                    continue
                category, next_review, since = result
                if category == stored_category and next_review == stored_date:
                    continue  # unchanged: not written at all
                write["ids"].append(customer_id)
                write["categories"].append(category)
                write["dates"].append(next_review)
                if category != stored_category:
                    event["ids"].append(customer_id)
                    event["from_categories"].append(stored_category)
                    event["to_categories"].append(category)
                    if stored_category is not None:
                        trigger["ids"].append(customer_id)
                        trigger["from_categories"].append(stored_category)
                        trigger["to_categories"].append(category)
                        trigger["effective_dates"].append(since)
            if write["ids"]:
                with conn.transaction():
                    conn.execute(FLOOR_WRITE_ROWS, write)
                    if trigger["ids"]:
                        conn.execute(FLOOR_WRITE_TRIGGERS, trigger)
                    if event["ids"]:
                        conn.execute(FLOOR_WRITE_EVENTS, event)
                changed += len(write["ids"])
                events += len(event["ids"])
                triggers += len(trigger["ids"])
            after = rows[-1][0]
            if len(rows) < PAGE_SIZE:
                break
        elapsed = time.perf_counter() - started
    return {
        "scanned": scanned,
        "changed": changed,
        "failed": failed,
        "outbox_events": events,
        "triggers": triggers,
        "pages": pages,
        "sweep_s": round(elapsed, 3),
        "rows_per_s": round(scanned / elapsed) if elapsed > 0 else None,
    }


def _evaluate(
    cipher: DobCipher, customer_id: uuid.UUID, blob: bytes | None, run_date: date, rules: Rules
) -> tuple[str, date, date] | None:
    """(category, next_review_date, category_since), or None when the row cannot be evaluated."""
    if blob is None:
        return None
    try:
        dob = parse_dob(cipher.decrypt_text(customer_id, bytes(blob)))
    except (DecryptError, ValueError):
        return None
    if dob > run_date:
        return None
    result = evaluate(dob, run_date, rules)
    return result.category, result.next_review_date, result.category_since
