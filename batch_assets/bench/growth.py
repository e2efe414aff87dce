"""What a sweep leaves in the tables it writes: tuples written, HOT or not, dead tuples, sizes.

Each measured sweep is bracketed by two reads of `pg_stat_user_tables` for `customers` and
`outbox_events`; the difference is what that sweep wrote. The dead tuples it left are read right after
the sweep, before the bench's VACUUM between scenarios, also as a difference (a VACUUM's own count may reach
the statistics before the flush of the UPDATE that preceded it). Together with the relation sizes at each table
size they show what grows with the table: one dead tuple per row an UPDATE rewrote (MVCC), index
entries of non-HOT updates, the outbox's inserts. A steady state that rewrote unchanged rows would
show here as updated > 0.

The WAL the server wrote meanwhile (`pg_stat_wal`: bytes, full-page images) is read once the tables'
counters settled, as a difference too. It is server-wide, so it counts other databases' writes as well, but
during a bench sweep that is mostly the sweep's: a full-page image is written the first time a page changes
after each checkpoint, which is what makes a write cost more once the tables far exceed what one checkpoint
interval touches.

The statistics reach `pg_stat_user_tables` when a backend flushes them (at the latest when it goes
idle or closes): the bench closes the sweep's pooled connections, then reads until two reads a
short while apart agree, within a deadline.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

TABLES = ("customers", "outbox_events")
SETTLE_S = 0.5
DEADLINE_S = 15.0
MIB = 1024 * 1024

# TABLE_STATS — the cumulative write counters and dead tuples of the tables the sweep writes.
# No parameters; the names are the constants of TABLES.
TABLE_STATS = sa.text(
    """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_dead_tup,
       pg_relation_size(relid) AS heap_bytes, pg_indexes_size(relid) AS index_bytes
  FROM pg_stat_user_tables
 WHERE relname IN ('customers', 'outbox_events')
"""
)

# INDEX_SIZES — every index of customers, by name, in bytes. No parameters.
INDEX_SIZES = sa.text(
    """
SELECT indexrelid::regclass::text AS name, pg_relation_size(indexrelid) AS bytes
  FROM pg_index WHERE indrelid = 'customers'::regclass ORDER BY 1
"""
)


# WAL_STATS — the server's WAL written since its statistics reset (PostgreSQL 14+). No parameters.
WAL_STATS = sa.text("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal")


def _wal(engine: sa.Engine) -> dict[str, int]:
    """The server's WAL counters; empty where the server has no pg_stat_wal (before PostgreSQL 14)."""
    try:
        with engine.connect() as conn:
            row = conn.execute(WAL_STATS).one()
    except sa.exc.ProgrammingError:
        return {}
    return {k: int(v) for k, v in row._mapping.items()}


def _read(engine: sa.Engine) -> dict[str, dict[str, int]]:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        return {r.relname: {k: int(v) for k, v in r._mapping.items() if k != "relname"}
                for r in conn.execute(TABLE_STATS)}


def snapshot(engine: sa.Engine) -> dict[str, dict[str, int]]:
    """The counters once every backend flushed: the pool is closed, then read until two reads agree; then the
    server's WAL counters (never settled: other databases write too)."""
    engine.dispose()
    deadline = time.monotonic() + DEADLINE_S
    last = _read(engine)
    while time.monotonic() < deadline:
        time.sleep(SETTLE_S)  # a poll with a deadline: the statistics have no event to wait for
        now = _read(engine)
        if now == last:
            break
        last = now
    return {**last, "wal": _wal(engine)}


def written(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]],
            engine: sa.Engine) -> dict[str, Any]:
    """What one sweep wrote (after - before) and what the tables hold after it, for the report."""
    out: dict[str, Any] = {}
    for table in TABLES:
        b, a = before.get(table, {}), after.get(table, {})
        updated = a.get("n_tup_upd", 0) - b.get("n_tup_upd", 0)
        hot = a.get("n_tup_hot_upd", 0) - b.get("n_tup_hot_upd", 0)
        out[table] = {
            "inserted": a.get("n_tup_ins", 0) - b.get("n_tup_ins", 0),
            "updated": updated,
            "hot_updated": hot,
            "dead_tuples": a.get("n_dead_tup", 0) - b.get("n_dead_tup", 0),
            "heap_mib": round(a.get("heap_bytes", 0) / MIB, 1),
            "index_mib": round(a.get("index_bytes", 0) / MIB, 1),
        }
    wal_before, wal_after = before.get("wal") or {}, after.get("wal") or {}
    if wal_before and wal_after:
        out["wal"] = {"server_wide": True, "records": wal_after["wal_records"] - wal_before["wal_records"],
                      "full_page_images": wal_after["wal_fpi"] - wal_before["wal_fpi"],
                      "mib": round((wal_after["wal_bytes"] - wal_before["wal_bytes"]) / MIB, 1)}
    with engine.connect() as conn:
        out["customers"]["indexes_mib"] = {r.name: round(int(r.bytes) / MIB, 1) for r in conn.execute(INDEX_SIZES)}
    return out
