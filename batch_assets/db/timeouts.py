"""Transaction-local statement and lock timeouts: the one place their SQL is written.

`set_config(name, value, true)` is `SET LOCAL` with bound parameters (`SET` itself takes none), so
no value is pasted into SQL, and both settings end with the transaction. A write transaction sends
them as its first statement (`SET_LOCAL_TIMEOUTS`); a preamble that must do more in the same round
trip, such as the lease fence, is built with `with_local_timeouts`.

Every transaction is bounded: page transactions by the sweep's own settings, bookkeeping (checkpoints,
locks, leases, run history) by `bounded`, so a row or table another session holds locked makes it fail
within its lock timeout instead of hanging the run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import sqlalchemy as sa

# SET_LOCAL_TIMEOUTS — both timeouts for the rest of the transaction, in one round trip.
#   :statement_timeout  text  e.g. '30000ms' (local_timeouts)
#   :lock_timeout       text  e.g. '5000ms'
SET_LOCAL_TIMEOUTS = sa.text(
    "SELECT set_config('statement_timeout', :statement_timeout, true), "
    "set_config('lock_timeout', :lock_timeout, true)"
)


# SESSION_TIMEOUTS_SQL — both timeouts for the rest of the session (a dedicated connection, db.engine.dedicated_engine),
# on the driver's cursor: positional %s parameters, statement_timeout then lock_timeout (local_timeouts' texts).
SESSION_TIMEOUTS_SQL = "SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)"


def with_local_timeouts(columns: str) -> sa.TextClause:
    """SET_LOCAL_TIMEOUTS that also returns `columns`: a transaction preamble in one round trip.

    `columns` is the caller's constant SQL (a select list, e.g. a fencing subquery), never input; the
    statement takes SET_LOCAL_TIMEOUTS' parameters plus those of `columns`.
    """
    return sa.text(SET_LOCAL_TIMEOUTS.text + ", " + columns.strip())


def local_timeouts(statement_s: float, lock_s: float) -> dict[str, str]:
    """The parameters of SET_LOCAL_TIMEOUTS, in whole milliseconds and at least 1 (0 would mean none)."""
    return {"statement_timeout": _ms(statement_s), "lock_timeout": _ms(lock_s)}


def set_local_timeouts(conn: sa.Connection, *, statement_s: float, lock_s: float) -> None:
    """Inside a transaction: SET LOCAL statement_timeout and lock_timeout (one round trip). A caller that
    sends the same pair often keeps `local_timeouts(...)` and executes SET_LOCAL_TIMEOUTS with it."""
    conn.execute(SET_LOCAL_TIMEOUTS, local_timeouts(statement_s, lock_s))


def _ms(seconds: float) -> str:
    return f"{max(1, int(seconds * 1000))}ms"


BOOKKEEPING_STATEMENT_S = 10.0
"""statement_timeout of a bookkeeping transaction: each is one or two statements on a handful of rows (milliseconds)."""
BOOKKEEPING_LOCK_S = 5.0
"""lock_timeout of a bookkeeping transaction: the rows it locks are held by other bookkeeping statements only, for
milliseconds; a session that holds them longer (a stuck client, a manual `LOCK TABLE`) fails it in 5 s."""
TAKEOVER_LOCK_S = 60.0
"""lock_timeout of a lease takeover or release: it waits for the page transactions that still fence the lease,
each bounded by its page_timeout_s (30 s by default). A page that outlasts this fails the takeover, which the next
attempt (the next run, the next tick) repeats."""

BOOKKEEPING = local_timeouts(BOOKKEEPING_STATEMENT_S, BOOKKEEPING_LOCK_S)
TAKEOVER = local_timeouts(TAKEOVER_LOCK_S + BOOKKEEPING_STATEMENT_S, TAKEOVER_LOCK_S)


@contextmanager
def bounded(engine: sa.Engine, timeouts: Mapping[str, str] | None = BOOKKEEPING) -> Iterator[sa.Connection]:
    """`engine.begin()` whose first statement sets `timeouts` for the transaction (None: the session's own, e.g. a
    dedicated renewal connection's shorter ones)."""
    with engine.begin() as conn:
        if timeouts is not None:
            conn.execute(SET_LOCAL_TIMEOUTS, dict(timeouts))
        yield conn
