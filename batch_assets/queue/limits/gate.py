"""The call gate of a worker: what a handler call waits for, and what keeps the worker's claims alive.

- `max_in_flight` (`inflight.InFlightLimiter`): a slot of the queue's semaphore is taken before the
  call and given back after it, so at most N calls of the queue are in flight across all workers;
- `rate_limit_per_s` (`ratelimit.RateLimiter`): the call starts at a slot of the queue's rate, so the
  calls of all workers together keep to it;
- the claim renewal (`liveness.Liveness`): every claim the worker holds, from its claim until its
  result is written, has its lease renewed every lease/3, and so do the in-flight slots.

All three run their statements on one side connection (`side.SideConnection`), never on the
claim/flush connection. The waits come before the handler's timeout starts: waiting for a slot is
not part of a call. A worker with neither limit runs only the renewal.
"""

from __future__ import annotations

import asyncio
import contextlib

from batch_assets.queue.limits.inflight import InFlightLimiter
from batch_assets.queue.limits.ratelimit import RateLimiter
from batch_assets.queue.liveness import ClaimRenewer, Holdings, Liveness
from batch_assets.queue.settings import QueueSettings
from batch_assets.queue.side import SideConnection
from batch_assets.queue.store import QueueStore

CLOSE_TIMEOUT_S = 5.0
"""How long a stopping worker tries to give its in-flight slots back before leaving them to their lease."""


class CallGate:
    def __init__(self, conninfo: str, store: QueueStore, settings: QueueSettings) -> None:
        name = store.name
        self.side = SideConnection(conninfo)
        self.holdings = Holdings()
        lease_s = float(settings.claim_lease_s)
        self.rate = (RateLimiter(self.side, name, settings.rate_limit_per_s, lanes=settings.concurrency)
                     if settings.rate_limit_per_s else None)
        self.slots = (InFlightLimiter(self.side, name, settings.max_in_flight, lease_s=lease_s)
                      if settings.max_in_flight else None)
        self.liveness = Liveness(lease_s, ClaimRenewer(self.side, store.sql.renew, self.holdings),
                                 extra=[self.slots.renew] if self.slots is not None else [])
        self._beating: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._beating = asyncio.get_running_loop().create_task(self.liveness.run())

    @property
    def limited(self) -> bool:
        """Whether a call waits at the gate at all (a queue with neither limit only renews its claims)."""
        return self.rate is not None or self.slots is not None

    def enter_now(self) -> bool:
        """True when a call may start at once: a rate limit only (no in-flight cap), with a slot due now taken."""
        return self.slots is None and self.rate is not None and self.rate.take_now()

    async def enter(self) -> int | None:
        """Before one handler call: an in-flight slot (its number, or None without a cap), then a rate slot.

        Give the in-flight slot back with `leave` once the call ended (also when the wait was cancelled).
        """
        slot = await self.slots.acquire() if self.slots is not None else None
        try:
            if self.rate is not None:
                await self.rate.acquire()
        except BaseException:
            self.leave(slot)
            raise
        return slot

    def leave(self, slot: int | None) -> None:
        if slot is not None and self.slots is not None:
            self.slots.release(slot)

    async def aclose(self) -> None:
        """Stop renewing, give back the in-flight slots, close the side connection."""
        if self._beating is not None:
            self._beating.cancel()
            await asyncio.gather(self._beating, return_exceptions=True)
        try:
            if self.rate is not None:
                await self.rate.aclose()
            if self.slots is not None:
                # Bounded: during an outage the slots' lease gives them back instead.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await self.slots.aclose()
        finally:
            await self.side.aclose()
