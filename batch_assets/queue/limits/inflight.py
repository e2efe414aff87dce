"""`max_in_flight`: at most N handler calls of one queue in flight at once, across every worker.

A semaphore in PostgreSQL (db/migrations): the queue's slots 0..N-1 are rows of `ba_queue_slots`;
a worker takes free ones (`SKIP LOCKED`, so takers never wait on each other) under a lease it renews
while it holds them, and frees them when its calls are done. A worker that dies holds its slots only
until their lease passes; then any worker takes them. One slot per call in flight.

In a worker, a lane takes a slot before its call (`acquire`) and gives it back after (`release`).
The worker keeps a freed slot for a lane of its own that is waiting, but for at most
`FAIR_HOLD_S` in a row, so a busy worker does not keep the slots from the others; a slot nobody
waits for goes back to the table at once. With every slot taken, one lane per worker looks again
every 10 ms doubling to 0.2 s (a poll with a bound, not a spin), or as soon as a slot of its own
comes back. A slot that was lost (its lease lapsed during a pause longer than the lease, and another
worker took it) is noticed at the next renewal and dropped.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

from batch_assets.errors import ConfigError, error_text
from batch_assets.queue.side import SideConnection

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 10_000
"""Upper bound of max_in_flight."""
FAIR_HOLD_S = 0.5
"""A worker hands a freed slot to one of its own waiting lanes only within this long of taking it from the table."""
_POLL_FIRST_S = 0.01
_POLL_MAX_S = 0.2

# SLOTS_ENSURE — make slots 0..%(n)s-1 of %(queue)s exist (idempotent).   %(queue)s text · %(n)s int
SLOTS_ENSURE = """
INSERT INTO ba_queue_slots (queue, slot)
SELECT %(queue)s, s FROM generate_series(0, %(n)s - 1) AS s
ON CONFLICT (queue, slot) DO NOTHING
"""

# SLOTS_TAKE — take up to %(want)s free slots (never held, or their lease passed) among 0..%(max)s-1.
#   %(queue)s text · %(want)s int · %(max)s int · %(holder)s uuid · %(lease_s)s float8
# SKIP LOCKED: a slot another worker is taking right now is skipped, not waited for. Returns the slots taken.
SLOTS_TAKE = """
UPDATE ba_queue_slots AS s
   SET holder = %(holder)s, lease_until = now() + make_interval(secs => %(lease_s)s)
 WHERE s.queue = %(queue)s
   AND s.slot IN (SELECT slot FROM ba_queue_slots
                   WHERE queue = %(queue)s AND slot < %(max)s AND (holder IS NULL OR lease_until < now())
                   ORDER BY slot
                   LIMIT %(want)s
                     FOR UPDATE SKIP LOCKED)
RETURNING s.slot
"""

# SLOTS_FREE — give back %(slots)s held by %(holder)s.   %(queue)s text · %(slots)s int[] · %(holder)s uuid
SLOTS_FREE = """
UPDATE ba_queue_slots SET holder = NULL, lease_until = NULL
 WHERE queue = %(queue)s AND slot = ANY(%(slots)s::int[]) AND holder = %(holder)s
"""

# SLOTS_RENEW — extend the lease of %(slots)s still held by %(holder)s; returns the slots renewed (a slot
# missing from the answer was taken by another worker after its lease passed).
#   %(queue)s text · %(slots)s int[] · %(holder)s uuid · %(lease_s)s float8
SLOTS_RENEW = """
UPDATE ba_queue_slots SET lease_until = now() + make_interval(secs => %(lease_s)s)
 WHERE queue = %(queue)s AND slot = ANY(%(slots)s::int[]) AND holder = %(holder)s
RETURNING slot
"""


def check_max_in_flight(value: object, field: str = "max_in_flight") -> int:
    """A whole number within 1..MAX_IN_FLIGHT; ConfigError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_IN_FLIGHT:
        raise ConfigError(f"must be a whole number within 1..{MAX_IN_FLIGHT}, got {value!r}", field=field)
    return value


@dataclass
class InFlightStats:
    """What the semaphore did: slots taken from the table, handed on locally, statements, waits."""

    taken: int = 0
    handed_on: int = 0
    freed: int = 0
    lost: int = 0
    statements: int = 0
    waited_s: float = 0.0


class InFlightLimiter:
    """At most `max_in_flight` calls of `queue` in flight across all workers; slots leased for `lease_s`."""

    def __init__(self, side: SideConnection, queue: str, max_in_flight: int, *, lease_s: float) -> None:
        self.side = side
        self.queue = queue
        self.max = check_max_in_flight(max_in_flight)
        self.lease_s = float(lease_s)
        self.holder = uuid.uuid4()
        self.idle: list[int] = []  # held in the table, no call on it
        self.busy: set[int] = set()  # held, a call on it
        self.taken_at: dict[int, float] = {}  # when each held slot was taken from the table
        self.lost: set[int] = set()  # busy slots the table gave to another worker (dropped on release)
        self.waiting = 0
        self.stats = InFlightStats()
        self._polling = asyncio.Lock()
        self._changed = asyncio.Event()
        self._freeing: asyncio.Task[None] | None = None
        self._to_free: list[int] = []
        self._ensured = False

    @property
    def held(self) -> list[int]:
        return sorted({*self.idle, *self.busy, *self._to_free})

    async def acquire(self) -> int:
        """Wait for a slot; the slot number (give it back with `release`)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.waiting += 1
        try:
            while not self.idle:
                if self._polling.locked():
                    await self._changed.wait()  # the lane that polls, or a slot of ours, wakes us
                    continue
                async with self._polling:
                    await self._poll()
            slot = self.idle.pop()
        finally:
            self.waiting -= 1
        self.busy.add(slot)
        if self.idle and not self.waiting:
            self._give_back(list(self.idle))  # taken for lanes that meanwhile got one of ours
            self.idle.clear()
        self.stats.waited_s += loop.time() - started
        return slot

    async def _poll(self) -> None:
        """Take slots for the lanes waiting; with none free, look again (10 ms doubling to 0.2 s) or when one of ours
        is back."""
        delay = _POLL_FIRST_S
        try:
            while not self.idle:
                if not self._ensured:
                    await self.side.fetch(SLOTS_ENSURE, {"queue": self.queue, "n": self.max})
                    self._ensured = True
                rows = await self.side.fetch(SLOTS_TAKE, {
                    "queue": self.queue, "want": max(self.waiting, 1), "max": self.max, "holder": self.holder,
                    "lease_s": self.lease_s,
                })
                self.stats.statements += 1
                now = asyncio.get_running_loop().time()
                for (slot,) in rows:
                    self.idle.append(int(slot))
                    self.taken_at[int(slot)] = now
                self.stats.taken += len(rows)
                if self.idle:
                    return
                changed = self._changed
                try:
                    await asyncio.wait_for(changed.wait(), delay)
                except TimeoutError:
                    delay = min(delay * 2, _POLL_MAX_S)
        finally:
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def release(self, slot: int) -> None:
        """The call on `slot` ended: hand it to a waiting lane of ours (within FAIR_HOLD_S), else give it back."""
        self.busy.discard(slot)
        if slot in self.lost:
            self.lost.discard(slot)
            self.taken_at.pop(slot, None)
            return
        now = asyncio.get_running_loop().time()
        if self.waiting > len(self.idle) and now - self.taken_at.get(slot, now) < FAIR_HOLD_S:
            self.idle.append(slot)
            self.stats.handed_on += 1
            self._notify()
            return
        self._give_back([slot])

    def _give_back(self, slots: list[int]) -> None:
        for slot in slots:
            self.taken_at.pop(slot, None)
        self._to_free.extend(slots)
        if self._freeing is None or self._freeing.done():
            self._freeing = asyncio.get_running_loop().create_task(self._free())

    async def _free(self) -> None:
        while self._to_free:
            slots, self._to_free = self._to_free, []
            try:
                await self.side.fetch(SLOTS_FREE, {"queue": self.queue, "slots": slots, "holder": self.holder})
            except Exception as exc:  # not transient (those are retried): the lease brings the slots back
                log.warning("queue %s: freeing in-flight slots failed (%s); their lease frees them",
                            self.queue, error_text(exc))
                return
            self.stats.statements += 1
            self.stats.freed += len(slots)

    async def renew(self) -> None:
        """Extend the lease of every slot held; drop those another worker took (their lease had passed)."""
        slots = self.held
        if not slots:
            return
        rows = await self.side.fetch(SLOTS_RENEW, {"queue": self.queue, "slots": slots, "holder": self.holder,
                                                   "lease_s": self.lease_s})
        self.stats.statements += 1
        kept = {int(slot) for (slot,) in rows}
        for slot in slots:
            if slot in kept:
                continue
            self.stats.lost += 1
            if slot in self.busy:
                self.lost.add(slot)
            else:
                self.taken_at.pop(slot, None)
                if slot in self.idle:
                    self.idle.remove(slot)
                if slot in self._to_free:
                    self._to_free.remove(slot)

    async def aclose(self) -> None:
        """Give back every slot still held (the calls are over)."""
        if self._freeing is not None:
            await asyncio.gather(self._freeing, return_exceptions=True)
        self._to_free.extend(s for s in (*self.idle, *self.busy) if s not in self.lost)
        self.idle.clear()
        self.busy.clear()
        if self._to_free:
            await self._free()
