"""The rate limit's accuracy and its cost, a part of the queue bench (`payments.run_queue_bench`).

1. **Accuracy.** 2 worker processes share `rate_limit_per_s` (100/s, `--quick`; 200/s full) over the
   payments queue with a handler that only stamps the time of each call; reported: the calls in every
   1 s window (min, max, mean, as a fraction of the limit), the rate achieved over the whole run, and
   what the limiter cost in statements (slot reservations per call, refused reservations, dropped slots).
2. **Cost at full speed.** The same 2 processes with a handler that does nothing and no limit, then with
   a limit far above what they reach (100,000/s), over the queue section's payments (at most 2,000
   `--quick`, 20,000 full): payments/s of each and their ratio, i.e. what asking PostgreSQL for call
   slots costs when the limit does not bind.

Rows are the bench's own (`queue_harness.BenchRows`: inserted with COPY, deleted by id range).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.context import SpawnContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import TYPE_CHECKING, Any

from batch_assets.bench.queue_harness import BenchRows, EndReport, run_processes

if TYPE_CHECKING:  # imported where used: a spawned bench process loads only what it runs
    from batch_assets.queue.claims import Claim
    from batch_assets.queue.handler import Outcome

FAR_ABOVE_PER_S = 100_000.0
WINDOW_S = 1.0


class _Stamps:
    """A handler that records the monotonic time of each call (CLOCK_MONOTONIC: one clock for all processes)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    async def handle_async(self, claim: Claim) -> Outcome:
        from batch_assets.queue.handler import Outcome

        self.times.append(time.monotonic())
        return Outcome.done()

    def close(self) -> None:
        return None


def _limited_process(url: str, ready: Barrier, out: Queue[EndReport], rate: float, report: Queue[Any]) -> None:
    """One drain-mode worker at `rate` (0: no limit); reports its call times and the limiter's figures."""
    try:
        from batch_assets.db.engine import create_engine
        from batch_assets.queue.settings import QueueSettings
        from batch_assets.queue.worker import Worker
        from batch_assets.reference.payments.queue import refuse_payment
        from batch_assets.reference.payments.store import PAYMENTS

        engine = create_engine(url, pool_size=2)
        settings = QueueSettings(concurrency=64, batch_size=100, rate_limit_per_s=rate)
        handler = _Stamps()
        worker = Worker(engine, PAYMENTS, settings, handler, threading.Event(), None, True, None, refuse_payment)
        ready.wait(timeout=120)
        asyncio.run(worker.run())
        ended = time.monotonic()
        limiter = worker.gate.rate
        report.put({"times": handler.times, "rate": asdict(limiter.stats) if limiter is not None else None})
        out.put(ended)
        engine.dispose()
    except BaseException as exc:  # reported to the parent, which raises
        out.put(f"{type(exc).__name__}: {exc}")


def _run(ctx: SpawnContext, url: str, rate: float, processes: int) -> tuple[float, list[dict[str, Any]]]:
    """`processes` workers at `rate`, released together: seconds until the last ends, and their reports."""
    report: Queue[Any] = ctx.Queue()
    reports: list[dict[str, Any]] = []
    seconds = run_processes(ctx, _limited_process, url, (rate, report),
                             before_join=lambda: reports.extend(report.get(timeout=60) for _ in range(processes)))
    return seconds, reports


def window_counts(times: list[float], window: float = WINDOW_S) -> list[int]:
    """Calls in [t, t + window) for each call time t whose window ends by the last call."""
    times = sorted(times)
    counts, j = [], 0
    for i, start in enumerate(times):
        if start + window > times[-1]:
            break
        j = max(j, i)
        while j < len(times) and times[j] < start + window:
            j += 1
        counts.append(j - i)
    return counts


def run_rate_bench(ctx: SpawnContext, url: str, rows: BenchRows, *, processes: int, quick: bool, payments: int,
                   progress: Callable[[str], None]) -> dict[str, Any]:
    """The rate limit's accuracy at one limit and its cost at full speed; see the module docstring."""
    limit = 100.0 if quick else 200.0
    calls = int(limit * (4 if quick else 10))
    progress(f"queue bench: rate limit {limit:g}/s across {processes} worker processes, {calls:,} payments")
    rows.insert(calls)
    _, reports = _run(ctx, url, limit, processes)
    rows.delete()
    times = sorted(t for r in reports for t in r["times"])
    counts = window_counts(times)
    stats = [r["rate"] for r in reports]
    statements = sum(s["statements"] for s in stats)

    cost_payments = min(payments, 2_000 if quick else 20_000)
    progress(f"queue bench: the limiter's cost, {cost_payments:,} payments without a limit and with one far above")
    rows.insert(cost_payments)
    free_s, _ = _run(ctx, url, 0, processes)
    rows.delete()
    rows.insert(cost_payments)
    far_s, _ = _run(ctx, url, FAR_ABOVE_PER_S, processes)
    rows.delete()
    return {
        "limit_per_s": limit,
        "worker_processes": processes,
        "calls": len(times),
        "achieved_per_s": round((len(times) - 1) / (times[-1] - times[0]), 2) if len(times) > 1 else 0.0,
        "window_1s": {
            "windows": len(counts),
            "min": min(counts, default=0), "max": max(counts, default=0),
            "mean": round(statistics.fmean(counts), 2) if counts else 0.0,
            "min_ratio": round(min(counts, default=0) / limit, 3),
            "max_ratio": round(max(counts, default=0) / limit, 3),
        },
        "statements_per_call": round(statements / len(times), 3) if times else None,
        "refused": sum(s["refused"] for s in stats),
        "dropped_slots": sum(s["dropped"] for s in stats),
        "cost": {
            "payments": cost_payments,
            "unlimited_per_s": round(cost_payments / free_s, 1),
            "limit_far_above_per_s": round(cost_payments / far_s, 1),
            "far_above_limit_per_s": FAR_ABOVE_PER_S,
            "ratio": round(free_s / far_s, 3),
        },
    }
