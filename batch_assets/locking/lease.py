"""A durable run lease with owner fencing (ba_leases), on the database clock only.

Every operation filters on the owner, so a run that lost its lease cannot touch
the new owner's state. `fence(conn)` runs inside each page transaction and locks
the lease row until that transaction ends, so a takeover waits for the page to
commit: a zombie can never commit a page after the lease moved on.

Lock modes (why FOR KEY SHARE and not FOR SHARE): the owner's heartbeat is an
UPDATE of non-key columns (FOR NO KEY UPDATE), which FOR SHARE would block for
as long as any page transaction is open. With overlapping page transactions the
heartbeat could starve and the lease expire under a healthy run. FOR KEY SHARE
lets the heartbeat through, while a takeover or release still waits: takeover
assigns the key column (`SET name = EXCLUDED.name`), so ON CONFLICT locks the row
FOR UPDATE, and DELETE always does. tests/integration/test_lease.py checks both.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import sqlalchemy as sa

from batch_assets.db.engine import translate_errors
from batch_assets.db.timeouts import with_local_timeouts
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

# :name, :owner, :ttl_s. Takes the lease if absent, expired or already ours.
ACQUIRE_SQL = sa.text(
    """
    INSERT INTO ba_leases AS l (name, owner, acquired_at, heartbeat_at, expires_at)
    VALUES (:name, :owner, now(), now(), now() + make_interval(secs => :ttl_s))
    ON CONFLICT (name) DO UPDATE
       SET name = EXCLUDED.name,
           owner = EXCLUDED.owner,
           acquired_at = CASE WHEN l.owner = EXCLUDED.owner THEN l.acquired_at ELSE EXCLUDED.acquired_at END,
           heartbeat_at = EXCLUDED.heartbeat_at,
           expires_at = EXCLUDED.expires_at
     WHERE l.owner = EXCLUDED.owner OR l.expires_at <= now()
    RETURNING l.owner
    """
).bindparams(sa.bindparam("ttl_s", type_=sa.Float))

# :name, :owner, :ttl_s. Owner-filtered renewal; no row back means the lease is gone.
HEARTBEAT_SQL = sa.text(
    """
    UPDATE ba_leases
       SET heartbeat_at = now(), expires_at = now() + make_interval(secs => :ttl_s)
     WHERE name = :name AND owner = :owner AND expires_at > now()
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
       SET owner = :owner, acquired_at = now(), heartbeat_at = now(),
           expires_at = now() + make_interval(secs => :ttl_s)
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
    VALUES (:name, :owner, now(), now(), now() + make_interval(secs => :ttl_s))
    ON CONFLICT (name) DO UPDATE
       SET name = EXCLUDED.name, owner = EXCLUDED.owner, acquired_at = EXCLUDED.acquired_at,
           heartbeat_at = EXCLUDED.heartbeat_at, expires_at = EXCLUDED.expires_at
    RETURNING (SELECT owner FROM prev)
    """
).bindparams(sa.bindparam("ttl_s", type_=sa.Float))


class Lease:
    """One named lease held by one owner, renewed by heartbeats, expiring on the database clock."""

    def __init__(self, engine: sa.Engine, name: str, owner: str, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.engine = engine
        self.name = name
        self.owner = owner
        self.ttl_s = float(ttl_s)

    def _params(self) -> dict[str, object]:
        return {"name": self.name, "owner": self.owner, "ttl_s": self.ttl_s}

    def acquire(self) -> bool:
        """Take the lease if it is absent, expired, already ours or held by a provably dead process;
        False if another live owner holds it."""
        with translate_errors(self.engine), self.engine.begin() as conn:
            if conn.execute(ACQUIRE_SQL, self._params()).first() is not None:
                return True
        holder = lease_owner(self.engine, self.name)
        if not provably_dead(holder):
            return False
        with translate_errors(self.engine), self.engine.begin() as conn:
            taken = conn.execute(TAKE_OVER_DEAD_SQL, {**self._params(), "dead": holder}).first() is not None
        if taken:
            log.warning("lease %r: holder %s is gone (same host, process ended); taken over by %s",
                        self.name, holder, self.owner)
        return taken

    def heartbeat(self) -> bool:
        """Renew the lease to now + ttl; False if it expired or another owner holds it."""
        with translate_errors(self.engine), self.engine.begin() as conn:
            return conn.execute(HEARTBEAT_SQL, self._params()).first() is not None

    def release(self) -> bool:
        """Delete the lease if it is still ours; False if it was not."""
        with translate_errors(self.engine), self.engine.begin() as conn:
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
    with translate_errors(engine), engine.connect() as conn:
        return conn.execute(OWNER_SQL, {"name": name}).scalar()


def steal_lease(engine: sa.Engine, name: str, new_owner: str, ttl_s: float) -> str | None:
    """Admin takeover: give the lease to `new_owner` whatever its state; returns the previous owner.

    Like a normal takeover it waits for any page transaction that fenced the lease.
    """
    with translate_errors(engine), engine.begin() as conn:
        return conn.execute(STEAL_SQL, {"name": name, "owner": new_owner, "ttl_s": float(ttl_s)}).scalar()
