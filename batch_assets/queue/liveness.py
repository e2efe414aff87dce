"""Liveness, not only the lease: a worker renews its claims while it holds them.

A claim's lease (`claimed_until`) is a promise that its worker is alive, kept as long as that is
true: every `lease_s / 3` the worker extends the lease of every claim it holds (claimed and waiting
for a lane, in flight, or with its result waiting in the buffer), in one fenced statement per 1000
claims, and the lease of its in-flight slots. So the lease can be short (30 s): a worker that died
stops renewing and its claims lapse within the lease, when another worker takes them; a live worker
with a call slower than the lease keeps its rows. The renewal is fenced like every write after a
claim (`status = 'PROCESSING' AND <token column> = <token>`): it never revives a row that was
finished, given back or claimed again by another worker.

A renewal that does not get through (the database is away) is tried again by the side connection
with backoff; if the outage outlasts the lease, another worker may take the rows, and the claim
token fences the first worker's late writes as for any lapsed claim.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from batch_assets.errors import error_text
from batch_assets.queue.side import SideConnection, chunks

log = logging.getLogger(__name__)

RENEW_CHUNK = 1000
"""Claims renewed per statement."""
RENEWALS_PER_LEASE = 3
"""A claim is renewed this many times per lease, so one late or lost renewal never lets it lapse."""


class HeldClaim(Protocol):
    @property
    def id(self) -> Any: ...

    @property
    def token(self) -> uuid.UUID: ...


@dataclass
class LivenessStats:
    """Renewals made: beats, claims renewed, claims no longer ours (finished or taken meanwhile), failures."""

    beats: int = 0
    renewed: int = 0
    not_held: int = 0
    failed_beats: int = 0


class Holdings:
    """The claims a worker holds, key → token: from its claim until its result is written.

    One token per key: a row is PROCESSING under one claim at a time, so when a worker claims a row
    again (its earlier claim lapsed) the newer token replaces the older one, and the older claim's
    result, written or fenced off, no longer drops the newer hold.
    """

    def __init__(self) -> None:
        self._held: dict[Any, uuid.UUID] = {}

    def hold(self, claims: Iterable[HeldClaim]) -> None:
        held = self._held
        for claim in claims:
            held[claim.id] = claim.token

    def drop(self, claims: Iterable[HeldClaim]) -> None:
        held = self._held
        for claim in claims:
            token = held.get(claim.id)
            # One claim statement's rows share one token object: `is` spares the comparison per row.
            if token is not None and (token is claim.token or token == claim.token):
                del held[claim.id]

    def snapshot(self) -> list[tuple[Any, uuid.UUID]]:
        return list(self._held.items())

    def __len__(self) -> int:
        return len(self._held)


class ClaimRenewer:
    """Renews the lease of the claims in `holdings` on the side connection, with the queue's `renew` statement
    (`statements.Statements.renew`: %(keys)b, %(tokens)b, %(lease_s)s; returns the keys renewed)."""

    def __init__(self, side: SideConnection, statement: str, holdings: Holdings) -> None:
        self.side = side
        self.statement = statement
        self.holdings = holdings

    async def renew(self, lease_s: float) -> tuple[int, int]:
        """Extend every held claim's lease to now + `lease_s`: (renewed, no longer ours)."""
        held = self.holdings.snapshot()
        renewed = 0
        for part in chunks(held, RENEW_CHUNK):
            rows = await self.side.fetch(self.statement, {
                "keys": [k for k, _ in part], "tokens": [t for _, t in part], "lease_s": float(lease_s),
            })
            renewed += len(rows)
        return renewed, len(held) - renewed


class Liveness:
    """Every `lease_s / 3`: renew the held claims, then each extra lease (the in-flight slots)."""

    def __init__(
        self,
        lease_s: float,
        claims: ClaimRenewer | None,
        *,
        extra: Sequence[Callable[[], Awaitable[None]]] = (),
        every_s: float | None = None,
    ) -> None:
        self.lease_s = float(lease_s)
        self.every_s = every_s if every_s is not None else self.lease_s / RENEWALS_PER_LEASE
        self.claims = claims
        self.extra = list(extra)
        self.stats = LivenessStats()

    async def beat(self) -> None:
        """One renewal of everything held."""
        if self.claims is not None:
            renewed, gone = await self.claims.renew(self.lease_s)
            self.stats.renewed += renewed
            self.stats.not_held += gone
        for renew in self.extra:
            await renew()
        self.stats.beats += 1

    async def run(self) -> None:
        """Beat every `every_s` until cancelled; a failed beat is logged and the next one comes as planned."""
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.every_s
        while True:
            await asyncio.sleep(max(next_at - loop.time(), 0.0))
            next_at += self.every_s
            try:
                await self.beat()
            except Exception as exc:  # transient failures are retried by the side connection; this is another
                self.stats.failed_beats += 1
                log.warning("queue claim renewal failed (%s); trying again in %.1fs", error_text(exc), self.every_s)
            if next_at < loop.time():  # a beat that took longer than the interval: the next one right away
                next_at = loop.time()
