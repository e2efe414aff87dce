"""Transaction-local statement and lock timeouts: the one place their SQL is written.

`set_config(name, value, true)` is `SET LOCAL` with bound parameters (`SET` itself takes none), so
no value is pasted into SQL, and both settings end with the transaction. A write transaction sends
them as its first statement (`SET_LOCAL_TIMEOUTS`); a preamble that must do more in the same round
trip, such as the lease fence, is built with `with_local_timeouts`.
"""

from __future__ import annotations

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
