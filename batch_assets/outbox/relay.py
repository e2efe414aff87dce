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

The statements live in `claims`, the notification listener in `listener`, the knobs in `settings`; this
module runs a pass and the follow loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import sqlalchemy as sa

from batch_assets.outbox import sql
from batch_assets.outbox.claims import (
    ClaimedBatch,
    claim,
    claiming_connection,
    free_dead_claims,
    mark_sent,
    marking_connection,
    release,
)
from batch_assets.outbox.event import OutboxEvent
from batch_assets.outbox.listener import Listener
from batch_assets.outbox.settings import RelaySettings
from batch_assets.outbox.sinks.base import Sink, SinkNotConfirmed

log = logging.getLogger(__name__)


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


def relay_batch(engine: sa.Engine, *, sink: Sink, owner: str, settings: RelaySettings) -> tuple[int, int]:
    """Claim, send and mark one batch: (claimed, marked SENT). Raises the sink's or the database's error.

    Only events the sink confirmed are marked SENT: on SinkNotConfirmed the confirmed part is marked and
    the rest released; on any other failure the whole batch is released (it stays PENDING)."""
    with claiming_connection(engine) as conn:
        events = claim(conn, owner, settings).events
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
            mark_sent(engine, confirmed, owner)
        release(engine, [i for i in ids if i not in exc.confirmed], owner)
        raise
    except BaseException:
        release(engine, ids, owner)
        raise
    return ids


def _mark_confirmed(db: sa.Engine | sa.Connection, ids: list[int], owner: str) -> int:
    marked = mark_sent(db, ids, owner)
    if marked < len(ids):
        log.warning("outbox relay: %d of %d events were claimed by another relay meanwhile (sent again)",
                    len(ids) - marked, len(ids))
    return marked


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
    with claiming_connection(engine) as claims, marking_connection(engine) as marks, \
            ThreadPoolExecutor(max_workers=2, thread_name_prefix="outbox-db") as pool:
        ahead: Future[ClaimedBatch] | None = None
        marking: Future[int] | None = None
        try:
            while stop is None or not stop.is_set():
                try:
                    # One claim at a time on `claims`: the next is submitted only once this one is taken.
                    batch = ahead.result() if ahead is not None else claim(claims, owner, settings, start_after)
                    events, ahead = batch.events, None
                    if batch.more:
                        ahead = pool.submit(claim, claims, owner, settings, batch.last_id)
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
        release(engine, [e.id for e in events], owner)


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
    with Listener(engine) as listener:
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


def backlog(engine: sa.Engine) -> tuple[int, float]:
    """(pending events, age in seconds of the oldest pending one)."""
    with engine.connect() as conn:
        row = conn.execute(sql.BACKLOG).one()
    return int(row.pending), float(row.oldest_pending_s)
