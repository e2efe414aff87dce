"""The payment queue's benchmark: the product beside the raw SKIP LOCKED floor.

`run_queue_bench(database_url)` measures, in one call, on a database that already has the
migrations applied:

1. the product: `payments` payments, the no-op plug-in handler, 2 worker processes running the
   real `run_worker` of the declared payments queue (`declaration.PAYMENTS_QUEUE`, the generic worker in
   parts) in drain mode (not through Dagster), payments settled per second;
2. the floor: the same table, 2 processes, one statement per round trip that completes the
   previous 100 and claims the next 100 with SKIP LOCKED, written here independently of the
   product's SQL (also reported with synchronous_commit = off, the product's setting);
3. pickup latency: an idle resident worker, a row INSERTed by another connection, time until
   the handler is called (p50 / p99);
4. an HTTP stub on 127.0.0.1 answering after 50 ms, the default handler at concurrency 64 (`payments_http`);
5. the rate limit's accuracy across the worker processes and its cost (`payments_rate`).

Its rows carry ids with a random 64-bit prefix, so it deletes exactly what it inserted (`queue_harness`). It
refuses to start while other payments are NEW or PROCESSING (its workers would process them).

Every timed drain starts right after a CHECKPOINT (`settle`, when the role may run one), so the floor, the
product and the CLI's drains (bench/startup.py), measured minutes apart, each start at the same point of the
server's checkpoint cycle: on a server with a small `max_wal_size` the sections before them keep it checkpointing
every few seconds, and a drain that meets a checkpoint pays a full-page image for the first change of every page.
(2026-12-04, full bench on a 1 GB `max_wal_size` server: without it the CLI's drains met two checkpoints the
floor's had not, 0.48x the floor through the launcher; with it the floor, paying the same page images, fell from
52.3k to 34.1k payments/s and the CLI's drain, 3.1 s by its own clock either way, gave 0.75x. It makes the two
comparable; it makes neither faster.)
"""

from __future__ import annotations

import multiprocessing as mp
import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from multiprocessing.context import SpawnContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event
from typing import TYPE_CHECKING, Any

import psycopg

from batch_assets.bench.payments_http import HTTP_CONCURRENCY, HTTP_LATENCY_S, http_stub_case
from batch_assets.bench.payments_rate import run_rate_bench
from batch_assets.bench.queue_harness import (
    WORKER_PROCESSES,
    BenchRows,
    EndReport,
    conninfo_of,
    drain_process,
    run_processes,
)
from batch_assets.errors import ConfigError

if TYPE_CHECKING:  # imported where used: a spawned bench process loads only what it runs
    from batch_assets.queue.claims import Claim
    from batch_assets.queue.handler import Outcome

# What the resident worker's handler puts on its queue: (payment id, monotonic time of the call),
# or ("error", "<error type>: <text>").
Stamp = tuple[str, float | str]

NOOP_HANDLER = "batch_assets.reference.payments.noop:handle"
FLOOR_BATCH = 100

# FLOOR_ROUND_TRIP — the floor's whole protocol: complete the previous batch and claim the
# next one in one statement (one round trip, one commit).
#   %(done)s  uuid[]  ids claimed by the previous round trip
#   %(n)s     int     rows to claim
FLOOR_ROUND_TRIP = """
WITH done AS (
    UPDATE payments SET status = 'DONE', processed_at = now(), claimed_until = NULL
     WHERE id = ANY(%(done)s::uuid[])
), claimed AS (
    UPDATE payments SET status = 'PROCESSING', attempts = attempts + 1,
                        claimed_until = now() + interval '5 minutes'
     WHERE id IN (SELECT id FROM payments
                   WHERE status = 'NEW' AND next_attempt_at <= now()
                   ORDER BY next_attempt_at
                   LIMIT %(n)s
                     FOR UPDATE SKIP LOCKED)
    RETURNING id
)
SELECT id FROM claimed
"""


def _sqlalchemy_url(database_url: str) -> str:
    from batch_assets.db.engine import normalize_url

    return normalize_url(database_url)


def run_queue_bench(
    database_url: str,
    *,
    payments: int = 100_000,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure the product, the floor, pickup latency and the HTTP stub case; see the module docstring."""
    if isinstance(payments, bool) or not isinstance(payments, int) or payments < 1:
        raise ConfigError(f"must be a whole number >= 1, got {payments!r}", field="payments")
    say = progress or (lambda _text: None)
    conninfo = conninfo_of(database_url)
    url = _sqlalchemy_url(database_url)
    with psycopg.connect(conninfo) as conn:
        busy = conn.execute("SELECT count(*) FROM payments WHERE status IN ('NEW', 'PROCESSING')").fetchone()
    if busy and busy[0]:
        raise ConfigError(f"{busy[0]} payments are NEW or PROCESSING; run the bench on a scratch database",
                          field="database_url")
    ctx = mp.get_context("spawn")
    rows = BenchRows(conninfo)
    try:
        say(f"queue bench: floor, {payments:,} payments, {WORKER_PROCESSES} processes")
        rows.insert(payments)
        floor_s = run_processes(ctx, _floor_process, conninfo, (False,))
        rows.delete()

        # The product commits with synchronous_commit = off (a lost result is only processed again);
        # the same floor with that setting shows how much of the difference is the commit alone.
        say(f"queue bench: floor with synchronous_commit = off, {payments:,} payments")
        rows.insert(payments)
        floor_async_s = run_processes(ctx, _floor_process, conninfo, (True,))
        rows.delete()

        say(f"queue bench: product, {payments:,} payments, no-op plug-in, {WORKER_PROCESSES} worker processes")
        rows.insert(payments)
        product_s = run_processes(ctx, drain_process, url, (_noop_setup,))
        done, total, max_attempts = rows.state()
        rows.delete()

        samples = 30 if quick else 200
        say(f"queue bench: pickup latency, {samples} single inserts into an idle resident worker")
        latencies = _pickup_latency(ctx, url, conninfo, rows, samples)
        rows.delete()

        http_payments = 600 if quick else 6_000
        say(f"queue bench: HTTP stub ({HTTP_LATENCY_S * 1000:.0f} ms), {http_payments:,} payments, "
            f"concurrency {HTTP_CONCURRENCY}")
        rows.insert(http_payments)
        http_s, http_calls = http_stub_case(ctx, url)
        http_done, http_total, http_max_attempts = rows.state()
        rows.delete()

        rate_limit = run_rate_bench(ctx, url, rows, processes=WORKER_PROCESSES, quick=quick, payments=payments,
                                    progress=say)
    finally:
        rows.delete()
    product_per_s = payments / product_s
    floor_per_s = payments / floor_s
    ordered = sorted(latencies)
    return {
        "payments": payments,
        "worker_processes": WORKER_PROCESSES,
        "product_per_s": round(product_per_s, 1),
        "floor_per_s": round(floor_per_s, 1),
        "ratio": round(product_per_s / floor_per_s, 3),
        "pickup_latency_ms": {
            "p50": round(statistics.median(ordered) * 1000, 2),
            "p99": round(ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1000, 2),
            "samples": len(ordered),
        },
        "http_stub": {
            "latency_ms": round(HTTP_LATENCY_S * 1000),
            "concurrency": HTTP_CONCURRENCY,
            "payments": http_payments,
            "per_s": round(http_payments / http_s, 1),
            "target_per_s": 0.8 * HTTP_CONCURRENCY / HTTP_LATENCY_S,
            "calls": http_calls,
        },
        "checks": {
            "product": {"done": done, "rows": total, "max_attempts": max_attempts},
            "http_stub": {"done": http_done, "rows": http_total, "max_attempts": http_max_attempts},
        },
        "product_s": round(product_s, 3),
        "floor_s": round(floor_s, 3),
        "floor_async_commit_per_s": round(payments / floor_async_s, 1),
        "ratio_async_commit": round(product_per_s / (payments / floor_async_s), 3),
        "floor_batch": FLOOR_BATCH,
        "checkpoint_before_each_drain": rows.settled,
        "rate_limit": rate_limit,
        "quick": quick,
    }


# --- processes ---------------------------------------------------------------------------------


def _floor_process(conninfo: str, ready: Barrier, out: Queue[EndReport], async_commit: bool) -> None:
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            if async_commit:
                conn.execute("SET synchronous_commit = off")
            ready.wait(timeout=120)
            done: list[uuid.UUID] = []
            while True:
                done = [r[0] for r in conn.execute(FLOOR_ROUND_TRIP, {"done": done, "n": FLOOR_BATCH}).fetchall()]
                if not done:
                    break
        out.put(time.monotonic())
    except BaseException as exc:  # reported to the parent, which raises
        out.put(f"{type(exc).__name__}: {exc}")


def _noop_setup() -> tuple[Any, Any]:
    """The declared payments queue (its QueueDeclaration's settings), the no-op plug-in as its handler."""
    from batch_assets.reference.payments.declaration import PAYMENTS_QUEUE
    from batch_assets.reference.payments.handler import load_plugin

    settings = PAYMENTS_QUEUE.settings(concurrency=64, batch_size=100)
    return settings, load_plugin(NOOP_HANDLER, concurrency=settings.concurrency)


class _StampHandler:
    """Reports (payment id, monotonic time) of every call to the parent."""

    def __init__(self, out: Queue[Stamp]) -> None:
        self.out = out

    async def handle_async(self, claim: Claim) -> Outcome:
        from batch_assets.queue.handler import Outcome

        self.out.put((str(claim.id), time.monotonic()))
        return Outcome.done()

    def close(self) -> None:
        return None


def _resident_process(url: str, ready: Barrier, out: Queue[Stamp], stop: Event) -> None:
    try:
        from batch_assets.db.engine import create_engine
        from batch_assets.queue.settings import QueueSettings
        from batch_assets.reference.payments.worker import run_worker

        engine = create_engine(url, pool_size=2)
        halt = threading.Event()

        def relay_stop() -> None:  # the parent's process-shared event → the worker's thread event
            stop.wait()
            halt.set()

        threading.Thread(target=relay_stop, daemon=True).start()
        ready.wait(timeout=120)
        run_worker(engine, QueueSettings(concurrency=8), handler=_StampHandler(out), stop=halt, drain=False)
        engine.dispose()
    except BaseException as exc:  # reported to the parent through the same queue
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def _wait_listening(conninfo: str, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'batch_assets_listener' "
                "AND query LIKE 'LISTEN%%' AND datname = current_database()"
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.05)  # polling for the worker to start (bench code, not a test)
    raise RuntimeError("the resident worker did not LISTEN within 60 s")


def _pickup_latency(ctx: SpawnContext, url: str, conninfo: str, rows: BenchRows, samples: int) -> list[float]:
    ready = ctx.Barrier(2)
    out: Queue[Stamp] = ctx.Queue()
    stop = ctx.Event()
    proc = ctx.Process(target=_resident_process, args=(url, ready, out, stop), daemon=True)
    proc.start()
    latencies: list[float] = []
    try:
        ready.wait(timeout=120)
        _wait_listening(conninfo)
        rng = random.Random(7)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for _ in range(samples):
                time.sleep(rng.uniform(0.01, 0.03))  # let the worker go idle between samples
                started = time.monotonic()
                pid = str(rows.insert_one(conn))
                while True:
                    got_id, at = out.get(timeout=30)
                    if isinstance(at, str):  # ("error", message)
                        raise RuntimeError(f"resident worker failed: {at}")
                    if got_id == pid:
                        latencies.append(at - started)
                        break
    finally:
        stop.set()
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    return latencies
