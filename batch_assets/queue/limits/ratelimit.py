"""`rate_limit_per_s`: handler calls per second of one queue, held across every worker process on every host.

The limit lives in PostgreSQL (db/migrations): one row per queue with the next free call slot, as
the generic cell rate algorithm keeps its theoretical arrival time. `ba_rate_take` reserves, in one
statement, a run of slots 1/rate apart starting at max(next slot, now) and moves the next slot past
them; a worker calls at those times. So two calls of a queue are never closer than 1/rate whichever
workers make them, over any window the calls number at most rate x window + 1, and an idle queue
saves up no burst. Slots are handed out at most `horizon_s` ahead of now, so one worker cannot
reserve a long stretch the others then wait behind.

In a worker, slots come in runs, not per call. While the limit does not bind (no run started more
than `STALE_S` after now, and no request was refused, within the horizon), the claim that takes
rows also takes a slot for each of them in the same statement (`Statements.claim_with_slots`, at
most a tenth of a second of the rate, `PREFETCH_S`), so such a limit costs no round trip of its own.
Each lane then takes a slot that is due without waiting (`take_now`: no coroutine, no statement), else it awaits
`acquire()`, which asks on the side connection for as many slots as lanes wait and rows wait for a
lane (`backlog`), as far as this worker can use them before they go stale at its recent pace, at
most a tenth of a second of the rate and at least a tenth of a second's worth (at most one per
lane); the next run goes out when half of the last one is used (read ahead). When none fit within
the horizon the server answers when they will, and the worker sleeps until then (no spinning). A
slot no lane took within `STALE_S` of its time is dropped, not used late, so late calls never bunch
up: over any window of w seconds the calls number at most
rate x (w + STALE_S) + 1. Times are the server's (`clock_timestamp()`), so the hosts' clocks need
not agree.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batch_assets.errors import ConfigError
from batch_assets.queue.side import SideConnection

MAX_RATE_PER_S = 100_000.0
"""Upper bound of rate_limit_per_s (above it, asking the database per slot run costs more than the limit saves)."""
PREFETCH_S = 0.1
"""A statement reserves at least this much of the rate (at most one slot per lane)."""
STALE_S = 0.05
"""A reserved slot is used at most this long after its time, else dropped."""
EARLY_S = 0.001
"""A call this close to its slot starts at once: a timer per call would cost more than the 0.1% it can add."""
HORIZON_S = 1.0
"""Slots are reserved at most this far ahead (2 slots when the rate is below 2/s): a worker that stops wastes
at most this much of the rate."""

# RATE_TAKE — reserve up to %(want)s call slots of %(queue)s (at least %(min)s of them, or none).
#   %(queue)s text · %(want)s int · %(min)s int · %(rate)s float8 (calls/s) · %(horizon_s)s float8
# Returns granted (int) and first_in_s (float8): seconds from now until the first granted slot, the
# others 1/rate apart; with granted 0, seconds until %(min)s slots fit (see ba_rate_take in db/migrations).
RATE_TAKE = "SELECT granted, first_in_s FROM ba_rate_take(%(queue)s, %(want)s, %(min)s, %(rate)s, %(horizon_s)s)"


def check_rate(value: object, field: str = "rate_limit_per_s") -> float:
    """A rate in calls/s: a finite number within 0 < rate <= MAX_RATE_PER_S; ConfigError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"must be a number of calls per second, got {value!r}", field=field)
    if not 0 < value <= MAX_RATE_PER_S:
        raise ConfigError(f"must be > 0 and <= {MAX_RATE_PER_S:g}, got {value!r}", field=field)
    return float(value)


@dataclass
class RateStats:
    """What the limiter did: slots granted, statements run, and the time lanes waited for their slot."""

    granted: int = 0
    statements: int = 0
    refused: int = 0  # statements that granted nothing (the horizon was full)
    dropped: int = 0  # slots no lane took within STALE_S of their time
    waited_s: float = 0.0


class RateLimiter:
    """Call slots of queue `queue` at `rate_per_s` across all workers; `await acquire()` before each call."""

    def __init__(
        self, side: SideConnection, queue: str, rate_per_s: float, *, lanes: int = 1, horizon_s: float | None = None
    ) -> None:
        self.side = side
        self.queue = queue
        self.rate = check_rate(rate_per_s)
        self.interval_s = 1.0 / self.rate
        self.horizon_s = horizon_s if horizon_s is not None else max(HORIZON_S, 2 * self.interval_s)
        # Ask for at least a quarter of the horizon at once (or what the lanes want), so workers that
        # share the limit do not each fetch one slot per statement.
        self.min_grant = max(1, math.floor(self.horizon_s * self.rate / 4))
        self.prefetch = max(1, min(int(lanes), math.floor(self.rate * PREFETCH_S)))
        self.most = max(self.prefetch, math.floor(self.rate * PREFETCH_S))  # slots asked for at most per statement
        self.backlog: Callable[[], int] = lambda: 0  # rows claimed, not yet at the gate (the executor's queue)
        self.slots: deque[float] = deque()  # event-loop times of granted slots, in order
        self.waiting = 0
        self.low = max(self.prefetch // 2, 1)  # read ahead below this many slots (half of the last run)
        self.used = 0  # slots taken by calls
        self.paced_at: tuple[float, int] | None = None  # (time, used) at the last statement: the pace since
        self.bound_until = 0.0  # claims take no slots before this time (claim_slots): the limit binds
        self.stats = RateStats()
        self._taking = asyncio.Lock()
        self._refill: asyncio.Task[None] | None = None

    def claim_slots(self) -> dict[str, Any] | None:
        """The parameters of a claim that takes call slots for its rows (`Statements.claim_with_slots`): as many
        as rows claimed, at most a tenth of a second of the rate, none past the horizon; `granted` adds them.

        None while the limit binds (within `horizon_s` of a run that started more than STALE_S after now, or
        of a request none fitted): claimed rows then wait behind others for their turn, and a slot taken
        with them would go stale unused, a loss of the shared rate; the lanes ask as they come (`acquire`)."""
        if asyncio.get_running_loop().time() < self.bound_until:
            return None
        return {"queue": self.queue, "most": self.most, "rate": self.rate, "horizon_s": self.horizon_s}

    def granted(self, granted: int, first_in_s: float) -> None:
        """Slots a claim reserved: `granted` of them from `first_in_s` after now, 1/rate apart."""
        if granted > 0:
            self._add(int(granted), float(first_in_s))

    def _add(self, granted: int, first_in_s: float) -> None:
        now = asyncio.get_running_loop().time()
        if first_in_s > STALE_S:
            # The queue's next free slot was further ahead than a slot may be late: rows claimed now would
            # wait for their slots, the limit binds. (A run of a few ms ahead is only another worker's
            # claim being called: a limit far above the pace of the calls still sees those.)
            self.bound_until = now + self.horizon_s
        first = now + max(first_in_s, 0.0)
        slots = self.slots
        if slots and slots[-1] > first:
            # A run that starts before slots already held (the lock order of two statements): kept in time order.
            merged = sorted([*slots, *(first + i * self.interval_s for i in range(granted))])
            slots.clear()
            slots.extend(merged)
        else:
            slots.extend(first + i * self.interval_s for i in range(granted))
        self.stats.granted += granted

    def take_now(self) -> bool:
        """Take a slot that is due now (within EARLY_S) without waiting; False: `await acquire()` instead."""
        if self.waiting:
            return False  # lanes already waiting go first
        slots = self.slots
        now = asyncio.get_running_loop().time()
        while slots and slots[0] < now - STALE_S:
            slots.popleft()  # nobody took it in time: a late call could bunch with the next ones
            self.stats.dropped += 1
        if not slots or slots[0] - now > EARLY_S:
            return False
        slots.popleft()
        self.used += 1
        self._read_ahead()
        return True

    def _read_ahead(self) -> None:
        if (len(self.slots) < self.low and not self._taking.locked()
                and (self._refill is None or self._refill.done())):
            # The next run of slots is on its way before the lanes run out of them.
            self._refill = asyncio.get_running_loop().create_task(self._take_locked())

    async def acquire(self) -> None:
        """Wait for this worker's next call slot (a database round trip when it holds none)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.waiting += 1
        try:
            while True:
                while self.slots and self.slots[0] < loop.time() - STALE_S:
                    self.slots.popleft()  # nobody took it in time: a late call could bunch with the next ones
                    self.stats.dropped += 1
                if self.slots:
                    break
                async with self._taking:
                    if not self.slots:
                        await self._take()
            at = self.slots.popleft()
            self.used += 1
        finally:
            self.waiting -= 1
        self._read_ahead()
        delay = at - loop.time()
        if delay > EARLY_S:
            await asyncio.sleep(delay)
        self.stats.waited_s += loop.time() - started

    async def _take_locked(self) -> None:
        async with self._taking:
            if len(self.slots) < self.low:  # a lane may have fetched meanwhile
                await self._take()

    def _wanted(self, now: float) -> int:
        """Slots to ask for: the lanes waiting, and the rows held as far as they can be called before their
        slots go stale at this worker's pace since the last statement; at least `prefetch`, at most `most`."""
        held = self.waiting + self.backlog()
        usable = self.most
        if self.paced_at is not None and now > self.paced_at[0]:
            pace = (self.used - self.paced_at[1]) / (now - self.paced_at[0])  # calls/s
            if 0 < pace < self.rate:
                # n slots span n/rate s and are used over n/pace s: all of them in time while
                # n/pace <= n/rate + STALE_S.
                usable = max(1, math.floor(STALE_S / (1 / pace - 1 / self.rate)))
        self.paced_at = (now, self.used)
        return max(self.waiting, self.prefetch, min(held, usable, self.most))

    async def aclose(self) -> None:
        """Stop a read-ahead in progress (its slots, if any, go unused)."""
        if self._refill is not None:
            self._refill.cancel()
            await asyncio.gather(self._refill, return_exceptions=True)

    async def _take(self) -> None:
        """Reserve slots for the lanes waiting now; when none fit, sleep until the server says they will."""
        loop = asyncio.get_running_loop()
        while True:
            want = self._wanted(loop.time())
            self.low = max(want // 2, 1)
            params = {"queue": self.queue, "want": want, "min": min(want, self.min_grant), "rate": self.rate,
                      "horizon_s": self.horizon_s}
            [(granted, first_in_s)] = await self.side.fetch(RATE_TAKE, params)
            self.stats.statements += 1
            if granted > 0:
                self._add(int(granted), float(first_in_s))
                return
            self.stats.refused += 1
            self.bound_until = loop.time() + self.horizon_s
            await asyncio.sleep(max(float(first_in_s), self.interval_s / 4))
