"""The notifier: LISTEN on the queue's wake-up channel on a connection of its own, and reconnect.

The table's statement-level trigger (installed by `db migrate`) notifies whenever a statement makes
a row due now, also when another service inserts it directly; every notification kicks the claim
loop. After a transient failure the notifier reconnects with backoff; meanwhile the poll covers the
gap, and once back it kicks the loop once, since inserts while nobody listened notified no one.
"""

from __future__ import annotations

import asyncio
import logging

from batch_assets.db.engine import is_transient
from batch_assets.errors import error_text
from batch_assets.queue.connection import RECONNECT_FIRST_S, RECONNECT_MAX_S, Link, pause_s
from batch_assets.queue.result import QueueResult
from batch_assets.queue.signals import Signals

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, link: Link, listen: str, signals: Signals, result: QueueResult) -> None:
        self.link = link
        self.listen_sql = listen
        self.signals = signals
        self.result = result
        self.listening = asyncio.Event()  # set once LISTEN is in place (or it failed: the poll covers)

    def _wake(self) -> None:
        self.signals.notified = True
        self.signals.kick.set()

    async def run(self) -> None:
        delay = RECONNECT_FIRST_S
        while True:
            try:
                conn = await self.link.listener()
                async with conn:
                    await conn.execute(self.listen_sql)
                    delay = RECONNECT_FIRST_S
                    if "listener" in self.link.down:
                        self.link.back("listener")
                        self._wake()  # inserts while nobody listened sent their notification to no one
                    self.listening.set()
                    async for _ in conn.notifies():
                        self.result.notifications += 1
                        self._wake()
            except Exception as exc:
                self.listening.set()  # the first claim need not wait: the poll covers the gap
                if not is_transient(exc):
                    log.warning("%s worker: LISTEN failed (%s); polling only", self.link.label, error_text(exc))
                    return
                self.link.lost("listener", exc)
                await asyncio.sleep(pause_s(delay))
                delay = min(delay * 2, RECONNECT_MAX_S)
