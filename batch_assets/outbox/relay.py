"""The outbox relay: PENDING events → a sink → SENT, in batches, at least once, never inside a transaction.

Shape of one batch, and why:

1. **Claim** (one short autocommit statement): the oldest PENDING events that nobody holds a live
   claim on are locked with `FOR UPDATE SKIP LOCKED` (two relays never wait for each other) and
   stamped with this relay's owner and a claim lease (`claimed_until`). The transaction ends there.
2. **Send** outside any transaction, bounded by the sink's timeout: a sink that is down or hangs
   never holds a database session idle in transaction, and never holds a row lock.
3. **Mark SENT**, fenced by the claim: only rows still claimed by this owner become SENT. A relay
   that stalled past its lease and lost the rows to another relay marks nothing of theirs.

A crash between 2 and 3 leaves the rows PENDING; they are claimed again once the lease passes and
sent again: delivery is at least once, and every message carries the event id as its idempotency
key (`idempotency_key`), so a consumer drops the duplicate. A failed send gives the claim back at
once, so the next pass retries the batch.

`follow_outbox` keeps relaying: it drains, then waits for the `batch_assets_outbox` notification
(sent by a statement trigger on every insert into outbox_events) or a poll
interval, so an event is relayed well under a second after its page commits. Sink failures back
off exponentially and never end the follow loop; a stop event does.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Self

import sqlalchemy as sa
from pydantic import Field, model_validator
from sqlalchemy.pool import PoolProxiedConnection

from batch_assets.db.engine import driver_connection
from batch_assets.errors import ConfigError
from batch_assets.outbox import sql
from batch_assets.outbox.sinks import Sink, SinkNotConfirmed
from batch_assets.settings_model import SettingsModel

log = logging.getLogger(__name__)

MAX_BATCH = 10_000
DEFAULT_BATCH_BYTES = 8 * 1024 * 1024
"""A batch's payload budget: 8 MiB (an age_category_changed event stores ~100 bytes, so only hostile or
unusually large payloads ever cut a batch short of batch_size)."""
MIN_BATCH_BYTES = 1024
MAX_BATCH_BYTES = 1024 * 1024 * 1024
NOTIFY_CHANNEL = "batch_assets_outbox"
MAX_RELAY_SECONDS = 3600.0
"""Upper bound of every relay duration knob (s)."""
MAX_FOLLOW_SECONDS = 7 * 86_400.0
"""Upper bound of follow_seconds: a week."""

class OutboxEvent(NamedTuple):
    """A claimed event, immutable. A named tuple, not a dataclass: the relay builds one per event claimed, and a
    frozen dataclass's __init__ (one object.__setattr__ per field) cost three times as much CPU per event."""

    id: int
    aggregate_id: str
    event_type: str
    payload_json: str
    """The stored payload as JSON text, exactly as PostgreSQL renders the jsonb (decoded only on demand)."""
    created_at: datetime

    @property
    def payload(self) -> dict[str, Any]:
        decoded: dict[str, Any] = json.loads(self.payload_json)
        return decoded

    def to_message(self) -> dict[str, Any]:
        """The message sent to the sink; `idempotency_key` (the event id) lets a consumer drop a resend."""
        return {
            "id": self.id,
            "idempotency_key": str(self.id),
            "aggregate_id": self.aggregate_id,
            "event_type": self.event_type,
            "payload": self.payload,
            "created_at": self.created_at.isoformat(),
        }


class RelaySettings(SettingsModel):
    """Knobs of the relay: bounds, defaults and the cross-field rule in one place (validated when built)."""

    batch_size: int = Field(default=500, ge=1, le=MAX_BATCH, description="Events per batch.")
    batch_bytes: int = Field(
        default=DEFAULT_BATCH_BYTES, ge=MIN_BATCH_BYTES, le=MAX_BATCH_BYTES,
        description="Payload bytes per batch (stored size): a batch holds at most this much, or its first event.")
    claim_lease_s: float = Field(default=60.0, gt=0, le=MAX_RELAY_SECONDS,
                                 description="Claim lease of a batch (s); another relay may take it after.")
    send_timeout_s: float = Field(default=10.0, gt=0, le=MAX_RELAY_SECONDS,
                                  description="Timeout of one send to the sink (s), below claim_lease_s.")
    poll_s: float = Field(default=5.0, gt=0, le=MAX_RELAY_SECONDS,
                          description="Follow mode: longest wait without a notification (s).")
    backoff_s: float = Field(default=0.5, gt=0, le=MAX_RELAY_SECONDS,
                             description="Follow mode: first wait after a failure (s), doubled up to backoff_max_s.")
    backoff_max_s: float = Field(default=30.0, gt=0, le=MAX_RELAY_SECONDS,
                                 description="Follow mode: longest wait after failures (s).")

    @model_validator(mode="after")
    def _send_within_lease(self) -> Self:
        if self.send_timeout_s >= self.claim_lease_s:
            raise ConfigError("must be shorter than claim_lease_s", field="send_timeout_s")
        return self


class OutboxRelayJobSettings(RelaySettings):
    """The relay job's settings (`outbox relay`, the launchpad): one pass or follow, on top of the relay's knobs."""

    follow: bool = Field(
        default=False,
        description="Keep relaying, woken by a PostgreSQL notification on every new event, until stopped "
        "(or follow_seconds pass). Default false: one pass until nothing is pending.",
    )
    follow_seconds: float | None = Field(
        default=None, gt=0, le=MAX_FOLLOW_SECONDS,
        description="With follow: stop after this many seconds. Default: until stopped.",
    )


@dataclass(frozen=True)
class RelayResult:
    sent: int
    batches: int
    duration_s: float
    error: str | None = None
    """Type of the sink or database error that stopped the relay; its batch stays PENDING."""
    failures: int = 0
    """Sends that failed (follow mode goes on after each one)."""
    last_id: int = 0
    """The highest event id this pass claimed and sent (where follow mode's next pass may start); 0 for none."""

    @property
    def ok(self) -> bool:
        return self.error is None


def _autocommit(engine: sa.Engine) -> sa.Engine:
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
def _claiming(engine: sa.Engine) -> Iterator[sa.Connection]:
    """The connection a relay pass claims on: autocommit (each claim its own statement, never idle in a
    transaction), its plan pinned to the ordered walk of outbox_events_pending_idx (sql.PIN_CLAIM_PLAN).

    Unpinned, right after a sweep inserted its events (no statistics yet) the planner took a bitmap scan of
    every PENDING row plus a sort for each claim (measured: 34 ms per claim of 500 with 25k pending), so a
    drain's cost grew with the square of its backlog. Reset before the connection goes back to the pool."""
    with _autocommit(engine).connect() as conn:
        conn.exec_driver_sql(sql.PIN_CLAIM_PLAN)
        try:
            yield conn
        finally:
            try:
                conn.exec_driver_sql(sql.UNPIN_CLAIM_PLAN)
            except sa.exc.DBAPIError:  # a broken connection is not put back pinned
                conn.invalidate()


def _claim(conn: sa.Connection, owner: str, settings: RelaySettings, after: int = 0) -> ClaimedBatch:
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


def _release(engine: sa.Engine, ids: list[int], owner: str) -> None:
    try:
        with _autocommit(engine).connect() as conn:
            conn.execute(sql.RELEASE_CLAIM, {"ids": ids, "owner": owner})
    except sa.exc.DBAPIError as exc:  # the claim lease expires on its own
        log.warning("outbox relay: claim not released (%s); it expires with its lease", type(exc).__name__)


def _mark_sent(db: sa.Engine | sa.Connection, ids: list[int], owner: str) -> int:
    """Mark `ids` SENT (fenced by the claim) in one statement: on `db`'s connection, or one from its pool."""
    if isinstance(db, sa.Engine):
        with _autocommit(db).connect() as conn:
            return _mark_sent(conn, ids, owner)
    literal = "{" + ",".join(map(str, ids)) + "}"  # one text parameter, not 500 adapted ints
    with driver_connection(db.connection).cursor() as cur:  # the driver's cursor, as the claim
        cur.execute(sql.MARK_SENT_DRIVER, {"ids": literal, "owner": owner})
        row = cur.fetchone()
    return int(row[0]) if row else 0


@contextmanager
def _marking(engine: sa.Engine) -> Iterator[sa.Connection]:
    """The autocommit connection a relay pass marks its batches SENT on, one batch after the other.

    Held for the pass, like the claiming connection: a checkout per batch cost a pre-ping, the autocommit switch
    and the reset on return, three round trips around the one statement (measured: 4 us of relay CPU per event,
    more than the statement itself). A connection the driver found broken is not put back in the pool."""
    with _autocommit(engine).connect() as conn:
        try:
            yield conn
        finally:
            if conn.connection.driver_connection is None or driver_connection(conn.connection).broken:
                conn.invalidate()


def relay_batch(engine: sa.Engine, *, sink: Sink, owner: str, settings: RelaySettings) -> tuple[int, int]:
    """Claim, send and mark one batch: (claimed, marked SENT). Raises the sink's or the database's error.

    Only events the sink confirmed are marked SENT: on SinkNotConfirmed the confirmed part is marked and
    the rest released; on any other failure the whole batch is released (it stays PENDING)."""
    with _claiming(engine) as conn:
        events = _claim(conn, owner, settings).events
    return send_claimed(engine, events, sink=sink, owner=owner)


def send_claimed(engine: sa.Engine, events: list[OutboxEvent], *, sink: Sink, owner: str) -> tuple[int, int]:
    """Send and mark a claimed batch (see relay_batch)."""
    if not events:
        return 0, 0
    return len(events), _mark_confirmed(engine, _send(engine, events, sink, owner), owner)


def _send(engine: sa.Engine, events: list[OutboxEvent], sink: Sink, owner: str) -> list[int]:
    """Send a claimed batch; the ids to mark SENT (all of them), or raise having marked the confirmed part
    and released the rest."""
    ids = [e.id for e in events]
    try:
        sink.send_batch(events)  # no transaction is open here
    except SinkNotConfirmed as exc:  # what the sink did confirm is SENT; the rest goes back to PENDING
        confirmed = [i for i in ids if i in exc.confirmed]
        if confirmed:
            _mark_sent(engine, confirmed, owner)
        _release(engine, [i for i in ids if i not in exc.confirmed], owner)
        raise
    except BaseException:
        _release(engine, ids, owner)
        raise
    return ids


def _mark_confirmed(db: sa.Engine | sa.Connection, ids: list[int], owner: str) -> int:
    marked = _mark_sent(db, ids, owner)
    if marked < len(ids):
        log.warning("outbox relay: %d of %d events were claimed by another relay meanwhile (sent again)",
                    len(ids) - marked, len(ids))
    return marked


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


def relay_outbox(
    engine: sa.Engine,
    *,
    sink: Sink,
    batch_size: int = 500,
    owner: str = "relay",
    settings: RelaySettings | None = None,
    stop: threading.Event | None = None,
    start_after: int = 0,
    free_dead: bool = True,
) -> RelayResult:
    """Send every PENDING event (in id order, in batches) and mark it SENT; stops at the first failure.

    `start_after`: claim only ids above it (follow mode's passes between two rescans, see follow_outbox);
    `free_dead`: first release the claims of relays whose process is gone (follow mode does it once a rescan)."""
    settings = settings or RelaySettings(batch_size=batch_size)
    started = time.monotonic()
    sent = batches = 0
    last_id = start_after
    if free_dead:
        free_dead_claims(engine)
    error: str | None = None
    # While a full batch is with the sink, the next one is claimed, and the previous one marked SENT, on
    # other connections (each its own autocommit statement): the database's work overlaps the broker's
    # instead of adding to it. A batch is marked SENT only after the sink confirmed it, as before.
    # `marks` is used by one mark at a time (each is awaited before the next is submitted); a failed send's
    # confirmed part is marked on a connection of its own (_send), since the previous mark may still be running.
    with _claiming(engine) as claims, _marking(engine) as marks, \
            ThreadPoolExecutor(max_workers=2, thread_name_prefix="outbox-db") as pool:
        ahead: Future[ClaimedBatch] | None = None
        marking: Future[int] | None = None
        try:
            while stop is None or not stop.is_set():
                try:
                    # One claim at a time on `claims`: the next is submitted only once this one is taken.
                    batch = ahead.result() if ahead is not None else _claim(claims, owner, settings, start_after)
                    events, ahead = batch.events, None
                    if batch.more:
                        ahead = pool.submit(_claim, claims, owner, settings, batch.last_id)
                    ids = _send(engine, events, sink, owner) if events else []
                    if marking is not None:
                        sent, marking = sent + marking.result(), None
                    if ids:
                        marking = pool.submit(_mark_confirmed, marks, ids, owner)
                except Exception as exc:  # the sink's or the database's; the caller gets it in the result
                    error = type(exc).__name__
                    break
                if not events:
                    break
                batches += 1
                last_id = max(last_id, batch.last_id)
                if not batch.more:
                    break
        finally:
            if ahead is not None:
                _release_ahead(engine, ahead, owner)
            if marking is not None:
                try:
                    sent += marking.result()
                except Exception as exc:  # the batch stays claimed until its lease passes, then is sent again
                    error = error or type(exc).__name__
    if error is not None:
        log.warning("outbox relay: batch failed (%s); it stays PENDING", error)
        return RelayResult(sent, batches, time.monotonic() - started, error=error, failures=1)
    return RelayResult(sent, batches, time.monotonic() - started, last_id=last_id)


def _release_ahead(engine: sa.Engine, ahead: Future[ClaimedBatch], owner: str) -> None:
    """Give back a batch claimed ahead and never sent (a failure or a stop came first)."""
    try:
        events = ahead.result().events
    except Exception as exc:  # noqa: BLE001 - the claim itself failed: nothing was claimed
        log.warning("outbox relay: the claim ahead failed (%s); nothing to give back", type(exc).__name__)
        return
    if events:
        _release(engine, [e.id for e in events], owner)


def follow_outbox(
    engine: sa.Engine,
    *,
    sink: Sink,
    owner: str,
    settings: RelaySettings,
    stop: threading.Event,
    alive: Callable[[], bool] = lambda: True,
    on_pass: Callable[[RelayResult], None] | None = None,
) -> RelayResult:
    """Relay until `stop` is set (or `alive()` turns False): drain, then wait for a notification or poll_s.

    Sink failures never end the loop: the batch goes back to PENDING and the loop backs off.

    A pass woken by a notification claims from where the previous pass ended (`start_after`): the sent events'
    index entries stay behind it, dead until VACUUM, and a pass starting at the first id walks them all (measured:
    0.8 s for its first claim after 100k sent; a sweep notifies once per page). Every poll_s, and after any
    failure, a pass starts at the first id again (a rescan): it picks up an event whose id is below the mark but
    whose transaction committed late, and it frees dead relays' claims.
    """
    started = time.monotonic()
    sent = batches = failures = 0
    backoff = settings.backoff_s
    after, rescan_at = 0, time.monotonic() + settings.poll_s
    with _Listener(engine) as listener:
        while not stop.is_set() and alive():
            rescan = after == 0 or time.monotonic() >= rescan_at
            if rescan:
                after, rescan_at = 0, time.monotonic() + settings.poll_s
            result = relay_outbox(engine, sink=sink, owner=owner, settings=settings, stop=stop, start_after=after,
                                  free_dead=rescan)
            sent += result.sent
            batches += result.batches
            if on_pass is not None:
                on_pass(result)
            if result.error:
                failures += 1
                after = 0
                stop.wait(backoff)
                backoff = min(backoff * 2, settings.backoff_max_s)
                continue
            after = result.last_id
            backoff = settings.backoff_s
            listener.wait(settings.poll_s, stop)
    # Send failures are retried, not fatal: they are counted, and the backlog check reports what is left.
    return RelayResult(sent, batches, time.monotonic() - started, failures=failures)


class _Listener:
    """A dedicated autocommit connection LISTENing on NOTIFY_CHANNEL (no transaction stays open)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self._raw: PoolProxiedConnection | None = None

    def __enter__(self) -> _Listener:
        self._connect()
        return self

    def _connect(self) -> None:
        try:
            raw = self.engine.raw_connection()
            driver = driver_connection(raw)
            driver.autocommit = True
            driver.execute(f"LISTEN {NOTIFY_CHANNEL}")  # a constant identifier, never input
            self._raw = raw
        except Exception as exc:  # noqa: BLE001 - without LISTEN the loop still polls every poll_s
            log.warning("outbox relay: LISTEN unavailable (%s); polling", type(exc).__name__)
            self._raw = None

    def wait(self, timeout_s: float, stop: threading.Event) -> None:
        """Return on a notification, after timeout_s, or soon after `stop` is set."""
        if self._raw is None:
            stop.wait(timeout_s)
            self._connect()
            return
        deadline = time.monotonic() + timeout_s
        try:
            # Short slices, so a stop request is seen within half a second.
            while not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for _ in driver_connection(self._raw).notifies(timeout=min(left, 0.5), stop_after=1):
                    return
        except Exception as exc:  # noqa: BLE001 - connection lost: reconnect on the next wait
            log.warning("outbox relay: notification connection lost (%s)", type(exc).__name__)
            self._close()

    def _close(self) -> None:
        if self._raw is not None:
            try:
                self._raw.invalidate()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self._raw = None

    def __exit__(self, *exc: object) -> None:
        # Closed rather than returned to the pool: it is in autocommit mode and LISTENing.
        self._close()


def backlog(engine: sa.Engine) -> tuple[int, float]:
    """(pending events, age in seconds of the oldest pending one)."""
    with engine.connect() as conn:
        row = conn.execute(sql.BACKLOG).one()
    return int(row.pending), float(row.oldest_pending_s)
