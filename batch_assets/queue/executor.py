"""The executor: `concurrency` lanes (coroutines, not threads) take claimed rows in order and await the handler.

So 256 calls can be in flight on one thread; a handler with only a synchronous `handle` runs on a
thread pool of `concurrency` daemon threads. Each lane refuses a row that cannot be called (`refusal`),
asks the breaker, calls with a timeout (`call_timeout_s`), and settles the outcome into the completer
(`settle`): DONE, FAILED, or NEW after the backoff. A row that is not called (stop, open breaker) is given
back (NEW, attempt undone). A call past its timeout, or still running when a stop's drain ends, is left to
its thread (a Python thread cannot be killed): its result is read by no one, and the thread never keeps the
process from exiting.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar, cast

from batch_assets.queue.batch import AdaptiveBatch
from batch_assets.queue.breaker import Breaker
from batch_assets.queue.claims import Claim, Result, planned_result
from batch_assets.queue.completer import Completer
from batch_assets.queue.handler import AsyncHandler, Handler, Outcome, OutcomeKind, SyncHandler
from batch_assets.queue.limits.gate import CallGate
from batch_assets.queue.settings import QueueSettings
from batch_assets.queue.signals import Signals
from batch_assets.shutdown import DaemonThreadPool

T = TypeVar("T")

YIELD_EVERY = 64  # instant calls (all lanes together) between yields, so the claim loop overlaps them

Refusal = Callable[[Claim], Outcome | None]
"""A queue's own rule for a row FAILED without a call (its data), e.g. the payments' amount bounds."""


class _Resumed:
    """Awaits the rest of a coroutine that already ran up to its first wait (`step`, what it yielded).

    What `await` does after a coroutine's first step: every later wake-up (`send`) and every exception
    thrown into the awaiting task (a timeout's or a stop's cancellation) is passed on to it, so a call
    that waits behaves as if it had been awaited from its start. A call that never waits (a no-op
    plug-in) thus returns from its first step without a timer being armed and cancelled for it.
    """

    __slots__ = ("call", "step")

    def __init__(self, call: Coroutine[Any, Any, Outcome], step: Any) -> None:
        self.call, self.step = call, step

    def __await__(self) -> Generator[Any, None, Outcome]:
        call, step = self.call, self.step
        while True:
            try:
                yield step
            except BaseException as exc:  # thrown into the awaiting task: the coroutine's to handle
                try:
                    step = call.throw(exc)
                except StopIteration as finished:
                    return cast(Outcome, finished.value)
            else:
                try:
                    step = call.send(None)
                except StopIteration as finished:
                    return cast(Outcome, finished.value)


async def call_in_pool(pool: DaemonThreadPool, function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` on `pool`, awaited; when the wait is cancelled (a timeout, a stop's drain that ended) the
    call is left to its thread (`DaemonThreadPool.abandon`), which a new one replaces for the calls behind it."""
    future = pool.submit(function, *args)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        pool.abandon(future)
        raise


def _no_handle(claim: Claim) -> Outcome:
    # A handler with neither entry point: each call fails like any handler bug (retried, counted).
    raise AttributeError("the handler has neither handle_async nor handle")


class Executor:
    def __init__(self, settings: QueueSettings, handler: Handler, *, signals: Signals, completer: Completer,
                 breaker: Breaker, batch: AdaptiveBatch, refuse: Refusal | None = None,
                 gate: CallGate | None = None) -> None:
        self.settings = settings
        self.gate = gate  # the shared limits and the claim renewal (gate.py)
        self.gated: set[asyncio.Task[None] | None] = set()  # lanes waiting for an in-flight or rate slot
        self.failures: list[BaseException] = []  # errors of the gate that are not transient (side.py retries those)
        self.signals = signals
        self.completer = completer
        self.breaker = breaker
        self.batch = batch
        self.refuse = refuse
        self.pending: asyncio.Queue[Claim | None] = asyncio.Queue()
        if gate is not None:
            completer.holdings = gate.holdings  # a claim is renewed from take() until the completer wrote it
            if gate.rate is not None:
                gate.rate.backlog = self.pending.qsize  # rate slots are asked for by the rows held, not per call
        self.batches: deque[list[float]] = deque()  # [claimed_at, rows not yet taken] per claim, FIFO
        self.running = 0
        self.since_yield = 0
        self.pool: DaemonThreadPool | None = None
        # Chosen once per run: the awaited entry point, else the one run on `pool`.
        self.handle_async: Callable[[Claim], Coroutine[Any, Any, Outcome]] | None = None
        self.handle_sync: Callable[[Claim], Outcome] = _no_handle
        if isinstance(handler, AsyncHandler):
            self.handle_async = handler.handle_async
        else:
            if isinstance(handler, SyncHandler):
                self.handle_sync = handler.handle
            self.pool = DaemonThreadPool(settings.concurrency, "queue")
        self.lanes: list[asyncio.Task[None]] = []
        # One second over the handler's own timeout unless the queue bounds its calls itself.
        self.timeout_s = settings.call_timeout_s if settings.call_timeout_s is not None else settings.http_timeout_s + 1

    @property
    def held(self) -> int:
        """Claimed rows not settled yet: waiting for a lane or in a call."""
        return self.pending.qsize() + self.running

    def start(self) -> None:
        if self.gate is not None:
            self.gate.start()
        self.lanes = [asyncio.create_task(self._lane()) for _ in range(self.settings.concurrency)]

    def take(self, claims: list[Claim], now: float) -> None:
        """Queue claimed rows for the lanes (in claim order)."""
        if claims:
            if self.gate is not None:
                self.gate.holdings.hold(claims)  # renewed until their result is written
            self.batches.append([now, len(claims)])
            for claim in claims:
                self.pending.put_nowait(claim)

    def oldest_wait_s(self, now: float) -> float:
        return now - self.batches[0][0] if self.batches else 0.0

    async def _lane(self) -> None:
        # The attributes each row needs, looked up once per lane (the lane is the hot path: one turn per row).
        signals, pending, breaker, completer = self.signals, self.pending, self.breaker, self.completer
        limited = self.gate is not None and self.gate.limited
        call = self.call if limited else self._timed_call  # no limit: one coroutine frame less per call
        while True:
            claim = await pending.get()
            if claim is None:
                return
            self._taken_one()
            if signals.halting:
                self.give_back(claim, 0.0)
                continue
            refusal = self.refusal(claim)
            if refusal is not None:
                # No call: nothing the service said, so the breaker neither counts nor resets on it.
                completer.add(Result(claim, "FAILED", error=refusal.error), refusal.error_type)
                continue
            if not breaker.allow_call():
                self.give_back(claim, breaker.remaining_s())
                continue
            self.running += 1
            try:
                outcome = await call(claim)
            except asyncio.CancelledError:
                self.give_back(claim, 0.0)  # the drain timeout passed: processed again later
                raise
            except Exception as exc:  # the gate's statements failed for good (the call errors are Outcomes)
                self.give_back(claim, 0.0)
                self.failures.append(exc)  # the worker stops with it, as for any other database error
                signals.kick.set()
                return
            finally:
                self.running -= 1
            self.settle(claim, outcome)
            # Calls that never suspend (a no-op plug-in) would otherwise run a whole batch before
            # the claim loop gets a turn; counted over all lanes, so it gets one every 64.
            if signals.db_waiting and signals.kick.is_set():
                # The claim loop has work (flush, claim) but the other lanes' wake-ups are
                # queued ahead of its own: hold until it has had its turn.
                signals.db_ran.clear()
                await signals.db_ran.wait()
            else:
                self.since_yield += 1
                if self.since_yield >= YIELD_EVERY:
                    self.since_yield = 0
                    await asyncio.sleep(0)

    def _taken_one(self) -> None:
        if self.batches:
            self.batches[0][1] -= 1
            if self.batches[0][1] <= 0:
                self.batches.popleft()
        if self.pending.qsize() <= self.batch.size:
            self.signals.kick.set()  # room for the next claim (worker._wanted)

    def refusal(self, claim: Claim) -> Outcome | None:
        """A claimed row that is FAILED without a call, or None: it gets its call.

        `max_attempts_exceeded`: only a claim of ours that lapsed (`Claim.lapsed`: a worker died or
        hung mid-call) past max_attempts. A NEW row, or a PROCESSING row another service wrote,
        always gets its call whatever its attempts (see `claims.planned_result`). Then the queue's own rule.
        """
        settings = self.settings
        if claim.lapsed and claim.attempts > settings.max_attempts:
            return Outcome.permanent(
                "max_attempts_exceeded",
                f"claim lapsed repeatedly; attempt {claim.attempts} > max {settings.max_attempts}",
            )
        return self.refuse(claim) if self.refuse is not None else None

    async def call(self, claim: Claim) -> Outcome:
        """The handler call, once the gate (in-flight slot, rate slot) let it through: waiting is not calling."""
        gate = self.gate
        if gate is None or not gate.limited or gate.enter_now():  # no limit, or a rate slot due now: no wait
            return await self._timed_call(claim)
        lane = asyncio.current_task()
        self.gated.add(lane)  # waiting at the gate: a stop cancels it at once (the row goes back, never called)
        try:
            slot = await gate.enter()
        finally:
            self.gated.discard(lane)
        try:
            return await self._timed_call(claim)
        finally:
            gate.leave(slot)

    async def _timed_call(self, claim: Claim) -> Outcome:
        timeout_s = self.timeout_s
        try:
            # One second over the handler's own timeout: a plug-in that hangs must not hold its lane.
            if self.handle_async is not None:
                call = self.handle_async(claim)
                try:
                    step = call.send(None)  # run up to its first wait, as awaiting it would
                except StopIteration as finished:
                    return cast(Outcome, finished.value)  # it never waited: nothing to time out
                # It waits (I/O): the rest of the call runs under the timeout, a timer only for such calls.
                async with asyncio.timeout(timeout_s):
                    return await _Resumed(call, step)
            async with asyncio.timeout(timeout_s):
                assert self.pool is not None
                return await call_in_pool(self.pool, self.handle_sync, claim)
        except TimeoutError:
            return Outcome.retry("timeout", f"handler took longer than {timeout_s:g}s")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 — a handler bug (SystemExit too) must not strand the row or the worker
            return Outcome.retry("handler_error", f"handler raised {type(exc).__name__}")

    def settle(self, claim: Claim, outcome: Outcome) -> None:
        """The result of a call that was made (docs/guide/payment-queue.md).

        A transient failure always spends its attempt and is backed off (FAILED at max attempts),
        whatever the breaker: only claims whose call was not made are given back (`give_back`). So
        a row that always fails on its own reaches FAILED after max_attempts calls, outage or not; an
        outage costs each row the one call it got before the breaker opened (or as its probe), since
        an open breaker makes no call. While the breaker is open the backoff is at least the rest of
        the cool-down.
        """
        if outcome.kind is OutcomeKind.DONE:
            self.breaker.on_answer()
            self.completer.add(Result(claim, "DONE"), None)
        elif outcome.kind is OutcomeKind.PERMANENT:
            self.breaker.on_answer()
            self.completer.add(Result(claim, "FAILED", error=outcome.error or ""), outcome.error_type or "unknown")
        else:
            self.breaker.on_transient(claim.id)
            planned = planned_result(claim, self.settings, permanent=False, delay_s=outcome.delay_s)
            delay_s = max(planned.delay_s, self.breaker.remaining_s())
            self.completer.add(Result(claim, planned.status, delay_s=delay_s, error=outcome.error or ""),
                               outcome.error_type or "unknown")

    def give_back(self, claim: Claim, delay_s: float) -> None:
        self.completer.add(Result(claim, "NEW", undo=1, delay_s=delay_s), None)

    def give_back_pending(self) -> None:
        while True:
            try:
                claim = self.pending.get_nowait()
            except asyncio.QueueEmpty:
                return
            if claim is not None:
                self._taken_one()
                self.give_back(claim, 0.0)

    async def stop(self, drain_timeout_s: float) -> None:
        """No lane takes a new row; calls in flight get `drain_timeout_s`, then are cancelled (and given back)."""
        self.give_back_pending()
        for _ in self.lanes:
            self.pending.put_nowait(None)
        for lane in list(self.gated):
            if lane is not None:
                lane.cancel()  # not called yet: given back now rather than called after the stop
        if self.lanes:
            _, late = await asyncio.wait(self.lanes, timeout=drain_timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*self.lanes, return_exceptions=True)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
