"""While a CLI run executes: a line on stderr when a step of it waits for a slot of the application database's pool,
naming the runs that hold the slots, and one when it no longer waits."""

from __future__ import annotations

import logging
import threading
import time

import dagster as dg
import sqlalchemy as sa

from batch_assets.orchestration.watchdog import waiting_for_slot

log = logging.getLogger("batch_assets.orchestration.launch")

LAUNCH_ID_TAG = "batch_assets/launch_id"
"""The tag a CLI launch gives its run, by which it finds the run before it knows its id."""


SLOT_WAIT_POLL_S = 5.0
"""How often a CLI run looks whether a step of it waits for a pool slot (nothing is read before the first poll)."""
SLOT_WAIT_REPEAT_S = 60.0
"""While the same steps keep waiting, the line is repeated this often."""


class SlotWaitReporter:
    """While a CLI run executes: a line on stderr when a step of it waits for a slot of the application database's
    pool (budget.APP_DATABASE_POOL), naming the runs that hold the slots, and one when it no longer waits.
    Dagster waits silently otherwise (its "blocked" event is a DEBUG-level engine event, and the CLI's console
    shows WARNING). A run shorter than SLOT_WAIT_POLL_S reads nothing."""

    def __init__(self, instance: dg.DagsterInstance, launch_id: str) -> None:
        self.instance = instance
        self.launch_id = launch_id
        self.run_id: str | None = None
        self.waiting: list[str] = []
        self._since = self._reported = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="batch-assets-slot-wait", daemon=True)

    def __enter__(self) -> SlotWaitReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.waiting and not self._thread.is_alive():  # it got its slot since the last poll, or the run ended
            self.poll()

    def _watch(self) -> None:
        while not self._stop.wait(SLOT_WAIT_POLL_S):
            self.poll()

    def poll(self) -> None:
        """Read whether the run's steps wait for a slot; say so when that changed (or every SLOT_WAIT_REPEAT_S)."""
        from batch_assets.orchestration.budget import APP_DATABASE_POOL

        try:
            if self.run_id is None:
                runs = self.instance.get_runs(filters=dg.RunsFilter(tags={LAUNCH_ID_TAG: self.launch_id}), limit=1)
                self.run_id = runs[0].run_id if runs else None
            waiting = waiting_for_slot(self.instance, self.run_id) if self.run_id else []
            info = self.instance.event_log_storage.get_concurrency_info(APP_DATABASE_POOL) if waiting else None
        except (sa.exc.SQLAlchemyError, OSError) as exc:  # the storage is busy or away: the next poll tells
            log.debug("slot wait not read: %s", exc)
            return
        now = time.monotonic()
        if info is not None and (waiting != self.waiting or now - self._reported >= SLOT_WAIT_REPEAT_S):
            self._since = self._since if self.waiting else now - SLOT_WAIT_POLL_S
            holders = sorted(info.active_run_ids - {self.run_id})
            log.warning("run %s: %s waiting for a slot of pool %s (%.0fs so far; limit %s, held by run(s) %s)",
                        self.run_id, ", ".join(waiting), APP_DATABASE_POOL, now - self._since, info.limit,
                        ", ".join(holders) or "none")
            self._reported = now
        elif self.waiting and not waiting:
            log.warning("run %s: no longer waiting for a slot of pool %s (waited about %.0fs)", self.run_id,
                        APP_DATABASE_POOL, now - self._since)
        self.waiting = waiting


