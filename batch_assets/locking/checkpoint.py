"""Low-watermark checkpoints (ba_checkpoints), one per (sweep, mode, range).

A checkpoint says "every page at or before this cursor is committed". It is
only resumable by a run of the same sweep, the same mode and the same rules
fingerprint: resuming a config-change sweep under different rules would skip
rows the new rules must see. Anything else is ignored with a warning and the
run starts over, which is always safe because re-running a page is a no-op.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from batch_assets.db import schema
from batch_assets.db.engine import translate_errors

log = logging.getLogger(__name__)

RUNNING = "RUNNING"
DONE = "DONE"

_t = schema.checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """A saved low-watermark cursor and the counters of the run that saved it."""

    sweep: str
    mode: str
    range_key: str
    cursor: Any
    fingerprint: str | None
    run_id: str | None
    run_date: date | None
    counters: dict[str, Any]
    updated_at: datetime
    status: str = field(default=RUNNING)


def _from_row(row: sa.Row[Any]) -> Checkpoint:
    return Checkpoint(
        sweep=row.sweep,
        mode=row.mode,
        range_key=row.range_key,
        cursor=row.cursor,
        fingerprint=row.rules_fingerprint,
        run_id=row.run_id,
        run_date=row.run_date,
        counters=dict(row.counters or {}),
        updated_at=row.updated_at,
        status=row.status,
    )


def _as_date(value: date | str | None) -> date | None:
    if value is None or isinstance(value, date):
        return value
    return date.fromisoformat(value)


class CheckpointStore:
    """Load, save and complete checkpoints; every call is a short transaction of its own."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def load(self, sweep: str, mode: str, range_key: str, fingerprint: str | None) -> Checkpoint | None:
        """The resumable checkpoint of this sweep, mode, range and fingerprint; otherwise None (with a warning)."""
        query = sa.select(_t).where(_t.c.sweep == sweep, _t.c.range_key == range_key, _t.c.status == RUNNING)
        with translate_errors(self.engine), self.engine.connect() as conn:
            found = [_from_row(r) for r in conn.execute(query)]
        mine = next((c for c in found if c.mode == mode), None)
        if mine is None:
            others = sorted(c.mode for c in found)
            if others:
                log.warning(
                    "checkpoint %s/%s belongs to mode %s, not %s, starting over", sweep, range_key, others[0], mode
                )
            return None
        if mine.fingerprint != fingerprint:
            log.warning(
                "checkpoint %s/%s/%s belongs to fingerprint %s, not %s, starting over",
                sweep, mode, range_key, mine.fingerprint, fingerprint,
            )
            return None
        return mine

    def save(
        self,
        sweep: str,
        mode: str,
        range_key: str,
        *,
        cursor: Any,
        fingerprint: str | None,
        run_id: str | None,
        run_date: date | str | None,
        counters: dict[str, Any],
    ) -> None:
        """Upsert the checkpoint as RUNNING with this cursor (JSON-able) and counters."""
        values = {
            "sweep": sweep,
            "mode": mode,
            "range_key": range_key,
            "cursor": cursor,
            "rules_fingerprint": fingerprint,
            "run_id": run_id,
            "run_date": _as_date(run_date),
            "status": RUNNING,
            "counters": dict(counters),
            "updated_at": sa.func.now(),
        }
        stmt = pg_insert(_t).values(**values)
        stmt = stmt.on_conflict_do_update(
            index_elements=[_t.c.sweep, _t.c.mode, _t.c.range_key],
            set_={k: stmt.excluded[k] for k in values if k not in ("sweep", "mode", "range_key")},
        )
        with translate_errors(self.engine), self.engine.begin() as conn:
            conn.execute(stmt)

    def complete(self, sweep: str, mode: str, range_key: str) -> None:
        """Mark the checkpoint DONE, so the next run of this sweep, mode and range starts fresh."""
        stmt = (
            sa.update(_t)
            .where(_t.c.sweep == sweep, _t.c.mode == mode, _t.c.range_key == range_key)
            .values(status=DONE, updated_at=sa.func.now())
        )
        with translate_errors(self.engine), self.engine.begin() as conn:
            conn.execute(stmt)

    def list(self, sweep: str) -> list[Checkpoint]:
        """Every checkpoint of a sweep (RUNNING and DONE), by mode and range."""
        query = sa.select(_t).where(_t.c.sweep == sweep).order_by(_t.c.mode, _t.c.range_key)
        with translate_errors(self.engine), self.engine.connect() as conn:
            return [_from_row(r) for r in conn.execute(query)]
