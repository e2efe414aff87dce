"""The resident queue worker: the claim loop (producer) with its adaptive batch, around the other parts.

Shape of one worker process:

- **The claim loop** owns the claim/flush connection (`connection.Link`). Each round trip writes
  every result that is ready (`completer`: one fenced `UPDATE … FROM unnest(...)`), records the
  breaker when it changed, and claims the next batch (one `SKIP LOCKED` statement), pipelined.
  Nothing holds a transaction while a row is processed.
- **The lanes** (`executor`) call the handler; **the notifier** LISTENs, so an idle worker claims at
  once. Rows due later are found by a timer on the earliest `next_attempt_at` / lapsed lease, or by
  the poll (at most `poll_interval_s`, ≤ 5 s).
- **Adaptive claim batch** (`batch.AdaptiveBatch`) and the **outage breaker** (`breaker.Breaker`).
- **Stop** (event, `max_seconds`, drain): no new claim; rows claimed but not started are given back
  (NEW, attempt undone, due now); calls in flight get `drain_timeout_s` to finish, then are cancelled
  and given back; every result is flushed. Nothing stays claimed.
- **Database outages** (`connection`): handler calls in flight go on; their results wait in memory
  (at most two batches + concurrency rows, as no claim is made) and are written on the new connection.
  Claims whose statement was in flight when the connection died are taken up by their token.

Several worker processes on one or many hosts need no coordinator: `SKIP LOCKED` shares the rows and
the claim token fences every write. A result lost in a crash (results are committed with
`synchronous_commit = off`) only means the row is claimed again after its lease and processed again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import sqlalchemy as sa

from batch_assets.db.engine import is_transient, translate_errors, unavailable
from batch_assets.queue.batch import AdaptiveBatch
from batch_assets.queue.breaker import CLOSED, HALF_OPEN, OPEN, Breaker
from batch_assets.queue.claims import Claim, new_token
from batch_assets.queue.completer import Completer, Pending
from batch_assets.queue.connection import Link
from batch_assets.queue.executor import Executor, Refusal
from batch_assets.queue.handler import Handler, LoopResource
from batch_assets.queue.limits.gate import CallGate
from batch_assets.queue.notifier import Notifier
from batch_assets.queue.result import QueueResult
from batch_assets.queue.settings import QueueSettings
from batch_assets.queue.signals import Signals
from batch_assets.queue.store import QueueStore

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 1.0


def worker_name() -> str:
    """host:pid, recorded with the breaker state."""
    return f"{socket.gethostname()}:{os.getpid()}"


def run_worker(
    engine: sa.Engine,
    store: QueueStore,
    settings: QueueSettings,
    *,
    handler: Handler,
    stop: threading.Event | None = None,
    max_seconds: float | None = None,
    drain: bool = True,
    progress: Callable[[QueueResult], None] | None = None,
    refuse: Refusal | None = None,
) -> QueueResult:
    """Process due rows of `store`'s queue until `stop` is set, `max_seconds` pass, or (drain=True) nothing is due.

    drain=False is the resident worker: it waits for notifications, timers and polls until stopped.
    A transient database failure is ridden out for `settings.db_outage_s` (reconnect with backoff);
    past that, or on any other database error, the run stops and the error is raised once the calls
    in flight settled; connection-level errors surface as `DatabaseUnavailable`.
    """
    with translate_errors(engine), engine.connect() as conn:  # reachable, or a one-line error
        conn.exec_driver_sql("SELECT 1")
    worker = Worker(engine, store, settings, handler, stop or threading.Event(), max_seconds, drain, progress, refuse)
    return asyncio.run(worker.run())


class Worker:
    def __init__(self, engine: sa.Engine, store: QueueStore, settings: QueueSettings, handler: Handler,
                 stop: threading.Event, max_seconds: float | None, drain: bool,
                 progress: Callable[[QueueResult], None] | None, refuse: Refusal | None) -> None:
        self.engine, self.store, self.settings, self.handler = engine, store, settings, handler
        self.stop, self.max_seconds, self.drain, self.progress, self.refuse = stop, max_seconds, drain, progress, refuse
        self.result = QueueResult()
        self.batch = AdaptiveBatch(settings.batch_size, settings.max_batch_size)
        self.breaker = Breaker(settings.breaker_failures, settings.breaker_cooldown_s, settings.breaker_max_cooldown_s,
                               label=store.name)
        self.recorded_changes = -1  # breaker changes already recorded (-1: record the state at start)
        self.name = worker_name()
        self.errors: list[BaseException] = []
        self.unseen_claims: list[Any] = []  # tokens of claims sent on a connection that died before answering
        self.link = Link(engine, settings, stop, self.result, label=store.name)

    # --- the run -------------------------------------------------------------------------------

    async def run(self) -> QueueResult:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.started = loop.time()
        self.deadline: float | None = None
        self.signals = Signals()
        self.completer = Completer(max_rows=self.settings.max_batch_size, delay_s=self.settings.flush_delay_s,
                                   signals=self.signals, result=self.result, clock=loop.time)
        self.gate = CallGate(self.link.conninfo, self.store, self.settings)
        self.executor = Executor(self.settings, self.handler, signals=self.signals, completer=self.completer,
                                 breaker=self.breaker, batch=self.batch, refuse=self.refuse, gate=self.gate)
        self.notifier = Notifier(self.link, self.store.sql.listen, self.signals, self.result)
        self.last_progress = self.started
        try:
            await self.link.connect()
        except psycopg.OperationalError as exc:
            self.executor.close()
            raise unavailable(self.engine.url, exc) from None
        watcher_done = threading.Event()
        watcher = threading.Thread(target=self._watch_stop, args=(watcher_done,), name="queue-stop", daemon=True)
        watcher.start()
        listener = asyncio.create_task(self.notifier.run())
        opened = False
        handler = self.handler
        try:
            if isinstance(handler, LoopResource):
                await handler.open()
            opened = True
            self.executor.start()
            # Claim only once the LISTEN is in place, so no insert falls between the first look and it.
            try:
                await asyncio.wait_for(self.notifier.listening.wait(), timeout=5)
            except TimeoutError:
                log.warning("%s worker: LISTEN not ready after 5s; relying on the poll", self.store.name)
            # max_seconds counts from here: connecting is not working time.
            self.deadline = None if self.max_seconds is None else loop.time() + self.max_seconds
            await self._claim_loop()
        except Exception as exc:
            self.errors.append(exc)
            self.result.stopped_by = "error"
        finally:
            await self._shutdown()
            await self.gate.aclose()
            watcher_done.set()
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            if opened and isinstance(handler, LoopResource):
                await handler.aclose()
            self.executor.close()
            await self.link.conn.close()
        return await self._finish()

    async def _finish(self) -> QueueResult:
        result = self.result
        result.duration_s = self.loop.time() - self.started
        result.breaker = self.breaker.state
        result.breaker_opened = self.breaker.opened
        result.batch_size = self.batch.size
        if self.errors:
            result.status = "FAILURE"
            error = self.errors[0]
            if isinstance(error, psycopg.OperationalError):
                raise unavailable(self.engine.url, error) from None
            raise error
        result.dlq_size = await asyncio.to_thread(self.store.dlq_size, self.engine)
        if self.progress is not None:
            self.progress(result)
        return result

    def _watch_stop(self, done: threading.Event) -> None:
        # The stop event is a threading.Event (SIGTERM handler, Dagster termination): wake the loop.
        while not done.is_set():
            if self.stop.wait(0.1):
                self.loop.call_soon_threadsafe(self.signals.kick.set)
                return

    def _stop_reason(self) -> str | None:
        if self.executor.failures and not self.errors:
            self.errors.append(self.executor.failures[0])  # the call gate's database error
        if self.errors:
            return "error"
        if self.stop.is_set():
            return "stop"
        if self.deadline is not None and self.loop.time() >= self.deadline:
            return "max_seconds"
        return None

    # --- the claim loop ------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        signals, completer, executor = self.signals, self.completer, self.executor
        idle = False  # the last claim came back short: wait for a notification, the timer or the poll
        woken = "start"
        next_due_in: float | None = None
        while True:
            now = self.loop.time()
            reason = self._stop_reason()
            if reason is not None and not signals.halting:
                signals.halting = True
                self.result.stopped_by = reason
                executor.give_back_pending()
            flush = completer.due(now, halting=signals.halting)
            want = 0 if (signals.halting or idle) else self._wanted()
            record = self.breaker.changes != self.recorded_changes
            if flush or want or record:
                signals.kick.clear()
                if want:
                    signals.notified = False  # a notification during the claim is kept for the next look
                try:
                    claims = await self._round_trip(flush, want, record)
                    if want:
                        self._took(claims, want, woken)
                        woken = "busy"  # later claims follow the work, not a wake-up
                        idle = len(claims) < want
                        if idle:
                            next_due_in = await self.store.anext_due_in(self.link.conn)
                            self.result.round_trips += 1
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    await self.link.reconnect(exc, self._take_up_unseen_claims)
                    # Notifications sent while the connections were away are lost: look at once.
                    idle, woken, next_due_in = False, "reconnect", None
                    self.result.woken_by[woken] += 1
                continue
            if signals.halting and not completer:
                return  # the calls in flight get their drain timeout in _shutdown
            if self.drain and idle and executor.held == 0 and not completer and not signals.notified:
                if next_due_in is None or next_due_in > 0:
                    self.result.stopped_by = "drained"
                    return
            fired = await self.signals.wait(self._timeout(now, idle, next_due_in))
            self._report_progress()
            if idle:
                why = self._wake_reason(fired, next_due_in)
                if why is not None:
                    idle, woken = False, why
                    self.result.woken_by[why] += 1

    def _wake_reason(self, fired: bool, next_due_in: float | None) -> str | None:
        """Why an idle worker looks at the table again after a wait; None: it stays idle."""
        if self.signals.notified:
            return "notify"
        if not fired:  # the wait ran out: the timer on the next due row, or the poll
            return "timer" if next_due_in is not None and next_due_in < self.settings.poll_interval_s else "poll"
        if self.breaker.poll() != CLOSED and self.breaker.remaining_s() <= 0:
            return "timer"
        return None

    def _timeout(self, now: float, idle: bool, next_due_in: float | None) -> float:
        waits = [PROGRESS_EVERY_S]
        flush_in = self.completer.wait_s(now)
        if flush_in is not None:
            waits.append(flush_in)
        if idle:
            waits.append(self.settings.poll_interval_s)
            if next_due_in is not None:
                # A due row another claim holds: look again soon, not in a hot loop.
                waits.append(max(next_due_in, 0.01))
        if self.breaker.state == OPEN:
            waits.append(self.breaker.remaining_s())
        if self.deadline is not None:
            waits.append(self.deadline - now)
        return max(0.0, min(waits))

    def _wanted(self) -> int:
        """How many rows to claim now: 0 while the breaker is open, 1 probe when half-open."""
        state = self.breaker.poll()
        executor = self.executor
        held = executor.held
        if state == OPEN:
            return 0
        if state == HALF_OPEN:
            return 1 if held == 0 and not self.breaker.probing else 0
        size = self.batch.size
        if executor.pending.qsize() > size:
            return 0  # a whole batch still waits for a lane
        # Up to two batches ahead of the lanes: the next claim is on its way while the lanes work
        # through the last one, so they do not wait a round trip per batch, and a result flush goes
        # out with a claim rather than alone ahead of it. A claim of less than half a batch waits.
        room = 2 * size + self.settings.concurrency - held
        return min(size, room) if room >= max(size // 2, 1) else 0

    async def _round_trip(self, flush: bool, want: int, record: bool) -> list[Claim]:
        """One pipelined round trip: write the ready results, record the breaker, claim `want` rows."""
        sent: list[Pending] = self.completer.take() if flush else []
        token = new_token() if want else None
        state_changes = self.breaker.changes
        breaker = self.breaker
        state = {"breaker": breaker.state, "failures": len(breaker.failing),
                 "cooldown_s": None if breaker.state == CLOSED else breaker.cooldown_s, "worker": self.name}
        conn, store = self.link.conn, self.store
        written: list[Any] = []
        rows: list[Claim] = []
        try:
            async with conn.pipeline():
                wcur = await store.send_write(conn, [r for r, _ in sent]) if sent else None
                if record:
                    await store.send_state(conn, state)
                rate = self.gate.rate
                slots = rate.claim_slots() if rate is not None else None  # rate slots for the rows (limit not binding)
                ccur = await store.send_claim(conn, want, self.settings.claim_lease_s, token, slots) if token else None
                if wcur is not None:
                    written = await wcur.fetchall()
                if ccur is not None and token is not None:
                    claimed = await ccur.fetchall()
                    rows = store.claims(claimed, token)
                    if slots is not None and rate is not None and claimed:
                        rate.granted(claimed[0][-2], claimed[0][-1])
        except BaseException:
            # Whether the statements committed is unknown. The results go back to be written again
            # (fenced); the claim's token is kept so rows it may have claimed are taken up next connection.
            self.completer.put_back(sent)
            if token is not None:
                self.unseen_claims.append(token)
            raise
        self.result.round_trips += 1
        self.link.verified()
        if record:
            self.recorded_changes = state_changes
        if sent:
            self.completer.tally(sent, written)
        return rows

    def _took(self, claims: list[Claim], wanted: int, woken: str) -> None:
        now = self.loop.time()
        waiting = self.executor.pending.qsize()
        oldest_wait = self.executor.oldest_wait_s(now)
        self.result.claimed += len(claims)
        self.result.claimed_after[woken] += len(claims)
        self.executor.take(claims, now)
        if self.breaker.state == CLOSED:
            self.result.batch_size = self.batch.after_claim(wanted, len(claims), waiting=waiting,
                                                            oldest_wait_s=oldest_wait)

    async def _take_up_unseen_claims(self) -> None:
        """Rows claimed by a statement whose answer was lost: process them (or give them back when stopping)."""
        while self.unseen_claims:
            token = self.unseen_claims[0]
            claims = await self.store.claimed_by_token(self.link.conn, token)
            self.unseen_claims.pop(0)
            if not claims:
                continue
            log.info("%s worker: took up %d row(s) claimed before the connection was lost",
                     self.store.name, len(claims))
            self.result.claimed += len(claims)
            if self.signals.halting:
                for claim in claims:
                    self.executor.give_back(claim, 0.0)
            else:
                self.executor.take(claims, self.loop.time())

    def _report_progress(self) -> None:
        if self.progress is None:
            return
        now = self.loop.time()
        if now - self.last_progress >= PROGRESS_EVERY_S:
            self.last_progress = now
            self.result.duration_s = now - self.started
            self.result.breaker = self.breaker.state
            self.progress(self.result)

    # --- stopping ------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        self.signals.halting = True
        await self.executor.stop(self.settings.drain_timeout_s)
        # Write every result (and the final breaker state), riding out a short outage as the loop
        # does. After an error, or once the outage bound passed, the leases bring the rows back, so
        # a failure here is reported, not retried.
        try:
            while self.completer or self.breaker.changes != self.recorded_changes:
                try:
                    await self._round_trip(bool(self.completer), 0, self.breaker.changes != self.recorded_changes)
                except Exception as exc:
                    if self.errors or not is_transient(exc):
                        raise
                    await self.link.reconnect(exc, self._take_up_unseen_claims)
        except Exception as exc:
            if not self.errors:
                self.errors.append(exc)
                self.result.stopped_by = "error"
