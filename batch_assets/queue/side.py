"""The side connection of a queue worker: the rate limit, the in-flight slots and the claim renewals.

Their statements are short and few (a handful a second), and must not wait behind the claim/flush
connection's pipelined round trips, nor stall them; so they share one autocommit connection of their
own. It connects on first use; a transient failure (`is_transient`: backend terminated, server
restarting, refused) closes it and the statement is tried again on a new connection with backoff
(0.5 s doubling to 8 s, jittered) until it works or the caller is cancelled. Any other error is raised.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from batch_assets.db.engine import is_transient
from batch_assets.errors import error_text

log = logging.getLogger(__name__)

_RETRY_FIRST_S = 0.5
_RETRY_MAX_S = 8.0
_CONNECT_TIMEOUT_S = 10
APPLICATION_NAME = "batch_assets_queue_side"


class SideConnection:
    """One autocommit psycopg connection, (re)connected on demand; `fetch` rides out transient failures."""

    def __init__(self, conninfo: str, *, application_name: str = APPLICATION_NAME) -> None:
        self.conninfo = conninfo
        self.application_name = application_name
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._connecting = asyncio.Lock()
        self.statements = 0
        self.reconnects = 0

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        async with self._connecting:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(
                    self.conninfo, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S,
                    application_name=self.application_name,
                )
            return self._conn

    async def fetch_once(self, query: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run `query` once; its rows ([] when it returns none). A failure closes the connection and is raised."""
        try:
            conn = await self._connection()
            cur = await conn.execute(query, params)
            self.statements += 1
            return list(await cur.fetchall()) if cur.description is not None else []
        except BaseException:
            await self._drop()
            raise

    async def fetch(self, query: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run `query`, again after each transient failure (backoff), until it works; its rows."""
        delay = _RETRY_FIRST_S
        warned = False
        while True:
            try:
                return await self.fetch_once(query, params)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if not warned:
                    # error_text is the driver's first line; the conninfo, and so the password, is never part of it.
                    log.warning("queue side connection lost (%s); retrying", error_text(exc))
                    warned = True
                self.reconnects += 1
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, _RETRY_MAX_S)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                await conn.close()
            except Exception:  # already broken: nothing more to release
                log.debug("closing the side connection failed", exc_info=True)

    async def aclose(self) -> None:
        await self._drop()


def chunks(values: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """`values` cut into runs of at most `size` (one statement each)."""
    return [values[i : i + size] for i in range(0, len(values), size)]
