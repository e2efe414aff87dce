"""Cursor ranges follow the key distribution, whatever the key type `full`).

An even split of the UUID space puts every time-ordered UUIDv7 into one or two ranges; the planned bounds
(sampled quantiles, or pg_stats' histogram once the table is analyzed) give 4 ranges of about a quarter each.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
import sqlalchemy as sa

from batch_assets.engine.ranges import CursorRange, even_split, key_space, plan_ranges

ROWS = 20_000


def uuid7(ms: int) -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, version 7, variant 10, random bits."""
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | (rand >> 68 & 0xFFF) << 64 | 0b10 << 62 | rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def counts(conn: sa.Connection, table: str, ranges: list[CursorRange]) -> list[int]:
    return [int(conn.execute(sa.text(f"SELECT count(*) FROM {table} WHERE id BETWEEN :lo AND :hi"),  # noqa: S608
                             {"lo": r.lo, "hi": r.hi}).scalar_one()) for r in ranges]


def assert_balanced(sizes: list[int], total: int, count: int = 4) -> None:
    assert len(sizes) == count, sizes
    assert sum(sizes) == total, "the ranges must cover every row exactly once"
    mean = total / count
    assert max(sizes) <= 1.5 * mean, f"a range holds {max(sizes)} rows, more than 1.5 x the mean {mean:.0f}: {sizes}"


def contiguous(ranges: list[CursorRange], kind: str) -> None:
    lo, hi = key_space(kind)
    assert ranges[0].lo == lo and ranges[-1].hi == hi
    for left, right in zip(ranges, ranges[1:], strict=False):
        step = (right.lo.int - left.hi.int) if kind == "uuid" else right.lo - left.hi
        assert step == 1, "ranges must be contiguous"


@pytest.fixture
def uuid7_table(engine: sa.Engine) -> str:
    start = int(time.time() * 1000) - 86_400_000
    keys = [uuid7(start + i * 50) for i in range(ROWS)]  # 20k rows over ~17 minutes, time ordered
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE events7 (id uuid PRIMARY KEY, payload text)"))
        conn.execute(sa.text("INSERT INTO events7 (id, payload) SELECT unnest(CAST(:ids AS uuid[])), 'x'"),
                     {"ids": keys})
    return "events7"


def test_uuid7_even_split_puts_everything_in_one_range(engine: sa.Engine, uuid7_table: str) -> None:
    """The baseline the planner fixes: an even split of the UUID space is useless for UUIDv7 keys."""
    with engine.connect() as conn:
        sizes = counts(conn, uuid7_table, even_split("uuid", 4))
    assert max(sizes) == ROWS, sizes


@pytest.mark.parametrize("analyzed", [False, True], ids=["sampled", "pg_stats"])
def test_uuid7_four_ranges_within_1_5x_of_the_mean(engine: sa.Engine, uuid7_table: str, analyzed: bool) -> None:
    with engine.connect() as conn:
        if analyzed:
            conn.execute(sa.text(f"ANALYZE {uuid7_table}"))
            # pg_stats has the key's histogram now: the plan reads no row of the table.
            assert conn.execute(sa.text("SELECT histogram_bounds IS NOT NULL FROM pg_stats "
                                        "WHERE tablename = 'events7' AND attname = 'id'")).scalar_one()
        ranges = plan_ranges(conn, table=uuid7_table, schema="public", key="id", kind="uuid", count=4)
        contiguous(ranges, "uuid")
        assert_balanced(counts(conn, uuid7_table, ranges), ROWS)


def test_uuid4_keys(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE events4 (id uuid PRIMARY KEY DEFAULT gen_random_uuid())"))
        conn.execute(sa.text(f"INSERT INTO events4 SELECT FROM generate_series(1, {ROWS})"))
        ranges = plan_ranges(conn, table="events4", schema="public", key="id", kind="uuid", count=4)
        contiguous(ranges, "uuid")
        assert_balanced(counts(conn, "events4", ranges), ROWS)


@pytest.mark.parametrize("kind", ["bigint", "integer"])
def test_integer_keys_with_a_skewed_distribution(engine: sa.Engine, kind: str) -> None:
    """Dense small keys plus a far cluster (e.g. ids from two sequences): bounds follow the rows, not the space."""
    far = 10**12 if kind == "bigint" else 2 * 10**9
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE items (id {kind} PRIMARY KEY, v int)"))
        conn.execute(sa.text("INSERT INTO items SELECT g, 0 FROM generate_series(1, 12000) AS g"))
        conn.execute(sa.text(f"INSERT INTO items SELECT {far} + g, 0 FROM generate_series(1, 8000) AS g"))
        ranges = plan_ranges(conn, table="items", schema="public", key="id", kind=kind, count=4)
        contiguous(ranges, kind)
        assert all(isinstance(r.lo, int) for r in ranges)
        assert_balanced(counts(conn, "items", ranges), ROWS)
        assert max(counts(conn, "items", even_split(kind, 4))) > 1.5 * ROWS / 4, "an even split is unbalanced"


def test_a_tiny_table_gets_fewer_ranges_and_one_range_is_the_whole_space(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE tiny (id integer PRIMARY KEY)"))
        conn.execute(sa.text("INSERT INTO tiny VALUES (5), (6)"))
        ranges = plan_ranges(conn, table="tiny", schema="public", key="id", kind="integer", count=8)
        assert 1 <= len(ranges) <= 3
        contiguous(ranges, "integer")
        whole = plan_ranges(conn, table="tiny", schema="public", key="id", kind="integer", count=1)
        assert whole == [CursorRange.whole("integer")] and whole[0].is_full and whole[0].key == "all"
