"""Cursor ranges over an ordered key (uuid, bigint or integer) and where their bounds come from.

A `CursorRange` is an inclusive key range [lo, hi], always bound: the whole key space of a uuid
key is lo=0…0, hi=f…f; of a bigint key -2^63 … 2^63-1; of an integer key -2^31 … 2^31-1. The first
range of a plan starts at the space's minimum and the last ends at its maximum, so every row is in
exactly one range whatever the bounds in between are.

The bounds in between follow the table's key distribution, not an even split of the key space: an
even split of the UUID space puts every time-ordered UUIDv7 (their first 48 bits are a timestamp)
into one or two ranges. `plan_ranges` takes them from the planner's statistics (pg_stats
histogram_bounds) when the table was analyzed and has not changed much since, else from quantiles
of a bounded sample of the keys (TABLESAMPLE SYSTEM, at most about SAMPLE_ROWS rows read).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from batch_assets.errors import ConfigError

log = logging.getLogger(__name__)

UUID_MIN = uuid.UUID("00000000-0000-0000-0000-000000000000")
UUID_MAX = uuid.UUID("ffffffff-ffff-ffff-ffff-ffffffffffff")

KEY_SPACES: dict[str, tuple[Any, Any]] = {
    "uuid": (UUID_MIN, UUID_MAX),
    "bigint": (-(2**63), 2**63 - 1),
    "integer": (-(2**31), 2**31 - 1),
}
"""Key type (PostgreSQL's name) → the whole key space, inclusive."""

SAMPLE_ROWS = 20_000
"""About how many keys a sampled plan reads (the quantiles of 4 … 256 ranges need no more)."""
STALE_STATS_FRACTION = 0.1
"""Statistics are used only while fewer than this fraction of the rows changed since the last ANALYZE."""


@dataclass(frozen=True)
class CursorRange:
    """An inclusive key range [lo, hi]; always bound (the whole uuid space is lo=0…0, hi=f…f)."""

    lo: Any = UUID_MIN
    hi: Any = UUID_MAX

    def __post_init__(self) -> None:
        if type(self.lo) is not type(self.hi):
            raise ConfigError("lo and hi must be keys of the same type", field="cursor_range")
        if self.lo > self.hi:
            raise ConfigError("lo must not be greater than hi", field="cursor_range")

    @classmethod
    def parse(cls, lo: str | uuid.UUID, hi: str | uuid.UUID) -> CursorRange:
        """A uuid range from its bounds' text."""
        try:
            return cls(uuid.UUID(str(lo)), uuid.UUID(str(hi)))
        except ValueError:
            raise ConfigError("bounds must be UUIDs", field="cursor_range") from None

    @classmethod
    def whole(cls, kind: str) -> CursorRange:
        """The whole key space of a key type."""
        lo, hi = key_space(kind)
        return cls(lo, hi)

    @property
    def is_full(self) -> bool:
        return (self.lo, self.hi) in KEY_SPACES.values()

    @property
    def key(self) -> str:
        """The checkpoint's range_key: 'all' for the whole key space, else 'lo..hi'."""
        return "all" if self.is_full else f"{self.lo}..{self.hi}"

    def contains(self, value: Any) -> bool:
        """Whether `value` (a key of this range's type) lies in the range; False for any other value."""
        if type(value) is not type(self.lo):
            return False
        return bool(self.lo <= value <= self.hi)


FULL_RANGE = CursorRange()


def key_space(kind: str) -> tuple[Any, Any]:
    """(min, max) of a key type; ConfigError naming `key` for a type that is not uuid, bigint or integer."""
    try:
        return KEY_SPACES[kind]
    except KeyError:
        raise ConfigError(f"must be of type uuid, bigint or integer, got {kind}", field="key") from None


def key_value(kind: str, value: Any) -> Any:
    """A key of type `kind` from its JSON form (a checkpointed cursor); ValueError when it is not one."""
    if kind == "uuid":
        if not isinstance(value, str):
            raise ValueError("not a uuid")
        return uuid.UUID(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("not an integer")
    lo, hi = key_space(kind)
    if not lo <= value <= hi:
        raise ValueError("out of the key space")
    return value


def key_json(value: Any) -> Any:
    """The JSON form of a key (a uuid as its text, an integer as itself)."""
    return str(value) if isinstance(value, uuid.UUID) else value


def split_at(kind: str, bounds: list[Any]) -> list[CursorRange]:
    """Contiguous ranges covering the whole key space, a new range starting at each of `bounds`."""
    lo, hi = key_space(kind)
    starts = sorted({b for b in bounds if lo < b <= hi})
    edges = [lo, *starts]
    ranges = []
    for i, start in enumerate(edges):
        end = _before(edges[i + 1]) if i + 1 < len(edges) else hi
        ranges.append(CursorRange(start, end))
    return ranges


def even_split(kind: str, count: int) -> list[CursorRange]:
    """`count` ranges of equal width of the key space (right for uniformly random keys such as UUIDv4 only)."""
    lo, hi = key_space(kind)
    low, width = _as_int(lo), _as_int(hi) - _as_int(lo) + 1
    return split_at(kind, [_from_int(kind, low + width * i // count) for i in range(1, count)])


def plan_ranges(
    conn: sa.Connection, *, table: str, schema: str, key: str, kind: str, count: int, where: str | None = None
) -> list[CursorRange]:
    """About `count` ranges whose bounds follow the key distribution of `schema.table` (see the module docstring).

    `table`, `schema` and `key` are plain names (quoted here); `where` is the sweep's filter (SQL, already
    validated). Fewer ranges come back when the table has fewer distinct keys; one (the whole space) for 1.
    """
    key_space(kind)  # the key type goes into the statements below as a cast: only a known one (ConfigError)
    if count <= 1:
        return [CursorRange.whole(kind)]
    bounds = _histogram_bounds(conn, schema, table, key, kind, count)
    source = "statistics"
    if bounds is None:
        bounds = _sampled_bounds(conn, schema, table, key, kind, count, where)
        source = "sample"
    ranges = split_at(kind, bounds)
    log.info("%s.%s: %d cursor range(s) from the key distribution (%s)", schema, table, len(ranges), source)
    return ranges


def quote(name: str) -> str:
    """A quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _histogram_bounds(
    conn: sa.Connection, schema: str, table: str, key: str, kind: str, count: int
) -> list[Any] | None:
    """Quantile bounds from pg_stats' histogram of the key, or None when there are no fresh statistics."""
    row = conn.execute(sa.text(
        "SELECT s.histogram_bounds::text AS bounds, t.n_live_tup, t.n_mod_since_analyze "
        "  FROM pg_stats AS s JOIN pg_stat_user_tables AS t ON t.schemaname = s.schemaname AND t.relname = s.tablename "
        " WHERE s.schemaname = :schema AND s.tablename = :table AND s.attname = :key"
    ), {"schema": schema, "table": table, "key": key}).first()
    if row is None or row.bounds is None:
        return None
    live, modified = int(row.n_live_tup or 0), int(row.n_mod_since_analyze or 0)
    if live <= 0 or modified > STALE_STATS_FRACTION * live:
        return None
    values = conn.execute(sa.text(f"SELECT unnest(CAST(:bounds AS {kind}[]))"), {"bounds": row.bounds}).scalars().all()
    if len(values) < count + 1:
        return None
    last = len(values) - 1
    return [values[last * i // count] for i in range(1, count)]


def _sampled_bounds(
    conn: sa.Connection, schema: str, table: str, key: str, kind: str, count: int, where: str | None
) -> list[Any]:
    """Quantile bounds of a bounded sample of the keys (TABLESAMPLE SYSTEM, about SAMPLE_ROWS rows)."""
    relation = f"{quote(schema)}.{quote(table)}"
    estimate = conn.execute(sa.text(
        "SELECT CASE WHEN c.reltuples > 0 THEN c.reltuples "
        "            ELSE greatest(pg_relation_size(c.oid) / current_setting('block_size')::int, 1) * 100 END "
        "  FROM pg_class AS c WHERE c.oid = CAST(:relation AS regclass)"
    ), {"relation": relation}).scalar_one()
    percent = min(100.0, 100.0 * SAMPLE_ROWS / max(float(estimate), 1.0))
    fractions = [i / count for i in range(1, count)]
    filtered = f"WHERE (\n{where}\n)" if where else ""
    sql = sa.text(
        f"SELECT percentile_disc(CAST(:fractions AS float8[])) WITHIN GROUP (ORDER BY k) "  # noqa: S608
        f"  FROM (SELECT {quote(key)} AS k FROM {relation} TABLESAMPLE SYSTEM (:percent) {filtered}) AS sample"
    )
    bounds = conn.execute(sql, {"fractions": fractions, "percent": percent}).scalar_one()
    return [b for b in (bounds or []) if b is not None]


def _as_int(value: Any) -> int:
    return value.int if isinstance(value, uuid.UUID) else int(value)


def _from_int(kind: str, value: int) -> Any:
    return uuid.UUID(int=value) if kind == "uuid" else value


def _before(value: Any) -> Any:
    """The key just before `value` (its range's inclusive end)."""
    if isinstance(value, uuid.UUID):
        return uuid.UUID(int=value.int - 1)
    return value - 1
