"""Low-watermark checkpoints (ba_checkpoints), one per (sweep, mode, range).

A checkpoint says "every page at or before this cursor is committed". It is
only resumable by a run of the same sweep, the same mode and the same rules
fingerprint: resuming a config-change sweep under different rules would skip
rows the new rules must see. Anything else is ignored with a warning and the
run starts over, which is always safe because re-running a page is a no-op.

Generations (CONTRACT §5: a range that finished is not read again by the run that
resumes it; after a run that finished, the next one starts fresh). A run that is
planned over several ranges registers every range first (`begin`): one generation
of PLANNED checkpoints for the sweep, mode and fingerprint. A range that finishes is
DONE within its generation, and the range ops of that run and of every run that
resumes it (`in_generation`) skip a DONE range. `begin` resumes the generation while
any of its ranges is unfinished and it has the same ranges and fingerprint; a
generation whose ranges are all DONE (the run finished) is started over. The decision
is taken once, by the plan, so it holds whatever order and timing the ranges run in.
A store used without a plan (the engine on its own, one range) keeps the simple rule:
a DONE checkpoint means the next run starts fresh.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from batch_assets.db import schema
from batch_assets.db.engine import translate_errors

log = logging.getLogger(__name__)

PLANNED = "PLANNED"
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
    generation: str | None = None

    @property
    def finished(self) -> bool:
        """The range finished within its generation (a planned run skips it)."""
        return self.status == DONE


@dataclass(frozen=True)
class Generation:
    """What `begin` decided for a planned run: its generation id, and whether it resumes an unfinished one."""

    id: str
    resumed: bool
    finished: tuple[str, ...] = ()
    """The range keys already DONE in a resumed generation (not read again)."""


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
        generation=row.generation,
    )


def _as_date(value: date | str | None) -> date | None:
    if value is None or isinstance(value, date):
        return value
    return date.fromisoformat(value)


def _why_not_resumed(found: list[Checkpoint], range_keys: list[str], fingerprint: str | None) -> str | None:
    """Why the unfinished generation in `found` cannot be resumed by this plan (None: it can)."""
    if {c.range_key for c in found} != set(range_keys) or len(found) != len(range_keys):
        return f"its {len(found)} cursor range(s) are not the {len(range_keys)} planned"
    fingerprints = sorted({str(c.fingerprint) for c in found if c.fingerprint != fingerprint})
    if fingerprints:
        return f"it belongs to fingerprint {fingerprints[0]}, not {fingerprint}"
    if len({c.generation for c in found}) != 1:
        return "its ranges belong to different generations"
    return None


class CheckpointStore:
    """Load, save and complete checkpoints; every call is a short transaction of its own.

    `generation` binds the store to a planned run's generation (`in_generation`): then a DONE
    checkpoint of that generation is returned by `load` (the range is skipped), and a checkpoint of
    another generation is not resumed.
    """

    def __init__(self, engine: sa.Engine, generation: str | None = None) -> None:
        self.engine = engine
        self.generation = generation

    def in_generation(self, generation: str | None) -> CheckpointStore:
        """The same store, bound to a planned run's generation (None: unbound)."""
        return CheckpointStore(self.engine, generation)

    def begin(
        self,
        sweep: str,
        mode: str,
        range_keys: list[str],
        *,
        fingerprint: str | None,
        run_id: str | None,
        run_date: date | str | None,
    ) -> Generation:
        """Register a planned run's ranges: resume the unfinished generation of this sweep and mode if it has
        the same ranges and fingerprint, else start a new one (every range PLANNED, nothing read yet).

        One transaction, the mode's checkpoints locked, so the decision is taken once for every range."""
        if not range_keys or len(set(range_keys)) != len(range_keys):
            raise ValueError("range_keys must be distinct and not empty")
        query = sa.select(_t).where(_t.c.sweep == sweep, _t.c.mode == mode).with_for_update()
        with translate_errors(self.engine), self.engine.begin() as conn:
            found = [_from_row(r) for r in conn.execute(query)]
            unfinished = [c for c in found if not c.finished]
            why = _why_not_resumed(found, range_keys, fingerprint) if unfinished else "it finished"
            if why is None and found[0].generation is not None:
                finished = tuple(sorted(c.range_key for c in found if c.finished))
                log.info("checkpoints %s/%s: resuming the unfinished generation %s (%d of %d range(s) finished)",
                         sweep, mode, found[0].generation, len(finished), len(found))
                return Generation(found[0].generation, resumed=True, finished=finished)
            generation = uuid.uuid4().hex
            if why is None:
                # Checkpoints saved before generations existed: the unfinished ones are resumed, but a DONE
                # one may be a previous run's, so it is read again (always safe).
                conn.execute(
                    sa.update(_t).where(_t.c.sweep == sweep, _t.c.mode == mode)
                    .values(generation=generation,
                            cursor=sa.case((_t.c.status == DONE, sa.null()), else_=_t.c.cursor),
                            status=sa.case((_t.c.status == DONE, PLANNED), else_=_t.c.status))
                )
                return Generation(generation, resumed=True)
            if unfinished:
                log.warning("checkpoints %s/%s: the unfinished generation is not resumed (%s), starting over",
                            sweep, mode, why)
            conn.execute(sa.delete(_t).where(_t.c.sweep == sweep, _t.c.mode == mode))
            conn.execute(sa.insert(_t).values([
                {"sweep": sweep, "mode": mode, "range_key": key, "cursor": sa.null(), "rules_fingerprint": fingerprint,
                 "run_id": run_id, "run_date": _as_date(run_date), "status": PLANNED, "counters": {},
                 "updated_at": sa.func.now(), "generation": generation}
                for key in range_keys
            ]))
        return Generation(generation, resumed=False)

    def load(self, sweep: str, mode: str, range_key: str, fingerprint: str | None) -> Checkpoint | None:
        """The resumable checkpoint of this sweep, mode, range and fingerprint; otherwise None (with a warning).

        Bound to a generation, a DONE checkpoint of it is returned (the caller skips the range); unbound,
        a DONE checkpoint means the range starts fresh."""
        query = sa.select(_t).where(_t.c.sweep == sweep, _t.c.range_key == range_key)
        with translate_errors(self.engine), self.engine.connect() as conn:
            found = [_from_row(r) for r in conn.execute(query)]
        mine = next((c for c in found if c.mode == mode), None)
        if mine is None:
            others = sorted(c.mode for c in found if not c.finished)
            if others:
                log.warning(
                    "checkpoint %s/%s belongs to mode %s, not %s, starting over", sweep, range_key, others[0], mode
                )
            return None
        if self.generation is not None and mine.generation != self.generation:
            log.warning("checkpoint %s/%s/%s belongs to another generation than this run's, starting over",
                        sweep, mode, range_key)
            return None
        if mine.fingerprint != fingerprint:
            if not mine.finished:
                log.warning(
                    "checkpoint %s/%s/%s belongs to fingerprint %s, not %s, starting over",
                    sweep, mode, range_key, mine.fingerprint, fingerprint,
                )
            return None
        if mine.finished and self.generation is None:
            return None
        if mine.status not in (PLANNED, RUNNING, DONE):
            log.warning("checkpoint %s/%s/%s has an unknown status, starting over", sweep, mode, range_key)
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
        """Upsert the checkpoint as RUNNING with this cursor (JSON-able) and counters (its generation stays,
        or becomes the bound one)."""
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
            "generation": self.generation,
        }
        stmt = pg_insert(_t).values(**values)
        updates: dict[str, Any] = {k: stmt.excluded[k] for k in values if k not in ("sweep", "mode", "range_key")}
        updates["generation"] = sa.func.coalesce(stmt.excluded.generation, _t.c.generation)
        stmt = stmt.on_conflict_do_update(index_elements=[_t.c.sweep, _t.c.mode, _t.c.range_key], set_=updates)
        with translate_errors(self.engine), self.engine.begin() as conn:
            conn.execute(stmt)

    def complete(self, sweep: str, mode: str, range_key: str) -> None:
        """Mark the checkpoint DONE: finished within its generation (unbound: the next run starts fresh)."""
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
