"""The job lock: one expiring key per job, shared by every run mode that writes the same rows.

Two backends with one protocol. Both are lock-at-most-for (an expiry, renewed by
the heartbeat with compare-and-extend), released with compare-and-delete, and
support lock-at-least-for: a release before `locked_at + min_s` keeps the lock
until then instead of deleting it, so a run that finishes in a second still
blocks a second trigger of the same schedule tick.

Time always comes from the store's clock (PostgreSQL `now()`, Redis key TTLs),
never from this process, so clock skew between hosts cannot break exclusion.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import sqlalchemy as sa

from batch_assets.db.engine import describe_target
from batch_assets.db.timeouts import BOOKKEEPING, bounded
from batch_assets.errors import LockStoreUnavailable, cause_line
from batch_assets.extras import needs_extra
from batch_assets.locking.owner import provably_dead
from batch_assets.settings import REDIS_URL_VAR

log = logging.getLogger(__name__)

REDIS_KEY_PREFIX = "batch_assets:lock:"


@runtime_checkable
class JobLock(Protocol):
    """An expiring, owner-checked job lock."""

    def acquire(self, name: str, owner: str, ttl_s: float, min_s: float = 0) -> bool:
        """Take the lock if it is free or expired; False if another owner holds it."""
        ...

    def extend(self, name: str, owner: str, ttl_s: float) -> bool:
        """Push the expiry to now + ttl_s, only if `owner` still holds the lock."""
        ...

    def release(self, name: str, owner: str, *, failed: bool = False) -> bool:
        """Delete the lock if `owner` holds it (kept until the lock-at-least-for time, unless the run `failed`)."""
        ...

    def holder(self, name: str) -> str | None:
        """The owner of a live lock, or None."""
        ...


def _log_takeover(name: str, dead: str | None, owner: str) -> None:
    log.warning("job lock %r: holder %s is gone (same host, process ended); taken over by %s", name, dead, owner)


# --- PostgreSQL ---------------------------------------------------------------

# :name, :owner, :ttl_s, :min_s. Takes a missing or expired row in one statement;
# the conflict branch only fires when the current holder's lock_until has passed.
ACQUIRE_SQL = sa.text(
    """
    INSERT INTO ba_job_locks AS l (name, owner, locked_at, lock_until, min_until)
    VALUES (:name, :owner, now(),
            now() + make_interval(secs => greatest(:ttl_s, :min_s)),
            now() + make_interval(secs => :min_s))
    ON CONFLICT (name) DO UPDATE
       SET owner = EXCLUDED.owner, locked_at = EXCLUDED.locked_at,
           lock_until = EXCLUDED.lock_until, min_until = EXCLUDED.min_until
     WHERE l.lock_until <= now()
    RETURNING l.owner
    """
).bindparams(sa.bindparam("ttl_s", type_=sa.Float), sa.bindparam("min_s", type_=sa.Float))

# :name, :owner, :ttl_s. Compare-and-extend; never shortens below the lock-at-least-for time.
EXTEND_SQL = sa.text(
    """
    UPDATE ba_job_locks
       SET lock_until = greatest(min_until, now() + make_interval(secs => :ttl_s))
     WHERE name = :name AND owner = :owner AND lock_until > now()
    RETURNING owner
    """
).bindparams(sa.bindparam("ttl_s", type_=sa.Float))

# :name, :owner, :failed. Compare-and-delete; before min_until the row stays, expiring at min_until,
# unless the run failed: lock-at-least-for keeps a finished run's schedule tick from running twice, and a
# run that failed must not keep its retry out. A kept lock's owner gets the suffix '#released': it names
# no running process any more, so the dead-holder takeover (locking.owner) never applies to it.
# The two branches have disjoint conditions on the same snapshot, so at most one applies.
RELEASE_SQL = sa.text(
    """
    WITH kept AS (
        UPDATE ba_job_locks SET lock_until = min_until, owner = owner || '#released'
         WHERE name = :name AND owner = :owner AND lock_until > now() AND min_until > now() AND NOT :failed
        RETURNING 1
    ), deleted AS (
        DELETE FROM ba_job_locks
         WHERE name = :name AND owner = :owner AND (lock_until <= now() OR min_until <= now() OR :failed)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM kept) + (SELECT count(*) FROM deleted)
    """
)

# :name, :dead, :owner, :ttl_s, :min_s. Takeover from a holder that is provably dead (locking.owner). Its
# lock-at-least-for time does not count: that keeps a *finished* run's tick from running twice, and a
# crashed run did not finish.
TAKE_OVER_DEAD_SQL = sa.text(
    """
    UPDATE ba_job_locks
       SET owner = :owner, locked_at = now(),
           lock_until = now() + make_interval(secs => greatest(:ttl_s, :min_s)),
           min_until = now() + make_interval(secs => :min_s)
     WHERE name = :name AND owner = :dead
    RETURNING owner
    """
).bindparams(sa.bindparam("ttl_s", type_=sa.Float), sa.bindparam("min_s", type_=sa.Float))

# :name
HOLDER_SQL = sa.text("SELECT owner FROM ba_job_locks WHERE name = :name AND lock_until > now()")


class PostgresJobLock:
    """The job lock as rows of `ba_job_locks`, using the database clock."""

    def __init__(self, engine: sa.Engine, *, timeouts: Mapping[str, str] | None = BOOKKEEPING) -> None:
        self.engine = engine
        self.timeouts = timeouts
        """Each transaction's statement and lock timeouts (None: the session's, as on a dedicated renewal
        connection)."""

    @contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            raise LockStoreUnavailable(
                f"lock store PostgreSQL at {describe_target(self.engine.url)} is unavailable: {cause_line(exc)}"
            ) from None

    def acquire(self, name: str, owner: str, ttl_s: float, min_s: float = 0) -> bool:
        """Take the lock if it is free, expired or held by a provably dead process; False if another owner holds it."""
        params = {"name": name, "owner": owner, "ttl_s": float(ttl_s), "min_s": float(min_s)}
        with self._translate(), bounded(self.engine, self.timeouts) as conn:
            if conn.execute(ACQUIRE_SQL, params).first() is not None:
                return True
        holder = self.holder(name)
        if not provably_dead(holder):
            return False
        with self._translate(), bounded(self.engine, self.timeouts) as conn:
            taken = conn.execute(TAKE_OVER_DEAD_SQL, {**params, "dead": holder}).first() is not None
        if taken:
            _log_takeover(name, holder, owner)
        return taken

    def extend(self, name: str, owner: str, ttl_s: float) -> bool:
        """Push the expiry to now + ttl_s, only if `owner` still holds a live lock."""
        with self._translate(), bounded(self.engine, self.timeouts) as conn:
            row = conn.execute(EXTEND_SQL, {"name": name, "owner": owner, "ttl_s": float(ttl_s)}).first()
        return row is not None

    def release(self, name: str, owner: str, *, failed: bool = False) -> bool:
        """Delete the lock if `owner` holds it; before its lock-at-least-for time keep it until then,
        unless the run `failed`."""
        with self._translate(), bounded(self.engine, self.timeouts) as conn:
            count = conn.execute(RELEASE_SQL, {"name": name, "owner": owner, "failed": failed}).scalar_one()
        return count > 0

    def holder(self, name: str) -> str | None:
        """The owner of a live lock, or None."""
        with self._translate(), bounded(self.engine, self.timeouts) as conn:
            return conn.execute(HOLDER_SQL, {"name": name}).scalar()

    def close(self) -> None:
        """Nothing to close: the engine belongs to the caller."""


# --- Redis ----------------------------------------------------------------------

# KEYS[1] lock, KEYS[2] lock-at-least-for marker; ARGV owner, ttl_ms, min_ms.
# SET NX PX, plus the marker whose TTL is the remaining minimum hold.
_ACQUIRE_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', math.max(tonumber(ARGV[2]), tonumber(ARGV[3]))) then
  if tonumber(ARGV[3]) > 0 then
    redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
  else
    redis.call('DEL', KEYS[2])
  end
  return 1
end
return 0
"""

# KEYS[1] lock, KEYS[2] marker; ARGV dead owner, owner, ttl_ms, min_ms. Takeover from a provably dead
# holder (locking.owner): compare-and-set; the dead holder's lock-at-least-for marker does not count.
_TAKE_OVER_DEAD_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', math.max(tonumber(ARGV[3]), tonumber(ARGV[4])))
  if tonumber(ARGV[4]) > 0 then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[4])
  else
    redis.call('DEL', KEYS[2])
  end
  return 1
end
return 0
"""

# KEYS[1] lock, KEYS[2] marker; ARGV owner, ttl_ms. Compare-and-extend.
_EXTEND_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local ttl = tonumber(ARGV[2])
  if redis.call('GET', KEYS[2]) == ARGV[1] then
    ttl = math.max(ttl, redis.call('PTTL', KEYS[2]))
  end
  return redis.call('PEXPIRE', KEYS[1], ttl)
end
return 0
"""

# KEYS[1] lock, KEYS[2] marker; ARGV owner, failed (1/0). Compare-and-delete, or keep the key (owner
# suffixed '#released', so no dead-holder takeover applies) for the remaining lock-at-least-for time while
# the marker is alive (not for a run that failed).
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[2] ~= '1' and redis.call('GET', KEYS[2]) == ARGV[1] then
    local left = redis.call('PTTL', KEYS[2])
    if left > 0 then
      redis.call('SET', KEYS[1], ARGV[1] .. '#released', 'PX', left)
      return 1
    end
  end
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
return 0
"""


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class RedisJobLock:
    """The job lock as a Redis key: SET NX PX, Lua compare-and-extend and compare-and-delete."""

    def __init__(self, redis_url: str, *, key_prefix: str = REDIS_KEY_PREFIX, timeout_s: float = 5.0) -> None:
        # Imported here: only a deployment that sets BATCH_ASSETS_REDIS_URL pays for the client (start-up), and only
        # it needs the `redis` extra.
        with needs_extra(needed_by="the Redis job lock", field=REDIS_URL_VAR):
            import redis
            from redis.backoff import ExponentialWithJitterBackoff
            from redis.retry import Retry

        parsed = redis.connection.parse_url(redis_url)
        self._target = f"{parsed.get('host', 'localhost')}:{parsed.get('port', 6379)}"
        self.key_prefix = key_prefix
        self.client = redis.Redis.from_url(
            redis_url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 2),
            decode_responses=True,
        )
        self._errors = redis.exceptions
        self._acquire = self.client.register_script(_ACQUIRE_LUA)
        self._take_over = self.client.register_script(_TAKE_OVER_DEAD_LUA)
        self._extend = self.client.register_script(_EXTEND_LUA)
        self._release = self.client.register_script(_RELEASE_LUA)

    def _keys(self, name: str) -> list[str]:
        # The hash tag keeps both keys in one slot, so the scripts also work on a cluster.
        key = f"{self.key_prefix}{{{name}}}"
        return [key, f"{key}:min"]

    @contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except (self._errors.ConnectionError, self._errors.TimeoutError) as exc:
            raise LockStoreUnavailable(
                f"lock store Redis at {self._target} is unavailable: {cause_line(exc)}"
            ) from None

    def acquire(self, name: str, owner: str, ttl_s: float, min_s: float = 0) -> bool:
        """Take the lock if the key is absent (SET NX PX) or held by a provably dead process; False otherwise."""
        min_ms = _ms(min_s) if min_s > 0 else 0
        with self._translate():
            if self._acquire(keys=self._keys(name), args=[owner, _ms(ttl_s), min_ms]):
                return True
            holder = self._get(name)
            if holder is None or not provably_dead(holder):
                return False
            taken = bool(self._take_over(keys=self._keys(name), args=[holder, owner, _ms(ttl_s), min_ms]))
        if taken:
            _log_takeover(name, holder, owner)
        return taken

    def extend(self, name: str, owner: str, ttl_s: float) -> bool:
        """PEXPIRE the key only if it still holds `owner`."""
        with self._translate():
            return bool(self._extend(keys=self._keys(name), args=[owner, _ms(ttl_s)]))

    def release(self, name: str, owner: str, *, failed: bool = False) -> bool:
        """DEL the key only if it holds `owner`; before the lock-at-least-for time, PEXPIRE to it instead
        (unless the run `failed`)."""
        with self._translate():
            return bool(self._release(keys=self._keys(name), args=[owner, "1" if failed else "0"]))

    def holder(self, name: str) -> str | None:
        """The owner of a live lock, or None."""
        with self._translate():
            return self._get(name)

    def _get(self, name: str) -> str | None:
        value = self.client.get(self._keys(name)[0])  # decode_responses=True: str or None
        return value if value is None or isinstance(value, str) else bytes(value).decode()

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()


def make_job_lock(engine: sa.Engine, redis_url: str | None) -> JobLock:
    """The Redis lock when a Redis URL is configured, else the PostgreSQL lock table."""
    if redis_url:
        return RedisJobLock(redis_url)
    return PostgresJobLock(engine)
