"""The resident payment worker (CONTRACT §7): one event loop, one database connection, bulk results.

Shape of one worker process:

- **One database loop** owns a psycopg connection. Each round trip writes every result that is
  ready (one fenced `UPDATE … FROM unnest(...)`) and claims the next batch (one `SKIP LOCKED`
  statement), pipelined. Results wait at most `flush_delay_s` for company; a full buffer or a
  stop flushes at once. Nothing holds a transaction while a payment is processed.
- **`concurrency` lanes** (coroutines, not threads) take claimed rows in order and await the
  handler, so 256 calls can be in flight on one thread. A handler with only a synchronous
  `handle` runs on a thread pool of `concurrency` threads.
- **Wake-up.** A second connection LISTENs on the channel the `payments_notify_due` triggers
  notify; an idle worker claims at once. Rows due later are found by a timer on the earliest
  `next_attempt_at` / lapsed lease, or by the poll (at most `poll_interval_s`, ≤ 5 s).
- **Adaptive claim batch** (`AdaptiveBatch`) and the **outage breaker** (`Breaker`).
- **Stop** (event, `max_seconds`, drain): no new claim; rows claimed but not started are given
  back (NEW, attempt undone, due now); calls in flight get `drain_timeout_s` to finish, then are
  cancelled and given back; every result is flushed. Nothing stays claimed.
- **Database outages.** A transient failure (`is_transient`: backend terminated, server restarting,
  connection refused, timeout) of either connection drops it and connects again with backoff
  (0.5 s doubling to 8 s), re-LISTENs and carries on. Handler calls in flight go on meanwhile;
  their results wait in memory (at most batch + concurrency rows, as no claim is made) and are
  written on the new connection. Results and claims whose statement was in flight when the
  connection died are handled on the new one: results are written again (fenced by the claim
  token, so a write that did commit matches nothing the second time), claims committed unseen are
  taken up by their token. The claim/flush connection rides out `db_outage_s` from its first
  failure (within `drain_timeout_s` once stopping); then the worker ends FAILURE.

Several worker processes on one or many hosts need no coordinator: `SKIP LOCKED` shares the
rows and the claim token fences every write. A result lost in a crash (or a crash of the
database: results are committed with `synchronous_commit = off`) only means the payment is
claimed again after its lease and processed again; the Idempotency-Key makes that safe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
import sqlalchemy as sa

from batch_assets.db.engine import is_transient, translate_errors, unavailable
from batch_assets.domains.payments import queue, sql
from batch_assets.domains.payments.handler import (
    AsyncHandler,
    Handler,
    LoopResource,
    Outcome,
    OutcomeKind,
    SyncHandler,
)
from batch_assets.domains.payments.queue import Claim, QueueSettings, Result
from batch_assets.errors import DatabaseUnavailable, error_text

log = logging.getLogger(__name__)

_PROGRESS_EVERY_S = 1.0
_YIELD_EVERY = 64  # instant calls (all lanes together) between yields, so the database loop overlaps them
_CLAIM_WAIT_LIMIT_S = 0.25  # claimed rows waiting longer than this for a lane shrink the batch
_RECONNECT_FIRST_S = 0.5  # backoff between connection attempts after a transient failure ...
_RECONNECT_MAX_S = 8.0  # ... doubling up to this
_CONNECT_TIMEOUT_S = 10
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
BREAKER_CODES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}
"""The breaker state as a number (Dagster plots numeric metadata)."""


@dataclass
class QueueResult:
    """Counters of one worker run."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0  # terminal: FAILED written by this run
    lost_claims: int = 0  # fenced writes that matched 0 rows (another worker owns the row now)
    released: int = 0  # claimed but never called (stop, open breaker): given back, attempt undone
    failed_by_type: Counter[str] = field(default_factory=Counter)
    duration_s: float = 0.0
    dlq_size: int | None = None
    stopped_by: str = ""  # drained | stop | max_seconds | error
    status: str = "SUCCESS"
    breaker: str = CLOSED
    breaker_opened: int = 0  # times the breaker opened in this run
    batch_size: int = 0  # the claim batch at the end of the run
    round_trips: int = 0
    notifications: int = 0
    woken_by: Counter[str] = field(default_factory=Counter)  # notify | timer | poll
    # Rows claimed right after each kind of wake-up: start, notify, timer, poll, reconnect, busy (following the work).
    claimed_after: Counter[str] = field(default_factory=Counter)
    reconnects: int = 0  # connections (claim/flush or LISTEN) re-established after a transient failure

    @property
    def per_s(self) -> float:
        """Payments settled (DONE or FAILED) per second of the run."""
        return (self.done + self.failed) / self.duration_s if self.duration_s > 0 else 0.0

    def to_summary(self, run_id: str) -> dict[str, Any]:
        """The CONTRACT §2 summary: scanned = claimed, changed = done, unchanged = retried, plus extras."""
        return {
            "status": self.status,
            "run_id": run_id,
            "scanned": self.claimed,
            "changed": self.done,
            "unchanged": self.retried,
            "failed": self.failed,
            "failed_by_type": dict(sorted(self.failed_by_type.items())),
            "duration_s": round(self.duration_s, 3),
            "retried": self.retried,
            "lost_claims": self.lost_claims,
            "released": self.released,
            "dlq_size": self.dlq_size,
            "stopped_by": self.stopped_by,
            "per_s": round(self.per_s, 1),
            "breaker": self.breaker,
            "breaker_opened": self.breaker_opened,
            "batch_size": self.batch_size,
            "round_trips": self.round_trips,
            "reconnects": self.reconnects,
        }


class AdaptiveBatch:
    """The claim batch (seed 004, pattern 7): bounded to 1..maximum, every change logged at DEBUG.

    It doubles while claims come back full and the handlers keep up (no claimed row was still
    waiting when the next claim went out); it halves when claimed rows wait too long for a lane,
    and falls to what came back when a claim comes back short (the queue is nearly empty).
    """

    def __init__(self, initial: int, maximum: int, *, wait_limit_s: float = _CLAIM_WAIT_LIMIT_S) -> None:
        self.maximum = max(int(maximum), 1)
        self.size = min(max(int(initial), 1), self.maximum)
        self.wait_limit_s = wait_limit_s

    def after_claim(self, wanted: int, got: int, *, waiting: int, oldest_wait_s: float) -> int:
        """Adapt after a claim of `wanted` that returned `got`, when `waiting` claimed rows had not started."""
        old = self.size
        if got < wanted:
            new = max(1, got, old // 2)
            why = f"claim came back short ({got}/{wanted})"
        elif oldest_wait_s > self.wait_limit_s:
            new = max(1, old // 2)
            why = f"claimed rows waited {oldest_wait_s:.3f}s for a handler"
        elif waiting == 0:
            new = min(self.maximum, old * 2)
            why = "claim came back full and the handlers kept up"
        else:
            new, why = old, ""
        if new != old:
            log.debug("claim batch %d -> %d: %s", old, new, why)
            self.size = new
        return self.size


class Breaker:
    """The outage breaker: transient failures of `failures` distinct payments in a row open it.

    Open: no call is made and claimed rows go back without spending an attempt. After the
    cool-down it is half-open and lets one probe through: an answer closes it, a transient
    failure opens it again with the cool-down doubled (up to `max_cooldown_s`). Distinct
    payments, so one payment that keeps failing on its own does not open it. Every call that was
    made and failed (one that opened it, one in flight when it opened, a probe) spends its attempt
    and is backed off (`_Worker._settle`), so such a payment reaches the DLQ as usual.
    """

    def __init__(
        self, failures: int, cooldown_s: float, max_cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures = failures
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.clock = clock
        self.state = CLOSED
        self.cooldown_s = cooldown_s
        self.opened_at = 0.0
        self.failing: set[Any] = set()
        self.probing = False
        self.changes = 0  # bumped on every state change (the worker records the state)
        self.opened = 0

    def _set(self, state: str) -> None:
        if state != self.state:
            log.warning("payment breaker %s -> %s (cool-down %.0fs)", self.state, state, self.cooldown_s)
            self.state = state
            self.changes += 1

    def remaining_s(self) -> float:
        """Seconds until the next probe (0 unless open)."""
        if self.state != OPEN:
            return 0.0
        return max(0.0, self.opened_at + self.cooldown_s - self.clock())

    def poll(self) -> str:
        """The state now; an open breaker whose cool-down passed becomes half-open."""
        if self.state == OPEN and self.remaining_s() <= 0:
            self.probing = False
            self._set(HALF_OPEN)
        return self.state

    def allow_call(self) -> bool:
        """Whether a claimed row may be called now (half-open: one probe at a time)."""
        state = self.poll()
        if state == CLOSED:
            return True
        if state == HALF_OPEN and not self.probing:
            self.probing = True
            return True
        return False

    def on_answer(self) -> None:
        """The service answered (DONE or a permanent rejection): close, reset the cool-down."""
        self.failing.clear()
        self.probing = False
        self.cooldown_s = self.base_cooldown_s
        self._set(CLOSED)

    def on_transient(self, payment_id: Any) -> None:
        """A transient failure: count it when closed; a failed probe reopens with a longer cool-down."""
        if self.state == HALF_OPEN:
            self.probing = False
            self.cooldown_s = min(self.cooldown_s * 2, self.max_cooldown_s)
            self._open()
        elif self.state == CLOSED:
            self.failing.add(payment_id)
            if len(self.failing) >= self.failures:
                self._open()

    def _open(self) -> None:
        self.opened_at = self.clock()
        self.failing.clear()
        self.opened += 1
        self._set(OPEN)


def worker_name() -> str:
    """host:pid, recorded with the breaker state."""
    return f"{socket.gethostname()}:{os.getpid()}"


def run_worker(
    engine: sa.Engine,
    settings: QueueSettings,
    *,
    handler: Handler,
    stop: threading.Event | None = None,
    max_seconds: float | None = None,
    drain: bool = True,
    progress: Callable[[QueueResult], None] | None = None,
) -> QueueResult:
    """Process due payments until `stop` is set, `max_seconds` pass, or (drain=True) nothing is due.

    drain=False is the resident worker: it waits for notifications, timers and polls until
    stopped. A transient database failure is ridden out for `settings.db_outage_s` (reconnect with
    backoff); past that, or on any other database error, the run stops and the error is raised once
    the calls in flight settled; connection-level errors surface as `DatabaseUnavailable`.
    """
    with translate_errors(engine), engine.connect() as conn:  # reachable, or a one-line error
        conn.exec_driver_sql("SELECT 1")
    worker = _Worker(engine, settings, handler, stop or threading.Event(), max_seconds, drain, progress)
    return asyncio.run(worker.run())


def _no_handle(claim: Claim) -> Outcome:
    # A handler with neither entry point: each call fails like any handler bug (retried, counted).
    raise AttributeError("the payment handler has neither handle_async nor handle")


def _conninfo(engine: sa.Engine) -> str:
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


class _Worker:
    def __init__(
        self,
        engine: sa.Engine,
        settings: QueueSettings,
        handler: Handler,
        stop: threading.Event,
        max_seconds: float | None,
        drain: bool,
        progress: Callable[[QueueResult], None] | None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.handler = handler
        # Chosen once per run in `run`: the awaited entry point, else the one run on `pool`.
        self.handle_async: Callable[[Claim], Awaitable[Outcome]] | None = None
        self.handle_sync: Callable[[Claim], Outcome] = _no_handle
        self.stop = stop
        self.drain = drain
        self.progress = progress
        self.max_seconds = max_seconds
        self.result = QueueResult()
        self.batch = AdaptiveBatch(settings.batch_size, settings.max_batch_size)
        self.breaker = Breaker(settings.breaker_failures, settings.breaker_cooldown_s, settings.breaker_max_cooldown_s)
        self.recorded_changes = -1  # breaker changes already recorded (-1: record the state at start)
        self.name = worker_name()
        self.results: list[tuple[Result, str | None]] = []
        self.first_result_at = 0.0
        self.batches: deque[list[float]] = deque()  # [claimed_at, rows not yet taken] per claim, FIFO
        self.running = 0
        self.since_yield = 0
        self.db_waiting = False
        self.halting = False
        self.notified = False
        self.errors: list[BaseException] = []
        self.pool: ThreadPoolExecutor | None = None
        self.conninfo = _conninfo(engine)
        self.unseen_claims: list[Any] = []  # tokens of claims sent on a connection that died before answering
        self.down: set[str] = set()  # connections lost and not yet back: "claims", "listener", "unverified"
        self.down_since = 0.0
        self.stop_seen_at: float | None = None

    # --- the run -------------------------------------------------------------------------------

    async def run(self) -> QueueResult:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.started = loop.time()
        self.deadline = None if self.max_seconds is None else self.started + self.max_seconds
        self.kick = asyncio.Event()
        self.db_ran = asyncio.Event()
        self.listening = asyncio.Event()
        self.pending: asyncio.Queue[Claim | None] = asyncio.Queue()
        self.last_progress = self.started
        try:
            self.conn = await self._connect(_CONNECT_TIMEOUT_S)
        except psycopg.OperationalError as exc:
            raise unavailable(self.engine.url, exc) from None
        watcher_done = threading.Event()
        watcher = threading.Thread(target=self._watch_stop, args=(watcher_done,), name="payment-stop", daemon=True)
        watcher.start()
        listener = asyncio.create_task(self._listen())
        opened = False
        lanes: list[asyncio.Task[None]] = []
        handler = self.handler
        try:
            if isinstance(handler, LoopResource):
                await handler.open()
            opened = True
            if isinstance(handler, AsyncHandler):
                self.handle_async = handler.handle_async
            else:
                if isinstance(handler, SyncHandler):
                    self.handle_sync = handler.handle
                self.pool = ThreadPoolExecutor(max_workers=self.settings.concurrency, thread_name_prefix="payment")
            lanes = [asyncio.create_task(self._lane()) for _ in range(self.settings.concurrency)]
            # Claim only once the LISTEN is in place, so no insert falls between the first look and it.
            try:
                await asyncio.wait_for(self.listening.wait(), timeout=5)
            except TimeoutError:
                log.warning("payment worker: LISTEN not ready after 5s; relying on the poll")
            # max_seconds counts from here: connecting is not working time (a slow start must not
            # leave a short run nothing to do).
            self.deadline = None if self.max_seconds is None else loop.time() + self.max_seconds
            await self._db_loop()
        except Exception as exc:
            self.errors.append(exc)
            self.result.stopped_by = "error"
        finally:
            await self._shutdown(lanes)
            watcher_done.set()
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            if opened and isinstance(handler, LoopResource):
                await handler.aclose()
            if self.pool is not None:
                self.pool.shutdown(wait=False, cancel_futures=True)
            await self.conn.close()
        result = self.result
        result.duration_s = loop.time() - self.started
        result.breaker = self.breaker.state
        result.breaker_opened = self.breaker.opened
        result.batch_size = self.batch.size
        if self.errors:
            result.status = "FAILURE"
            error = self.errors[0]
            if isinstance(error, psycopg.OperationalError):
                raise unavailable(self.engine.url, error) from None
            raise error
        result.dlq_size = await asyncio.to_thread(queue.dlq_size, self.engine)
        if self.progress is not None:
            self.progress(result)
        return result

    async def _connect(self, timeout_s: float) -> psycopg.AsyncConnection[Any]:
        """The claim/flush connection."""
        return await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, connect_timeout=max(2, int(timeout_s)),
            application_name="batch_assets_worker",
            # A committed result or claim lost in a database crash only means the payment is
            # claimed again after its lease (Idempotency-Key), so commits need not wait for WAL.
            # Generic plans of the prepared claim/result statements cannot see the array sizes
            # and fall back to whole-table joins; custom plans stay on primary-key lookups.
            options="-c synchronous_commit=off -c plan_cache_mode=force_custom_plan",
        )

    def _watch_stop(self, done: threading.Event) -> None:
        # The stop event is a threading.Event (SIGTERM handler, Dagster termination): wake the loop.
        while not done.is_set():
            if self.stop.wait(0.1):
                self.loop.call_soon_threadsafe(self.kick.set)
                return

    def _stop_reason(self) -> str | None:
        if self.errors:
            return "error"
        if self.stop.is_set():
            return "stop"
        if self.deadline is not None and self.loop.time() >= self.deadline:
            return "max_seconds"
        return None

    # --- the database loop ---------------------------------------------------------------------

    async def _db_loop(self) -> None:
        idle = False  # the last claim came back short: wait for a notification, the timer or the poll
        woken = "start"
        next_due_in: float | None = None
        while True:
            now = self.loop.time()
            reason = self._stop_reason()
            if reason is not None and not self.halting:
                self.halting = True
                self.result.stopped_by = reason
                self._give_back_pending()
            flush = bool(self.results) and (
                self.halting
                or len(self.results) >= self.settings.max_batch_size
                or now >= self.first_result_at + self.settings.flush_delay_s
            )
            want = 0 if (self.halting or idle) else self._wanted()
            record = self.breaker.changes != self.recorded_changes
            if flush or want or record:
                self.kick.clear()
                if want:
                    self.notified = False  # a notification during the claim is kept for the next look
                try:
                    claims = await self._round_trip(flush, want, record)
                    if want:
                        self._took(claims, want, woken)
                        woken = "busy"  # later claims follow the work, not a wake-up
                        idle = len(claims) < want
                        if idle:
                            next_due_in = await self._next_due_in()
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    await self._reconnect(exc)
                    # Notifications sent while the connections were away are lost: look at once.
                    idle, woken, next_due_in = False, "reconnect", None
                    self.result.woken_by[woken] += 1
                continue
            held = self.pending.qsize() + self.running
            if self.halting and not self.results:
                return  # the calls in flight get their drain timeout in _shutdown
            if self.drain and idle and held == 0 and not self.results and not self.notified:
                if next_due_in is None or next_due_in > 0:
                    self.result.stopped_by = "drained"
                    return
            timeout = self._timeout(now, idle, next_due_in)
            fired = await self._wait(timeout)
            self._report_progress()
            if idle:
                why = self._wake_reason(fired, next_due_in)
                if why is not None:
                    idle, woken = False, why
                    self.result.woken_by[why] += 1

    def _wake_reason(self, fired: bool, next_due_in: float | None) -> str | None:
        """Why an idle worker looks at the table again after a wait; None: it stays idle."""
        if self.notified:
            return "notify"
        if not fired:  # the wait ran out: the timer on the next due row, or the poll
            return "timer" if next_due_in is not None and next_due_in < self._poll_s() else "poll"
        if self.breaker.poll() != CLOSED and self.breaker.remaining_s() <= 0:
            return "timer"
        return None

    def _poll_s(self) -> float:
        return self.settings.poll_interval_s

    def _timeout(self, now: float, idle: bool, next_due_in: float | None) -> float:
        waits = [_PROGRESS_EVERY_S]
        if self.results:
            waits.append(self.first_result_at + self.settings.flush_delay_s - now)
        if idle:
            waits.append(self._poll_s())
            if next_due_in is not None:
                # A due row another claim holds: look again soon, not in a hot loop.
                waits.append(max(next_due_in, 0.01))
        if self.breaker.state == OPEN:
            waits.append(self.breaker.remaining_s())
        if self.deadline is not None:
            waits.append(self.deadline - now)
        return max(0.0, min(waits))

    async def _wait(self, timeout: float) -> bool:
        """Wait for a kick (result, free lane, notification, stop) or `timeout`; True when kicked."""
        try:
            if self.kick.is_set():
                self.kick.clear()  # the loop looks at everything again after any wait
                await asyncio.sleep(0)
                return True
            if timeout <= 0:
                await asyncio.sleep(0)
                return False
            self.db_waiting = True
            try:
                async with asyncio.timeout(timeout):
                    await self.kick.wait()
            except TimeoutError:
                return False
            self.kick.clear()
            return True
        finally:
            self.db_waiting = False
            self.db_ran.set()

    def _wanted(self) -> int:
        """How many rows to claim now: 0 while the breaker is open, 1 probe when half-open."""
        state = self.breaker.poll()
        held = self.pending.qsize() + self.running
        if state == OPEN:
            return 0
        if state == HALF_OPEN:
            return 1 if held == 0 and not self.breaker.probing else 0
        size = self.batch.size
        if self.pending.qsize() > size // 2:
            return 0  # enough claimed rows wait for a lane
        room = size + self.settings.concurrency - held
        return min(size, room) if room > 0 else 0

    async def _round_trip(self, flush: bool, want: int, record: bool) -> list[Claim]:
        """One pipelined round trip: write the ready results, record the breaker, claim `want` rows."""
        sent: list[tuple[Result, str | None]] = []
        if flush:
            cut = self.settings.max_batch_size
            sent, self.results = self.results[:cut], self.results[cut:]
            if self.results:
                self.first_result_at = self.loop.time()
        token = queue.new_token() if want else None
        state_changes = self.breaker.changes
        state = {
            "queue": queue.QUEUE_NAME, "breaker": self.breaker.state, "failures": len(self.breaker.failing),
            "cooldown_s": None if self.breaker.state == CLOSED else self.breaker.cooldown_s, "worker": self.name,
        }
        conn = self.conn
        written: list[Any] = []
        rows: list[Any] = []
        try:
            async with conn.pipeline():
                wcur = (
                    await conn.execute(sql.WRITE_RESULTS, queue.results_params([r for r, _ in sent]), binary=True)
                    if sent else None
                )
                if record:
                    await conn.execute(sql.RECORD_STATE, state)
                claim_params = {"n": want, "lease_s": float(self.settings.claim_lease_s), "token": token}
                ccur = await conn.execute(sql.CLAIM, claim_params, binary=True) if want else None
                if wcur is not None:
                    written = await wcur.fetchall()
                if ccur is not None:
                    rows = await ccur.fetchall()
        except BaseException:
            # Whether the statements committed is unknown. The results go back to be written again
            # (fenced: one that did commit matches nothing the second time, counted as a lost claim);
            # the claim's token is kept so rows it may have claimed are taken up on the next connection.
            if sent:
                self.results[:0] = sent
                self.first_result_at = 0.0  # overdue: flush first thing
            if token is not None:
                self.unseen_claims.append(token)
            raise
        self.result.round_trips += 1
        if "unverified" in self.down:
            self.down.discard("unverified")  # the claim/flush connection survived the outage
            self._outage_over()
        if record:
            self.recorded_changes = state_changes
        if sent:
            self._tally(sent, written)
        return queue.claims_from_rows(rows, token)  # type: ignore[arg-type]

    def _tally(self, sent: list[tuple[Result, str | None]], written: Iterable[Any]) -> None:
        result = self.result
        matched = 0
        for ordinal, in written:
            matched += 1
            res, error_type = sent[ordinal - 1]
            if res.status == "DONE":
                result.done += 1
            elif res.status == "FAILED":
                result.failed += 1
                result.failed_by_type[error_type or "unknown"] += 1
            elif res.undo:
                result.released += 1
            else:
                result.retried += 1
        result.lost_claims += len(sent) - matched

    def _took(self, claims: list[Claim], wanted: int, woken: str) -> None:
        now = self.loop.time()
        waiting = self.pending.qsize()
        oldest_wait = now - self.batches[0][0] if self.batches else 0.0
        self.result.claimed += len(claims)
        self.result.claimed_after[woken] += len(claims)
        if claims:
            self.batches.append([now, len(claims)])
            for claim in claims:
                self.pending.put_nowait(claim)
        if self.breaker.state == CLOSED:
            self.result.batch_size = self.batch.after_claim(wanted, len(claims), waiting=waiting,
                                                            oldest_wait_s=oldest_wait)

    async def _next_due_in(self) -> float | None:
        cur = await self.conn.execute(sql.NEXT_DUE_IN)
        row = await cur.fetchone()
        self.result.round_trips += 1
        return None if row is None or row[0] is None else float(row[0])

    def _report_progress(self) -> None:
        if self.progress is None:
            return
        now = self.loop.time()
        if now - self.last_progress >= _PROGRESS_EVERY_S:
            self.last_progress = now
            self.result.duration_s = now - self.started
            self.result.breaker = self.breaker.state
            self.progress(self.result)

    # --- the lanes -----------------------------------------------------------------------------

    async def _lane(self) -> None:
        while True:
            claim = await self.pending.get()
            if claim is None:
                return
            self._taken_one()
            if self.halting:
                self._give_back(claim, 0.0)
                continue
            refusal = self._refusal(claim)
            if refusal is not None:
                # No call: nothing the service said, so the breaker neither counts nor resets on it.
                self._add(Result(claim, "FAILED", error=refusal.error), refusal.error_type)
                continue
            if not self.breaker.allow_call():
                self._give_back(claim, self.breaker.remaining_s())
                continue
            self.running += 1
            try:
                outcome = await self._call(claim)
            except asyncio.CancelledError:
                self._give_back(claim, 0.0)  # the drain timeout passed: processed again later (same key)
                raise
            finally:
                self.running -= 1
            self._settle(claim, outcome)
            # Calls that never suspend (a no-op plug-in) would otherwise run a whole batch before
            # the database loop gets a turn; counted over all lanes, so it gets one every 64.
            if self.db_waiting and self.kick.is_set():
                # The database loop has work (flush, claim) but the other lanes' wake-ups are
                # queued ahead of its own: hold until it has had its turn.
                self.db_ran.clear()
                await self.db_ran.wait()
            else:
                self.since_yield += 1
                if self.since_yield >= _YIELD_EVERY:
                    self.since_yield = 0
                    await asyncio.sleep(0)

    def _taken_one(self) -> None:
        if self.batches:
            self.batches[0][1] -= 1
            if self.batches[0][1] <= 0:
                self.batches.popleft()
        if self.pending.qsize() <= self.batch.size // 2:
            self.kick.set()  # room for the next claim

    def _refusal(self, claim: Claim) -> Outcome | None:
        """A claimed row that is FAILED without a call (its own data), or None: it gets its call.

        - `max_attempts_exceeded`: only a claim of ours that lapsed (`Claim.lapsed`: a worker died or
          hung mid-call) past max_attempts. A NEW row, or a PROCESSING row another service wrote,
          always gets its call whatever its attempts (see `queue.outcome_status`).
        - `invalid_amount`: amount_cents outside 1..MAX_AMOUNT_CENTS (zero, negative, or too large to
          be exact in JSON): not a payment the limits service can be asked about.
        """
        settings = self.settings
        if claim.lapsed and claim.attempts > settings.max_attempts:
            return Outcome.permanent(
                "max_attempts_exceeded",
                f"claim lapsed repeatedly; attempt {claim.attempts} > max {settings.max_attempts}",
            )
        if not 1 <= claim.amount_cents <= queue.MAX_AMOUNT_CENTS:
            return Outcome.permanent(
                "invalid_amount", f"amount_cents {claim.amount_cents} outside 1..{queue.MAX_AMOUNT_CENTS}"
            )
        return None

    async def _call(self, claim: Claim) -> Outcome:
        settings = self.settings
        try:
            # One second over the handler's own timeout: a plug-in that hangs must not hold its lane.
            async with asyncio.timeout(settings.http_timeout_s + 1):
                if self.handle_async is not None:
                    return await self.handle_async(claim)
                return await self.loop.run_in_executor(self.pool, self.handle_sync, claim)
        except TimeoutError:
            return Outcome.retry("timeout", f"handler took longer than {settings.http_timeout_s + 1:g}s")
        except Exception as exc:  # a handler bug must not strand the row until its lease lapses
            return Outcome.retry("handler_error", f"handler raised {type(exc).__name__}")

    def _settle(self, claim: Claim, outcome: Outcome) -> None:
        """The result of a call that was made (CONTRACT §7 v3).

        A transient failure always spends its attempt and is backed off (FAILED at max attempts),
        whatever the breaker: only claims whose call was not made are given back (`_give_back`). So
        a payment that always fails on its own reaches FAILED after max_attempts calls, outage or
        not; an outage costs each payment the one call it got before the breaker opened (or as its
        probe), since an open breaker makes no call. While the breaker is open the backoff is at
        least the rest of the cool-down.
        """
        if outcome.kind is OutcomeKind.DONE:
            self.breaker.on_answer()
            self._add(Result(claim, "DONE"), None)
        elif outcome.kind is OutcomeKind.PERMANENT:
            self.breaker.on_answer()
            self._add(Result(claim, "FAILED", error=outcome.error or ""), outcome.error_type or "unknown")
        else:
            self.breaker.on_transient(claim.id)
            planned = queue.outcome_status(claim, self.settings, permanent=False)
            delay_s = max(planned.delay_s, self.breaker.remaining_s())
            self._add(Result(claim, planned.status, delay_s=delay_s, error=outcome.error or ""),
                      outcome.error_type or "unknown")

    def _give_back(self, claim: Claim, delay_s: float) -> None:
        self._add(Result(claim, "NEW", undo=1, delay_s=delay_s), None)

    def _add(self, result: Result, error_type: str | None) -> None:
        if result.error is not None:
            # Clipped before it waits in the buffer: a handler's huge error text must not pile up
            # max_batch_size times in memory (the buffer is bounded in bytes as well as rows).
            result = dataclasses.replace(result, error=queue.clip(result.error))
        if not self.results:
            self.first_result_at = self.loop.time()
        self.results.append((result, error_type))
        if len(self.results) == 1 or len(self.results) >= self.settings.max_batch_size:
            self.kick.set()

    def _give_back_pending(self) -> None:
        while True:
            try:
                claim = self.pending.get_nowait()
            except asyncio.QueueEmpty:
                return
            if claim is not None:
                self._taken_one()
                self._give_back(claim, 0.0)

    # --- stopping ------------------------------------------------------------------------------

    async def _shutdown(self, lanes: list[asyncio.Task[None]]) -> None:
        self.halting = True
        self._give_back_pending()
        for _ in lanes:
            self.pending.put_nowait(None)
        if lanes:
            _, late = await asyncio.wait(lanes, timeout=self.settings.drain_timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
        # Write every result (and the final breaker state), riding out a short outage as the loop
        # does. After an error, or once the outage bound passed, the leases bring the rows back, so
        # a failure here is reported, not retried.
        try:
            while self.results or self.breaker.changes != self.recorded_changes:
                try:
                    await self._round_trip(bool(self.results), 0, self.breaker.changes != self.recorded_changes)
                except Exception as exc:
                    if self.errors or not is_transient(exc):
                        raise
                    await self._reconnect(exc)
        except Exception as exc:
            if not self.errors:
                self.errors.append(exc)
                self.result.stopped_by = "error"

    # --- database outages -----------------------------------------------------------------------

    def _lost(self, which: str, exc: BaseException) -> None:
        """A connection failed transiently: one WARNING per outage (both connections usually fail together)."""
        if not self.down:
            self.down_since = self.loop.time()
            # error_text is the driver's first line (e.g. "terminating connection due to administrator
            # command"); the conninfo, and so the password, is never part of it.
            log.warning("payment worker: database connection lost (%s); reconnecting for up to %gs",
                        error_text(exc), self.settings.db_outage_s)
            if which == "listener":
                # An idle claim/flush connection learns of the outage only at its next statement,
                # maybe after the listener is back: the outage lasts until that statement worked.
                self.down.add("unverified")
        self.down.add(which)

    def _back(self, which: str) -> None:
        self.result.reconnects += 1
        self.down.discard(which)
        if which == "claims":
            self.down.discard("unverified")
        self._outage_over()

    def _outage_over(self) -> None:
        if not self.down:
            log.info("payment worker: database connections back after %.1fs", self.loop.time() - self.down_since)

    async def _reconnect(self, exc: BaseException) -> None:
        """Drop the claim/flush connection and connect again with backoff, or raise `DatabaseUnavailable`.

        Bounded by `db_outage_s` from this connection's failure and, once the worker is stopping,
        by `drain_timeout_s` from the stop, so SIGTERM during an outage still ends promptly.
        """
        self._lost("claims", exc)
        await self.conn.close()
        started = self.loop.time()
        delay, attempts, last = _RECONNECT_FIRST_S, 0, exc
        while True:
            now = self.loop.time()
            deadline = started + self.settings.db_outage_s
            if self.stop.is_set():
                if self.stop_seen_at is None:
                    self.stop_seen_at = now
                deadline = min(deadline, self.stop_seen_at + self.settings.drain_timeout_s)
            # Jitter, so several workers cut off together do not knock on the server in step.
            pause = delay * random.uniform(0.8, 1.2)
            if now + pause >= deadline:
                raise DatabaseUnavailable(
                    f"{unavailable(self.engine.url, last)} (gave up after {now - started:.1f}s and {attempts} "
                    f"reconnect attempts; db_outage_s {self.settings.db_outage_s:g})"
                )
            await asyncio.sleep(pause)
            delay = min(delay * 2, _RECONNECT_MAX_S)
            attempts += 1
            try:
                self.conn = await self._connect(min(_CONNECT_TIMEOUT_S, deadline - self.loop.time()))
                await self._take_up_unseen_claims()
            except Exception as retry_exc:
                if not is_transient(retry_exc):
                    raise
                last = retry_exc
                if not self.conn.closed:
                    await self.conn.close()
                continue
            self._back("claims")
            return

    async def _take_up_unseen_claims(self) -> None:
        """Rows claimed by a statement whose answer was lost: process them (or give them back when stopping)."""
        while self.unseen_claims:
            token = self.unseen_claims[0]
            cur = await self.conn.execute(sql.CLAIMED_BY_TOKEN, {"token": token}, binary=True)
            rows = await cur.fetchall()
            self.unseen_claims.pop(0)
            claims = queue.claims_from_rows(rows, token)
            if not claims:
                continue
            log.info("payment worker: took up %d payment(s) claimed before the connection was lost", len(claims))
            self.result.claimed += len(claims)
            if self.halting:
                for claim in claims:
                    self._give_back(claim, 0.0)
            else:
                self.batches.append([self.loop.time(), len(claims)])
                for claim in claims:
                    self.pending.put_nowait(claim)

    # --- notifications -------------------------------------------------------------------------

    async def _listen(self) -> None:
        """LISTEN on its own connection; after a transient failure reconnect with backoff (the poll covers the gap)."""
        delay = _RECONNECT_FIRST_S
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.conninfo, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S,
                    application_name="batch_assets_listener",
                )
                async with conn:
                    await conn.execute(sql.LISTEN_DUE)
                    delay = _RECONNECT_FIRST_S
                    if "listener" in self.down:
                        self._back("listener")
                        # Inserts while nobody listened sent their notification to no one: look now.
                        self.notified = True
                        self.kick.set()
                    self.listening.set()
                    async for _ in conn.notifies():
                        self.result.notifications += 1
                        self.notified = True
                        self.kick.set()
            except Exception as exc:
                self.listening.set()  # the first claim need not wait: the poll covers the gap
                if not is_transient(exc):
                    log.warning("payment worker: LISTEN failed (%s); polling only", error_text(exc))
                    return
                self._lost("listener", exc)
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, _RECONNECT_MAX_S)
