"""The declared form of the customer-status rule, side by side with the hand-written plug-in.

The same rows, the same rules and the same engine: `SweepComponent` attributes over `customers` and a
`compute(row, run_date)` written the way a team would write it (decrypt, parse, evaluate, RowFailure for a row's
own bad data), against `CustomerStatusSweep`. Both run a full sweep with the same workers, first computation and
steady state. The declared form writes only the two columns (no review triggers, no outbox events, no failure
marker): what it measures is the declared statements and the per-row mapping around the same rule.
"""

from __future__ import annotations

import time
import uuid
from datetime import date
from typing import Any

import sqlalchemy as sa

from batch_assets.bench import sweeps
from batch_assets.bench.scratch import StatementCounter
from batch_assets.errors import DecryptError, RowFailure
from batch_assets.reference.customer_status.rules import evaluate, parse_dob

NAME = "customer_status_declared"
DECLARATION: dict[str, Any] = {
    "name": NAME,
    "table": "customers",
    "key": "id",
    "columns": ["id", "encrypted_dob", "age_category", "next_review_date"],
    "where": "status = 'ACTIVE'",
    "due": "next_review_date",
    "compute": "batch_assets.bench.declared:compute",
    "writes": ["age_category", "next_review_date"],
    "sensitive": ["encrypted_dob", "next_review_date"],
}
"""The declared form's attributes (what its defs.yaml would say)."""

_STATE: dict[str, Any] = {}
_MEMO: dict[bytes, tuple[str, date]] = {}


def compute(row: Any, run_date: date) -> dict[str, Any]:
    """The age-category rule (docs/reference/rules.md) as a declared job's function."""
    blob = row["encrypted_dob"]
    if not blob:
        raise RowFailure("missing_data")
    try:
        plain = _STATE["cipher"].decrypt(row["id"], blob)
    except DecryptError:
        raise RowFailure("decrypt_failure") from None
    known = _MEMO.get(plain)
    if known is None:
        try:
            dob = parse_dob(plain.decode("ascii"))
        except (ValueError, OverflowError):
            raise RowFailure("invalid_value") from None
        if dob > run_date:
            raise RowFailure("invalid_value")
        evaluation = evaluate(dob, run_date, _STATE["rules"])
        known = _MEMO[plain] = (evaluation.category, evaluation.next_review_date)
    return {"age_category": known[0], "next_review_date": known[1]}


def prepare(engine: sa.Engine, cipher: Any, run_date: date) -> Any:
    """The declared form's full sweep for `run_date` (the declaration checked against the catalog, the rules read)."""
    from batch_assets.engine.table_sweep import DeclaredSweep
    from batch_assets.orchestration.components.sweep_component import SweepComponent
    from batch_assets.reference.customer_status.rules_store import current_rules

    with engine.connect() as conn:
        _, rules = current_rules(conn)
    _STATE.update(cipher=cipher, rules=rules)
    _MEMO.clear()
    target = SweepComponent.from_attributes_dict(attributes=DECLARATION).target(engine)
    return DeclaredSweep(target, "full", run_date)


def run_declared(engine: sa.Engine, cipher: Any, run_date: date, workers: int,
                 definition: Any = None) -> dict[str, Any]:
    """One full sweep of the declared form with its real guard and checkpoints; the summary plus wall_s, rows_per_s."""
    from batch_assets.engine.definition import RunContext
    from batch_assets.engine.runner import run_sweep
    from batch_assets.engine.settings import SweepSettings
    from batch_assets.locking.checkpoint import CheckpointStore
    from batch_assets.locking.guard import job_guard

    definition = definition or prepare(engine, cipher, run_date)
    settings = SweepSettings(workers=workers, pool_size=max(10, workers + 4))
    run_id = f"bench-declared-{uuid.uuid4().hex[:8]}"
    with job_guard(engine, job_key=NAME, run_id=run_id, settings=settings) as guard:
        started = time.perf_counter()
        result = run_sweep(engine, definition, settings, RunContext(run_id, "full", run_date), guard=guard,
                           checkpoints=CheckpointStore(engine))
        elapsed = time.perf_counter() - started
    summary = result.to_summary()
    if summary["status"] != "SUCCESS":
        raise RuntimeError(f"bench declared sweep ended {summary['status']}: {summary.get('stopped_reason')}")
    summary["wall_s"] = round(elapsed, 3)
    summary["rows_per_s"] = round(summary["scanned"] / elapsed) if elapsed > 0 else None
    return summary


def measure(engine: sa.Engine, counter: StatementCounter, cipher: Any, run_date: date, workers: int,
            say: sweeps.Say) -> dict[str, Any]:
    """Hand-written plug-in and declared form, first computation and steady state, on the same rows."""
    from batch_assets.bench import scratch

    section: dict[str, Any] = {"workers": workers, "declaration": DECLARATION}
    for phase in ("first_computation", "steady_state"):
        for form in ("plugin", "declared"):
            if phase == "first_computation":
                scratch.reset_to_first_computation(engine)
            else:
                scratch.vacuum(engine)
            say(f"  {form}, full, {phase.replace('_', ' ')}, {workers} worker(s)")
            definition = prepare(engine, cipher, run_date) if form == "declared" else None
            counter.take()  # the sweep's own statements only (not the catalog reads of `prepare`)
            if form == "plugin":
                summary = sweeps.run_sweep(engine, cipher, "full", run_date, workers)
            else:
                summary = run_declared(engine, cipher, run_date, workers, definition)
            section[f"{form}_{phase}"] = sweeps.scenario(summary, counter.take())
        if phase == "first_computation":
            # The steady state starts from rows the plug-in settled itself (its triggers and failure markers).
            scratch.reset_to_first_computation(engine)
            sweeps.run_sweep(engine, cipher, "full", run_date, workers)
        plugin, declared = section[f"plugin_{phase}"], section[f"declared_{phase}"]
        ratio = round(declared["sweep_s"] / plugin["sweep_s"], 3) if plugin["sweep_s"] else None
        section[f"ratio_{phase}"] = ratio
        say(f"  {phase.replace('_', ' ')}: declared {declared['rows_per_s']:,} rows/s, plug-in "
            f"{plugin['rows_per_s']:,} rows/s (declared / plug-in time {ratio})")
    section["within_1_15x"] = all((section[f"ratio_{p}"] or 0) <= 1.15 for p in ("first_computation", "steady_state"))
    return section
