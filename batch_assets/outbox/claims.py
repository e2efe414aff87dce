"""The relay's statements on outbox_events: claim a batch (FOR UPDATE SKIP LOCKED, a claim lease), give a claim
back, mark a batch SENT fenced by its claim, and free the claims of relays whose process is gone. Each is one
autocommit statement: no transaction is ever held while a sink is called."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa

from batch_assets.db.engine import driver_connection
from batch_assets.outbox import sql
from batch_assets.outbox.event import OutboxEvent
from batch_assets.outbox.settings import RelaySettings

log = logging.getLogger("batch_assets.outbox.relay")


def autocommit(engine: sa.Engine) -> sa.Engine:
    # One statement, its own implicit transaction: no BEGIN/COMMIT round trips, so not even a
    # moment "idle in transaction" between the statement and its commit.
    return engine.execution_options(isolation_level="AUTOCOMMIT")


@dataclass(frozen=True)
class ClaimedBatch:
    """A claimed batch in id order; `more` when PENDING events were left for the next batch (the row or the
    byte budget was reached)."""

    events: list[OutboxEvent]
    more: bool

    @property
    def last_id(self) -> int:
        """Where the next claim of the pass starts (events are in id order; 0 when the batch is empty)."""
        return self.events[-1].id if self.events else 0


@contextmanager
def claiming_connection(engine: sa.Engine) -> Iterator[sa.Connection]:
    """The connection a relay pass claims on: autocommit (each claim its own statement, never idle in a
    transaction), its plan pinned to the ordered walk of outbox_events_pending_idx (sql.PIN_CLAIM_PLAN).

    Unpinned, right after a sweep inserted its events (no statistics yet) the planner took a bitmap scan of
    every PENDING row plus a sort for each claim (measured: 34 ms per claim of 500 with 25k pending), so a
    drain's cost grew with the square of its backlog. Reset before the connection goes back to the pool."""
    with autocommit(engine).connect() as conn:
        conn.exec_driver_sql(sql.PIN_CLAIM_PLAN)
        try:
            yield conn
        finally:
            try:
                conn.exec_driver_sql(sql.UNPIN_CLAIM_PLAN)
            except sa.exc.DBAPIError:  # a broken connection is not put back pinned
                conn.invalidate()


def claim(conn: sa.Connection, owner: str, settings: RelaySettings, after: int = 0) -> ClaimedBatch:
    with driver_connection(conn.connection).cursor() as cur:  # plain tuples (sql.CLAIM_BATCH_DRIVER)
        cur.execute(sql.CLAIM_BATCH_DRIVER,
                    {"limit": settings.batch_size, "max_bytes": settings.batch_bytes, "owner": owner,
                     "lease_s": float(settings.claim_lease_s), "after": after})
        rows = cur.fetchall()
    # The named tuples straight from the rows' first five columns (OutboxEvent._make is a Python call and a length
    # check per event), sorted as tuples: by id, which is unique, so no other field is ever compared.
    new = tuple.__new__
    events: list[OutboxEvent] = [new(OutboxEvent, r[:5]) for r in rows]
    events.sort()
    candidates = int(rows[0][5]) if rows else 0
    more = candidates >= settings.batch_size or len(events) < candidates
    return ClaimedBatch(events, more)


def release(engine: sa.Engine, ids: list[int], owner: str) -> None:
    try:
        with autocommit(engine).connect() as conn:
            conn.execute(sql.RELEASE_CLAIM, {"ids": ids, "owner": owner})
    except sa.exc.DBAPIError as exc:  # the claim lease expires on its own
        log.warning("outbox relay: claim not released (%s); it expires with its lease", type(exc).__name__)


def mark_sent(db: sa.Engine | sa.Connection, ids: list[int], owner: str) -> int:
    """Mark `ids` SENT (fenced by the claim) in one statement: on `db`'s connection, or one from its pool."""
    if isinstance(db, sa.Engine):
        with autocommit(db).connect() as conn:
            return mark_sent(conn, ids, owner)
    literal = "{" + ",".join(map(str, ids)) + "}"  # one text parameter, not 500 adapted ints
    with driver_connection(db.connection).cursor() as cur:  # the driver's cursor, as the claim
        cur.execute(sql.MARK_SENT_DRIVER, {"ids": literal, "owner": owner})
        row = cur.fetchone()
    return int(row[0]) if row else 0


@contextmanager
def marking_connection(engine: sa.Engine) -> Iterator[sa.Connection]:
    """The autocommit connection a relay pass marks its batches SENT on, one batch after the other.

    Held for the pass, like the claiming connection: a checkout per batch cost a pre-ping, the autocommit switch
    and the reset on return, three round trips around the one statement (measured: 4 us of relay CPU per event,
    more than the statement itself). A connection the driver found broken is not put back in the pool."""
    with autocommit(engine).connect() as conn:
        try:
            yield conn
        finally:
            if conn.connection.driver_connection is None or driver_connection(conn.connection).broken:
                conn.invalidate()


def free_dead_claims(engine: sa.Engine) -> int:
    """Release the claims of relays whose process is provably dead, so their batch is sent now, not after
    its claim lease (the same rule as the job lock's takeover: this host and pid namespace, process gone)."""
    from batch_assets.locking.owner import provably_dead

    with engine.connect() as conn:
        claimants = [owner for owner in conn.execute(sql.LIVE_CLAIMANTS).scalars() if provably_dead(owner)]
    freed = 0
    for dead in claimants:
        with engine.begin() as conn:
            freed += conn.execute(sql.FREE_DEAD_CLAIMS, {"dead": dead}).rowcount
        log.warning("outbox relay: %d event(s) claimed by %s, whose process is gone, are claimable again",
                    freed, dead)
    return freed
