"""A durable run lease with owner fencing (ba_leases), on the database clock only.

Every operation filters on the owner, so a run that lost its lease cannot touch
the new owner's state. `fence(conn)` runs inside each page transaction and locks
the lease row until that transaction ends, so a takeover waits for the page to
commit: a zombie can never commit a page after the lease moved on.

Lock modes (why FOR KEY SHARE and not FOR SHARE): the owner's heartbeat is an
UPDATE of non-key columns (FOR NO KEY UPDATE), which FOR SHARE would block for
as long as any page transaction is open. With overlapping page transactions the
heartbeat could starve and the lease expire under a healthy run. FOR KEY SHARE
lets the heartbeat through, while a takeover or release still waits: both lock
the row FOR UPDATE (DELETE always does). tests/integration/test_lease.py checks both.

Only a takeover may wait for page transactions, and only of a lease that is no
longer live. The owner's own statements (renewal, a range joining its run's
lease) update non-key columns only, so no page transaction can hold them up.
A statement that locks the row FOR UPDATE holds the row's tuple lock while it
waits, and any renewal that has to wait at all (behind another range's renewal
of the same row) queues behind it: a range rejoining with the old upsert
(`ON CONFLICT DO UPDATE SET name = ...`, FOR UPDATE) waited for every page of
the other ranges and stalled their renewals (docs/DESIGN.md, "Lease renewal").
Expiries are computed from clock_timestamp() (when the statement runs, not when
its transaction began) and never moved backwards (greatest()), so a late
statement cannot shorten what a sibling range's renewal just wrote.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import sqlalchemy as sa

from batch_assets.db.engine import translate_errors
from batch_assets.db.timeouts import BOOKKEEPING, TAKEOVER, bounded, with_local_timeouts
from batch_assets.errors import LeaseLost
from batch_assets.locking.owner import make_owner, provably_dead

log = logging.getLogger(__name__)

__all__ = ["Lease", "lease_owner", "make_owner", "steal_lease"]

# The page transaction's preamble in one round trip: SET LOCAL both timeouts (db.timeouts) and fence
# the lease. :statement_timeout, :lock_timeout (text, e.g. '30000ms': db.timeouts.local_timeouts),
# :name, :owner. `fenced` is NULL when the lease is no longer ours.
FENCE_WITH_TIMEOUTS_SQL = with_local_timeouts(
    """
    (SELECT 1 FROM ba_leases
      WHERE name = :name AND owner = :owner AND expires_at > clock_timestamp()
        FOR KEY SHARE) AS fenced
    """
)

# :name, :owner, :ttl_s. The owner joins (or renews) its own lease, live or expired but not taken: non-key
# columns only (FOR NO KEY UPDATE), so it never waits for a page transaction's fence.
JOIN_SQL = sa.text(
    """
    UPDATE ba_leases
       SET heartbeat_at = clock_timestamp(),
           expires_at = greatest(expires_at, clock_timestamp() + make_interval(secs => :ttl_s))
     WHERE name = :name AND owner = :owner
    RETURNING owner
    """
).bindparams(sa.bindparam("ttl_s", type_=sa.Float))

# :name, :owner, :ttl_s. Creates an absent lease; a present one is left alone (no lock taken).
CREATE_SQL = sa.text(
    """
    INSERT INTO ba_leases (name, owner, acquired_at, heartbeat_at, expires_at)
    VALUES (:name, :owner, clock_timestamp(), clock_timestamp(), clock_timestamp() + make_interval(secs => :ttl_s))
    ON CONFLICT (name) DO NOTHING
    RETURNING owner
    """
).bindparams(sa.bindparam("ttl_s", type_=sa.Float))

# :name, :owner, :ttl_s. Takeover of an expired lease of another owner. The row is locked FOR UPDATE only when
# it is expired (a live lease is not locked at all, so a run that is refused never holds the owner's renewals
# up); the lock waits for any page transaction that still fences the old owner's lease, and the expiry is
# checked again on the row as it is once the lock is granted.
TAKE_OVER_EXPIRED_SQL = sa.text(
    """
    WITH expired AS (
        SELECT name FROM ba_leases
         WHERE name = :name AND owner <> :owner AND expires_at <= clock_timestamp()
           FOR UPDATE
    )
    UPDATE ba_leases AS l
       SET owner = :owner, acquired_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
           expires_at = clock_timestamp() + make_interval(secs => :ttl_s)
      FROM expired
     WHERE l.name = expired.name
    RETURNING l.owner
    """
).bindparams(sa.bindparam("ttl_s", type_=sa.Float))

# :name, :owner, :ttl_s. Owner-filtered renewal; no row back means the lease is gone. Non-key columns only (never
# blocked by a page's FOR KEY SHARE fence); clock_timestamp(), not now(), and never backwards (see the header).
HEARTBEAT_SQL = sa.text(
    """
    UPDATE ba_leases
       SET heartbeat_at = clock_timestamp(),
           expires_at = greatest(expires_at, clock_timestamp() + make_interval(secs => :ttl_s))
     WHERE name = :name AND owner = :owner AND expires_at > clock_timestamp()
    RETURNING owner
    """
).bindparams(sa.bindparam("ttl_s", type_=sa.Float))

# :name, :owner. clock_timestamp(), not now(): now() is the start of the page
# transaction, which may be older than the lease's expiry.
FENCE_SQL = sa.text(
    """
    SELECT 1 FROM ba_leases
     WHERE name = :name AND owner = :owner AND expires_at > clock_timestamp()
       FOR KEY SHARE
    """
)

# :name, :owner
RELEASE_SQL = sa.text("DELETE FROM ba_leases WHERE name = :name AND owner = :owner RETURNING owner")

# :name, :dead, :owner, :ttl_s. Takeover from a holder that is provably dead (locking.owner). The row is
# locked FOR UPDATE first, which (unlike the UPDATE of non-key columns alone) waits for any page
# transaction that still fences the lease with FOR KEY SHARE.
TAKE_OVER_DEAD_SQL = sa.text(
    """
    WITH dead AS (SELECT name FROM ba_leases WHERE name = :name AND owner = :dead FOR UPDATE)
    UPDATE ba_leases AS l
       SET owner = :owner, acquired_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
           expires_at = clock_timestamp() + make_interval(secs => :ttl_s)
      FROM dead
     WHERE l.name = dead.name AND l.owner = :dead
    RETURNING l.owner
    """
).bindparams(sa.bindparam("ttl_s", type_=sa.Float))

# :name
OWNER_SQL = sa.text("SELECT owner FROM ba_leases WHERE name = :name AND expires_at > now()")

# :name, :owner, :ttl_s. Unconditional takeover; returns the previous owner (NULL if none).
STEAL_SQL = sa.text(
    """
    WITH prev AS (SELECT owner FROM ba_leases WHERE name = :name)
    INSERT INTO ba_leases AS l (name, owner, acquired_at, heartbeat_at, expires_at)
    VALUES (:name, :owner, clock_timestamp(), clock_timestamp(), clock_timestamp() + make_interval(secs => :ttl_s))
    ON CONFLICT (name) DO UPDATE
       SET name = EXCLUDED.name, owner = EXCLUDED.owner, acquired_at = EXCLUDED.acquired_at,
           heartbeat_at = EXCLUDED.heartbeat_at, expires_at = EXCLUDED.expires_at
    RETURNING (SELECT owner FROM prev)
    """
).bindparams(sa.bindparam("ttl_s", type_=sa.Float))


class Lease:
    """One named lease held by one owner, renewed by heartbeats, expiring on the database clock."""

    def __init__(self, engine: sa.Engine, name: str, owner: str, ttl_s: float, *,
                 timeouts: Mapping[str, str] | None = BOOKKEEPING) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.engine = engine
        self.name = name
        self.owner = owner
        self.ttl_s = float(ttl_s)
        self.timeouts = timeouts
        """A renewal's statement and lock timeouts (None: the session's, as on a dedicated renewal connection). A
        takeover or a release waits for the pages that fence the lease: TAKEOVER's longer lock timeout."""

    def _waiting(self) -> Mapping[str, str] | None:
        return None if self.timeouts is None else TAKEOVER

    def _params(self) -> dict[str, object]:
        return {"name": self.name, "owner": self.owner, "ttl_s": self.ttl_s}

    def acquire(self) -> bool:
        """Take the lease if it is absent, expired, already ours or held by a provably dead process;
        False if another live owner holds it.

        Joining our own lease and refusing a live one take no lock a page transaction holds, so neither
        waits for page writes; only a takeover (expired, or a dead holder) waits for the old owner's pages."""
        params = self._params()
        with translate_errors(self.engine), bounded(self.engine, self._waiting()) as conn:
            for statement in (JOIN_SQL, CREATE_SQL, TAKE_OVER_EXPIRED_SQL):
                if conn.execute(statement, params).first() is not None:
                    return True
        holder = lease_owner(self.engine, self.name)
        if not provably_dead(holder):
            return False
        with translate_errors(self.engine), bounded(self.engine, self._waiting()) as conn:
            taken = conn.execute(TAKE_OVER_DEAD_SQL, {**params, "dead": holder}).first() is not None
        if taken:
            log.warning("lease %r: holder %s is gone (same host, process ended); taken over by %s",
                        self.name, holder, self.owner)
        return taken

    def heartbeat(self) -> bool:
        """Renew the lease to now + ttl; False if it expired or another owner holds it."""
        with translate_errors(self.engine), bounded(self.engine, self.timeouts) as conn:
            return conn.execute(HEARTBEAT_SQL, self._params()).first() is not None

    def release(self) -> bool:
        """Delete the lease if it is still ours; False if it was not."""
        with translate_errors(self.engine), bounded(self.engine, self._waiting()) as conn:
            return conn.execute(RELEASE_SQL, {"name": self.name, "owner": self.owner}).first() is not None

    def fence(self, conn: sa.Connection, timeouts: Mapping[str, str] | None = None) -> None:
        """Inside a write transaction: raise LeaseLost unless the lease is still ours, and hold it until commit.

        With `timeouts` ({"statement_timeout", "lock_timeout"}), the same round trip also sets them
        for the transaction (SET LOCAL), so a fenced page costs no extra statement.
        """
        params = {"name": self.name, "owner": self.owner}
        if timeouts is None:
            row = conn.execute(FENCE_SQL, params).first()
        else:
            row = conn.execute(FENCE_WITH_TIMEOUTS_SQL, {**params, **timeouts}).first()
            row = row if row is not None and row.fenced is not None else None
        if row is None:
            raise LeaseLost(f"lease {self.name!r} is no longer held by {self.owner}")


def lease_owner(engine: sa.Engine, name: str) -> str | None:
    """The owner of a live (unexpired) lease, or None."""
    with translate_errors(engine), bounded(engine) as conn:
        return conn.execute(OWNER_SQL, {"name": name}).scalar()


def steal_lease(engine: sa.Engine, name: str, new_owner: str, ttl_s: float) -> str | None:
    """Admin takeover: give the lease to `new_owner` whatever its state; returns the previous owner.

    Like a normal takeover it waits for any page transaction that fenced the lease.
    """
    with translate_errors(engine), bounded(engine, TAKEOVER) as conn:
        return conn.execute(STEAL_SQL, {"name": name, "owner": new_owner, "ttl_s": float(ttl_s)}).scalar()
