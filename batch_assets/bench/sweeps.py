"""The product's sweep, run in-process through the engine the way the Dagster op calls it.

The real lease, lock and checkpoint store are used, so the figures measure the
engine and not Dagster's start-up (measured on its own in `startup`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date
from typing import Any

import sqlalchemy as sa

from batch_assets.bench import growth
from batch_assets.bench.scratch import StatementCounter

CONFIG_CHANGE_RULES = "MINOR=0,YOUNG_ADULT=21,ADULT=26,SENIOR=65"
"""The rules change of the config-change scenario: YOUNG_ADULT from 18 to 21 (the default is 18)."""

PROGRESS_EVERY_S = 5.0

Say = Callable[[str], None]


def run_sweep(
    engine: sa.Engine, cipher: Any, mode: str, run_date: date, workers: int, *, say: Say | None = None, label: str = ""
) -> dict[str, Any]:
    """One sweep of the product with its real guard and checkpoints; the summary plus wall_s and rows_per_s."""
    from batch_assets.engine.settings import SweepSettings
    from batch_assets.reference.customer_status.job import run_customer_status_sweep

    settings = SweepSettings(workers=workers, pool_size=max(10, workers + 4))
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    with _guard(engine, run_id, settings) as guard:
        started = time.perf_counter()
        result = run_customer_status_sweep(
            engine, cipher, mode=mode, run_date=run_date, settings=settings, run_id=run_id,
            guard=guard, checkpoints=_checkpoints(engine), progress=_progress(say, label, started),
        )
        elapsed = time.perf_counter() - started
    summary = result.to_summary()
    if summary["status"] != "SUCCESS":
        raise RuntimeError(f"bench sweep {mode} ended {summary['status']}: {summary.get('stopped_reason')}")
    summary["wall_s"] = round(elapsed, 3)
    summary["rows_per_s"] = round(summary["scanned"] / elapsed) if elapsed > 0 else None
    return summary


def _progress(say: Say | None, label: str, started: float) -> Callable[[dict[str, Any]], None] | None:
    """A page callback that prints one progress line at most every PROGRESS_EVERY_S seconds."""
    if say is None:
        return None
    last = [started]

    def on_page(snapshot: dict[str, Any]) -> None:
        now = time.perf_counter()
        if now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            say(f"  {label}: {snapshot['scanned']:,} rows scanned, {snapshot['changed']:,} changed "
                f"({now - started:.0f} s)")

    return on_page


@contextmanager
def _guard(engine: sa.Engine, run_id: str, settings: Any) -> Iterator[Any]:
    from batch_assets.locking.guard import job_guard

    with job_guard(engine, job_key="customer_status", run_id=run_id, settings=settings) as guard:
        yield guard


def _checkpoints(engine: sa.Engine) -> Any:
    from batch_assets.locking.checkpoint import CheckpointStore

    return CheckpointStore(engine)


def scenario(summary: dict[str, Any], statements: tuple[int, int, int]) -> dict[str, Any]:
    """The report's view of one sweep: counts, speed and statements per page."""
    pages = max(summary["pages"], 1)
    page_statements, preambles, bookkeeping = statements
    return {
        "scanned": summary["scanned"],
        "changed": summary["changed"],
        "failed": summary["failed"],
        "pages": summary["pages"],
        "decrypted": summary["decrypted"],
        "triggers": summary["triggers"],
        "engine_duration_s": summary["duration_s"],
        "sweep_s": summary["wall_s"],
        "rows_per_s": summary["rows_per_s"],
        "statements": page_statements,
        "statements_per_page": round(page_statements / pages, 2),
        "data_statements_per_page": round((page_statements - preambles) / pages, 2),
        "bookkeeping_statements_per_page": round(bookkeeping / pages, 2),
    }


def measured(
    engine: sa.Engine, counter: StatementCounter, cipher: Any, mode: str, run_date: date, workers: int,
    *, say: Say, label: str,
) -> dict[str, Any]:
    """Run one sweep and return its scenario entry, with the statements it sent counted and what it left in the
    tables it writes (`tables`: tuples inserted, updated, HOT-updated, dead, sizes; see growth)."""
    before = growth.snapshot(engine)
    counter.take()
    summary = run_sweep(engine, cipher, mode, run_date, workers, say=say, label=label)
    entry = scenario(summary, counter.take())
    entry["tables"] = growth.written(before, growth.snapshot(engine), engine)
    return entry


def change_rules(engine: sa.Engine) -> str:
    """Store the config-change scenario's rules as the new current version; returns them as text."""
    from batch_assets.reference.customer_status.rules import Rules
    from batch_assets.reference.customer_status.rules_store import set_rules

    set_rules(engine, Rules.parse(CONFIG_CHANGE_RULES))
    return CONFIG_CHANGE_RULES
