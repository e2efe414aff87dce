"""What the parts of one worker tell each other on its event loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Signals:
    """`kick` wakes the claim loop (a result, a free lane, a notification, a stop); `db_ran` is set after
    each of its waits, so lanes that never suspend can hold until it had its turn (`db_waiting`).
    `halting`: the worker stopped claiming and gives back what it holds."""

    kick: asyncio.Event = field(default_factory=asyncio.Event)
    db_ran: asyncio.Event = field(default_factory=asyncio.Event)
    db_waiting: bool = False
    halting: bool = False
    notified: bool = False  # a notification arrived since the last claim went out

    async def wait(self, timeout: float) -> bool:
        """The claim loop waits for a kick (result, free lane, notification, stop) or `timeout`; True when kicked."""
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
