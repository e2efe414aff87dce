"""What the catalog says of a team's table that the product relies on: whether a column can be its key.

A declared sweep and a declared queue name each row by its key: in checkpoints and cursor ranges, in the page
write and its events, in a claim and its result. A key that two rows share, or that a row can lack, loses rows
(a result written to the wrong row, a failure counted for no row, a row never read), so both are refused before
anything runs.
"""

from __future__ import annotations

import sqlalchemy as sa

KEY_SQL = sa.text("""
SELECT a.attnotnull AS not_null,
       EXISTS (SELECT 1 FROM pg_index AS i
                WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indnkeyatts = 1
                  AND i.indpred IS NULL AND i.indkey[0] = a.attnum) AS is_unique
  FROM pg_attribute AS a
 WHERE a.attrelid = to_regclass(:relation) AND a.attname = :key AND a.attnum > 0 AND NOT a.attisdropped
""")
"""The key column's NOT NULL, and whether a unique index covers it alone (no predicate: a partial index leaves
rows outside it free to share a key). :relation text ([schema.]table, quoted or not) · :key text (column)."""


def key_problem(conn: sa.Connection, relation: str, key: str) -> str | None:
    """Why `key` cannot name exactly one row of `relation`, or None when it can: a primary key, or a unique index
    on that column alone over a NOT NULL column."""
    row = conn.execute(KEY_SQL, {"relation": relation, "key": key}).first()
    if row is None:
        return f"{key} is not a column of {relation}"
    if not row.is_unique:
        return (f"{key} must be unique: a primary key, or a unique index on {key} alone (rows sharing a key would "
                "be written, claimed and counted as one)")
    if not row.not_null:
        return (f"{key} must be NOT NULL (a primary key, or a unique index on a NOT NULL column): a row whose key is "
                "NULL can never be named by it")
    return None
