"""The worker's database connections: connect, and ride out an outage by reconnecting with backoff.

A transient failure (`is_transient`: backend terminated, server restarting, connection refused,
timeout) of either connection drops it and connects again with backoff (0.5 s doubling to 8 s,
jittered, so several workers cut off together do not knock on the server in step). The claim/flush
connection rides out `db_outage_s` from its failure (within `drain_timeout_s` once stopping); then
`DatabaseUnavailable` ends the worker FAILURE. One WARNING per outage (both connections usually
fail together), one INFO when both are back.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import sqlalchemy as sa

from batch_assets.db.engine import is_transient, session_conninfo, unavailable
from batch_assets.errors import DatabaseUnavailable, error_text
from batch_assets.queue.result import QueueResult
from batch_assets.queue.settings import QueueSettings

log = logging.getLogger(__name__)

RECONNECT_FIRST_S = 0.5  # backoff between connection attempts after a transient failure ...
RECONNECT_MAX_S = 8.0  # ... doubling up to this
CONNECT_TIMEOUT_S = 10
WORKER_OPTIONS = "-c synchronous_commit=off -c plan_cache_mode=force_custom_plan"
"""The server settings of the claim/flush connection (libpq `options`):
- `synchronous_commit=off`: a committed result or claim lost in a database crash only means the row is claimed
  again after its lease (the handler's idempotency), so commits need not wait for WAL;
- `plan_cache_mode=force_custom_plan`: generic plans of the prepared claim/result statements cannot see the
  array sizes and fall back to whole-table joins; custom plans stay on primary-key lookups.

The claim's plan is left to the planner, which needs the table's statistics: with many rows due it walks the claim
index in rank order and stops after a batch; with few due among many NEW rows not yet due (retries in backoff,
payments scheduled later) it reads the due rows from the due index and sorts them. Pinning the walk
(`enable_sort=off`) was tried and measured: 26 ms a claim against 2.6 ms with 200k payments due in an hour and 50
due now, since the walk reads every row not yet due. The opposite mistake comes from statistics that undercount the
due rows (a bulk insert not yet analyzed): 130 ms a claim against 1 ms at 100k due. So a bulk load is followed by
ANALYZE: the product's own (`seed payments`, `queue enqueue`, `batch_assets.reference.payments.seed.copy_payments`)
do it; another service's bulk load should too (docs/queue.md)."""


def pause_s(delay: float) -> float:
    """The jittered pause before the next connection attempt."""
    return delay * random.uniform(0.8, 1.2)


class Link:
    """The claim/flush connection (`conn`) and the outage bookkeeping both connections share."""

    def __init__(self, engine: sa.Engine, settings: QueueSettings, stop: threading.Event, result: QueueResult,
                 *, label: str) -> None:
        self.engine = engine
        self.settings = settings
        self.stop = stop
        self.result = result
        self.label = label
        # The engine's server with the keepalives and session settings of every connection of the product.
        self.conninfo = session_conninfo(engine)  # the listener's and the side connections'
        self.claims_conninfo = session_conninfo(engine, options=WORKER_OPTIONS)
        self.conn: psycopg.AsyncConnection[Any]
        self.down: set[str] = set()  # connections lost and not yet back: "claims", "listener", "unverified"
        self.down_since = 0.0
        self.stop_seen_at: float | None = None

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    async def connect(self, timeout_s: float = CONNECT_TIMEOUT_S) -> psycopg.AsyncConnection[Any]:
        """Open the claim/flush connection."""
        self.conn = await psycopg.AsyncConnection.connect(
            self.claims_conninfo, autocommit=True, connect_timeout=max(2, int(timeout_s)),
            application_name="batch_assets_worker",
        )
        return self.conn

    async def listener(self) -> psycopg.AsyncConnection[Any]:
        """A new LISTEN connection."""
        return await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, application_name="batch_assets_listener",
        )

    def lost(self, which: str, exc: BaseException) -> None:
        """A connection failed transiently: one WARNING per outage."""
        if not self.down:
            self.down_since = self.now()
            # error_text is the driver's first line; the conninfo, and so the password, is never part of it.
            log.warning("%s worker: database connection lost (%s); reconnecting for up to %gs",
                        self.label, error_text(exc), self.settings.db_outage_s)
            if which == "listener":
                # An idle claim/flush connection learns of the outage only at its next statement,
                # maybe after the listener is back: the outage lasts until that statement worked.
                self.down.add("unverified")
        self.down.add(which)

    def back(self, which: str) -> None:
        self.result.reconnects += 1
        self.down.discard(which)
        if which == "claims":
            self.down.discard("unverified")
        self._outage_over()

    def verified(self) -> None:
        """A statement worked on the claim/flush connection: it survived the outage."""
        if "unverified" in self.down:
            self.down.discard("unverified")
            self._outage_over()

    def _outage_over(self) -> None:
        if not self.down:
            log.info("%s worker: database connections back after %.1fs", self.label, self.now() - self.down_since)

    async def reconnect(self, exc: BaseException, then: Callable[[], Awaitable[None]]) -> None:
        """Drop the claim/flush connection and connect again with backoff (then `then()`), or raise
        `DatabaseUnavailable`. Bounded by `db_outage_s` from this failure and, once the worker is
        stopping, by `drain_timeout_s` from the stop, so SIGTERM during an outage still ends promptly."""
        self.lost("claims", exc)
        await self.conn.close()
        started = self.now()
        delay, attempts, last = RECONNECT_FIRST_S, 0, exc
        while True:
            now = self.now()
            deadline = started + self.settings.db_outage_s
            if self.stop.is_set():
                if self.stop_seen_at is None:
                    self.stop_seen_at = now
                deadline = min(deadline, self.stop_seen_at + self.settings.drain_timeout_s)
            pause = pause_s(delay)
            if now + pause >= deadline:
                raise DatabaseUnavailable(
                    f"{unavailable(self.engine.url, last)} (gave up after {now - started:.1f}s and {attempts} "
                    f"reconnect attempts; db_outage_s {self.settings.db_outage_s:g})"
                )
            await asyncio.sleep(pause)
            delay = min(delay * 2, RECONNECT_MAX_S)
            attempts += 1
            try:
                await self.connect(min(CONNECT_TIMEOUT_S, deadline - self.now()))
                await then()
            except Exception as retry_exc:
                if not is_transient(retry_exc):
                    raise
                last = retry_exc
                if not self.conn.closed:
                    await self.conn.close()
                continue
            self.back("claims")
            return
