"""The bench's dedicated database and the table states the scenarios start from.

Every measurement runs on a scratch database created next to the configured
one (the embedded server when no URL is set) and dropped at the end, so the
bench never touches real data.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

SCRATCH_PREFIX = "ba_bench_"
BOOKKEEPING_TABLES = ("ba_checkpoints", "ba_leases", "ba_job_locks", "ba_rules", "ba_run_history")
WRITTEN_TABLES = ("customers", "outbox_events", "review_triggers")


def scratch_name() -> str:
    """A fresh scratch database name: a fixed prefix, this process's id and hex digits, never input (the id tells
    the scratch databases of one bench run from another's on the same server: `scratch_prefix_of`)."""
    return f"{scratch_prefix_of(os.getpid())}{uuid.uuid4().hex[:8]}"


def scratch_prefix_of(pid: int) -> str:
    """The prefix of every scratch database the bench running as process `pid` creates."""
    return f"{SCRATCH_PREFIX}p{pid}_"


@contextmanager
def scratch_database(base_url: str, name: str) -> Iterator[str]:
    """Create database `name` next to `base_url`'s, yield its URL, drop it (WITH FORCE) afterwards."""
    admin = sa.create_engine(
        make_url(base_url).set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
    )
    # `name` comes from scratch_name(): a fixed prefix and hex digits.
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(base_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


class StatementCounter:
    """Counts statements sent through an engine (DBAPI cursor executions).

    Statements on the bookkeeping tables (checkpoint saves, heartbeats) are
    counted apart from the page's own reads and writes; the lease fence inside
    the page transaction (in the timeouts preamble) counts as a page statement.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self.page = 0
        self.preambles = 0
        self.bookkeeping = 0
        sa.event.listen(engine, "before_cursor_execute", self._on)

    def _on(self, _conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if "set_config('statement_timeout'" in statement:
            self.page += 1  # a write transaction's preamble (timeouts, and the lease fence when guarded)
            self.preambles += 1
        elif "enable_bitmapscan" in statement or any(t in statement for t in BOOKKEEPING_TABLES):
            self.bookkeeping += 1  # per-run reader plan pin, checkpoints, heartbeats, lock, lease
        else:
            self.page += 1

    def take(self) -> tuple[int, int, int]:
        """(page statements, of which transaction preambles, bookkeeping statements) since the last take."""
        taken = (self.page, self.preambles, self.bookkeeping)
        self.page = self.preambles = self.bookkeeping = 0
        return taken


def vacuum(engine: sa.Engine) -> None:
    """VACUUM ANALYZE the swept tables, so every scenario starts from fresh statistics and no dead rows."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE customers")
        conn.exec_driver_sql("VACUUM ANALYZE outbox_events")
        conn.exec_driver_sql("VACUUM ANALYZE review_triggers")


def reset_to_first_computation(engine: sa.Engine) -> None:
    """Every row back to "never computed" (NULL category and date), no events, no checkpoints: the table as the
    seeding left it, so every first computation starts from the same table.

    The UPDATE writes a new version of every row, and VACUUM only makes the old ones' space reusable: the heap and
    `customers_due_idx` kept growing with each reset (at 10M: heap 1.1 → 2.1 GB, the index 1.0 → 1.6 GB), which
    only the bench's resets do to a table, and which made every scenario after the first read a table half made
    of free space (the 4-worker figures, the declared form's after the plug-in's). So a reset that rewrote rows
    also rewrites the table compactly (VACUUM FULL: heap and indexes rebuilt, rows in the same physical order)."""
    with engine.begin() as conn:
        rewritten = conn.exec_driver_sql(
            "UPDATE customers SET age_category = NULL, next_review_date = NULL, review_failure = NULL "
            "WHERE age_category IS NOT NULL OR next_review_date IS NOT NULL OR review_failure IS NOT NULL"
        ).rowcount
        conn.exec_driver_sql("TRUNCATE review_triggers, outbox_events, ba_checkpoints")
    if rewritten:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM FULL customers")
    vacuum(engine)


# MAKE_DUE — make :n settled rows due on :d with a real transition (a stale stored category).
# Parameters: d date (the run date), n int (how many rows).
MAKE_DUE = sa.text(
    """
    UPDATE customers SET next_review_date = :d,
           age_category = CASE WHEN age_category = 'MINOR' THEN 'ADULT' ELSE 'MINOR' END
     WHERE id IN (SELECT id FROM customers WHERE status = 'ACTIVE' AND next_review_date > :d
                  ORDER BY id LIMIT :n)
    """
)


def make_due(engine: sa.Engine, run_date: date, count: int) -> None:
    """Make `count` settled rows due on the run date, each with a real category transition."""
    with engine.begin() as conn:
        conn.execute(MAKE_DUE, {"d": run_date, "n": count})
    vacuum(engine)


# CURRENT_XID — the id the next transaction will get; rows written after this point have an xmin
# at or above it. No parameters.
CURRENT_XID = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text"

# ROWS_WRITTEN_SINCE — rows of one table inserted or updated since a CURRENT_XID mark (their
# xmin is the mark or newer: an age no larger than the mark's). Counts every write whatever the
# columns it sets.
# Parameters: mark text (an xid8 from CURRENT_XID). The table name comes from WRITTEN_TABLES.
ROWS_WRITTEN_SINCE = "SELECT count(*) FROM {table} WHERE age(xmin) <= age(CAST(%(mark)s AS xid))"


def write_mark(engine: sa.Engine) -> str:
    """A point in the transaction history; `rows_written_since` counts what was written after it."""
    with engine.connect() as conn:
        return str(conn.exec_driver_sql(CURRENT_XID).scalar_one())


def rows_written_since(engine: sa.Engine, mark: str) -> dict[str, int]:
    """Rows inserted or updated since `mark` in each business table a sweep writes, read from the rows' xmin."""
    # xid8 → xid keeps the low 32 bits, which is what xmin holds; age() compares them wrap-safely.
    mark32 = str(int(mark) % 2**32)
    counts: dict[str, int] = {}
    with engine.connect() as conn:
        for table in WRITTEN_TABLES:  # constants, never input
            sql = ROWS_WRITTEN_SINCE.format(table=table)
            counts[table] = int(conn.exec_driver_sql(sql, {"mark": mark32}).scalar_one())
    return counts
