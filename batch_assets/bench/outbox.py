"""The outbox section: events/s to each broker with confirms on, beside a raw client loop, and the drain of a
first computation's events.

The measurement belongs to the outbox domain (`batch_assets.bench.outbox_relay.run_outbox_bench`); the
bench runs it on its dedicated database after the sweeps. A broker that does not answer is "not measured"
with the reason (a machine without brokers still gets a complete report); CI runs both.

The drain (`drain_section`): a first-computation sweep of DRAIN_ROWS customers (1M, or --rows when smaller:
the quick run's 20k) on a scratch database of its own, with a follow-mode relay sending its events to a broker
as they commit, the way `batch-assets outbox relay --follow` runs beside a sweep. It reports the sweep's time,
the time until the backlog is empty, the peak backlog (sampled every second) and the events/s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import date
from typing import Any

import sqlalchemy as sa

from batch_assets.bench import scratch

QUICK_EVENTS = 5_000
DRAIN_ROWS = 1_000_000
DRAIN_TIMEOUT_S = 3600
FULL_EVENTS = 100_000
GO_OUTBOX_REFERENCE_PER_S = 7_300.0
"""go-outbox's published RabbitMQ-with-confirms figure (msg/s), shown beside ours as an outside reference."""


def outbox_section(engine: sa.Engine, *, quick: bool, progress: Callable[[str], None] | None) -> dict[str, Any]:
    """{"status": "measured", "events", "batch_size", "brokers": {name: figures or why not}}."""
    from batch_assets.bench.outbox_relay import BATCH_SIZE, ROUNDS, run_outbox_bench

    events = QUICK_EVENTS if quick else FULL_EVENTS
    rounds = 1 if quick else ROUNDS  # CI stays fast; a full run takes turns to see past the machine's noise
    brokers = run_outbox_bench(engine, events=events, batch_size=BATCH_SIZE, rounds=rounds, progress=progress)
    return {"status": "measured", "events": events, "batch_size": BATCH_SIZE,
            "go_outbox_reference_per_s": GO_OUTBOX_REFERENCE_PER_S, "brokers": brokers}


def drain_section(base_url: str, cipher: Any, run_date: date, *, rows: int, workers: int,
                  progress: Callable[[str], None] | None) -> dict[str, Any]:
    """{"status": "measured", "rows", "events", "broker", "sweep_s", "drained_s", "peak_backlog", ...} or
    "not measured" with the reason (no broker answers)."""
    from batch_assets.bench.outbox_relay import Drain, drain_broker
    from batch_assets.bench.sweeps import run_sweep
    from batch_assets.db.engine import create_engine
    from batch_assets.db.migrate import LIBRARY, migrate
    from batch_assets.reference.customer_status.seed import seed_customers
    from batch_assets.reference.migrations import REFERENCE

    broker = drain_broker()
    if broker is None:
        return {"status": "not measured", "reason": "no broker answers (NATS or RabbitMQ)"}
    kind, url = broker
    rows = min(rows, DRAIN_ROWS)
    say = progress or (lambda _m: None)
    say(f"  outbox drain: a first computation of {rows:,} rows, relayed to {kind} as it runs")
    with scratch.scratch_database(base_url, scratch.scratch_name()) as db_url:
        engine = create_engine(db_url, pool_size=workers + 8)
        try:
            migrate(engine, (LIBRARY, REFERENCE))
            seed_customers(engine, cipher, rows, run_date=run_date, seed=3)
            scratch.vacuum(engine)
            with Drain(engine, kind, url) as drain:
                started = time.perf_counter()
                sweep = run_sweep(engine, cipher, "full", run_date, workers)
                sweep_s = time.perf_counter() - started
                emptied = drain.wait_empty(DRAIN_TIMEOUT_S)
                drained_s = time.perf_counter() - started
            with engine.connect() as conn:
                sent = int(conn.exec_driver_sql("SELECT count(*) FROM outbox_events WHERE status = 'SENT'")
                           .scalar_one())
        finally:
            engine.dispose()
    if not emptied:
        raise RuntimeError(f"the outbox drain did not empty within {DRAIN_TIMEOUT_S} s")
    out = {"status": "measured", "rows": rows, "workers": workers, "broker": kind, "events": sweep["changed"],
           "sent": sent, "sweep_s": round(sweep_s, 2), "drained_s": round(drained_s, 2),
           "after_sweep_s": round(drained_s - sweep_s, 2), "peak_backlog": drain.peak_backlog,
           "backlog_samples": drain.samples, "events_per_s": round(sent / drained_s, 1),
           "relay_failures": drain.failures}
    say(f"  outbox drain: {sent:,} events to {kind} in {drained_s:.1f} s ({out['events_per_s']:,.0f}/s; sweep "
        f"{sweep_s:.1f} s), peak backlog {drain.peak_backlog:,}")
    return out
