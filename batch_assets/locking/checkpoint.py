"""Low-watermark checkpoints (ba_checkpoints), one per (sweep, mode, range).

A checkpoint says "every page at or before this cursor is committed". It is
only resumable by a run of the same sweep, the same mode and the same rules
fingerprint: resuming a config-change sweep under different rules would skip
rows the new rules must see. Anything else is ignored with a warning and the
run starts over, which is always safe because re-running a page is a no-op.

Generations (a range that finished is not read again by the run that
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

Fencing: a store bound to a run's lease (`fenced_by`) saves and completes a checkpoint only while
that lease is the run's, checked in the same statement as the write (and held until it commits, as a
page transaction's fence is), so a run that lost its lease can neither move a checkpoint nor mark a
range DONE: it gets LeaseLost. Every transaction here is bounded (db.timeouts.bounded).
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
from batch_assets.db.timeouts import bounded
from batch_assets.errors import LeaseLost

log = logging.getLogger(__name__)

PLANNED = "PLANNED"
RUNNING = "RUNNING"
DONE = "DONE"

_t = schema.checkpoints
_leases = schema.leases


def _fence(lease: str, owner: str) -> sa.CTE:
    """The run's lease row while it is `owner`'s and live, locked FOR KEY SHARE until the transaction ends (a
    takeover waits for it, as for a page transaction's fence: locking.lease)."""
    return (
        sa.select(sa.literal(1).label("held"))
        .select_from(_leases)
        .where(_leases.c.name == lease, _leases.c.owner == owner, _leases.c.expires_at > sa.func.clock_timestamp())
        .with_for_update(key_share=True)
        .cte("fence")
    )


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

    def __init__(self, engine: sa.Engine, generation: str | None = None,
                 fence: tuple[str, str] | None = None) -> None:
        self.engine = engine
        self.generation = generation
        self.fence = fence
        """(lease name, owner): `save` and `complete` write only while that lease is that owner's."""

    def in_generation(self, generation: str | None) -> CheckpointStore:
        """The same store, bound to a planned run's generation (None: unbound)."""
        return CheckpointStore(self.engine, generation, self.fence)

    def fenced_by(self, lease: str, owner: str) -> CheckpointStore:
        """The same store, writing only while lease `lease` is held by `owner` (LeaseLost otherwise)."""
        return CheckpointStore(self.engine, self.generation, (lease, owner))

    def _lost(self) -> LeaseLost:
        lease, owner = self.fence or ("", "")
        return LeaseLost(f"lease {lease!r} is no longer held by {owner}: the checkpoint was not written")

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
        with translate_errors(self.engine), bounded(self.engine) as conn:
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
        with translate_errors(self.engine), bounded(self.engine) as conn:
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
        keys = ("sweep", "mode", "range_key")
        if self.fence is None:
            stmt = pg_insert(_t).values(**values)
        else:
            fence = _fence(*self.fence)
            row = sa.select(*(sa.bindparam(f"v_{k}", v, type_=_t.c[k].type) if k != "updated_at" else v
                              for k, v in values.items())).select_from(fence)
            stmt = pg_insert(_t).from_select(list(values), row)
        updates: dict[str, Any] = {k: stmt.excluded[k] for k in values if k not in keys}
        updates["generation"] = sa.func.coalesce(stmt.excluded.generation, _t.c.generation)
        stmt = stmt.on_conflict_do_update(index_elements=[_t.c.sweep, _t.c.mode, _t.c.range_key], set_=updates)
        with translate_errors(self.engine), bounded(self.engine) as conn:
            if self.fence is None:
                conn.execute(stmt)
                return
            # One statement: the fence (a CTE) and the upsert of one row per fence row (none once the lease moved).
            written = conn.execute(stmt.returning(sa.literal(1))).first()
            if written is None:
                raise self._lost()

    def complete(self, sweep: str, mode: str, range_key: str) -> None:
        """Mark the checkpoint DONE: finished within its generation (unbound: the next run starts fresh)."""
        where = [_t.c.sweep == sweep, _t.c.mode == mode, _t.c.range_key == range_key]
        if self.fence is None:
            with translate_errors(self.engine), bounded(self.engine) as conn:
                conn.execute(sa.update(_t).where(*where).values(status=DONE, updated_at=sa.func.now()))
            return
        fence = _fence(*self.fence)
        done = (sa.update(_t).where(*where, sa.exists(sa.select(fence.c.held)))
                .values(status=DONE, updated_at=sa.func.now()).returning(_t.c.sweep).cte("done"))
        # One statement: whether the lease is the run's, and the update that applies only if it is.
        stmt = sa.select(sa.select(sa.func.count()).select_from(fence).scalar_subquery(),
                         sa.select(sa.func.count()).select_from(done).scalar_subquery())
        with translate_errors(self.engine), bounded(self.engine) as conn:
            held, _ = conn.execute(stmt).one()
        if not held:
            raise self._lost()

    def list(self, sweep: str) -> list[Checkpoint]:
        """Every checkpoint of a sweep (RUNNING and DONE), by mode and range."""
        query = sa.select(_t).where(_t.c.sweep == sweep).order_by(_t.c.mode, _t.c.range_key)
        with translate_errors(self.engine), bounded(self.engine) as conn:
            return [_from_row(r) for r in conn.execute(query)]
