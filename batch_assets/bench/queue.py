"""The queue section: the declared payment queue against the raw SKIP LOCKED floor and the figures from before
the worker was split into parts (`before_split`), pickup latency, the HTTP stub.

The measurement itself is `batch_assets.bench.payments.run_queue_bench`; the bench calls it on its dedicated
database and keeps what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batch_assets.bench.payments import run_queue_bench

PGQUEUER_REFERENCE_PER_S = (5100.0, 6900.0)
"""PgQueuer's published throughput range (jobs/s), drawn beside ours as an outside reference."""

BEFORE_SPLIT = {
    "product_per_s": 45851.3, "floor_per_s": 66638.1, "ratio": 0.688, "pickup_p50_ms": 3.39, "pickup_p99_ms": 6.95,
    "source": "docs/bench/latest.json at 4eb15a0: the one-class payment worker before it was split, quiet machine",
}
"""Today's figures before the worker was split into parts, drawn beside the declared payments queue."""

QueueBench = Callable[..., dict[str, Any]]


def queue_section(
    url: str,
    *,
    payments: int,
    quick: bool,
    progress: Callable[[str], None] | None,
    run: QueueBench = run_queue_bench,
) -> dict[str, Any]:
    """The queue section of the report: `run`'s figures (run_queue_bench's, or a stand-in's in tests)."""
    figures = run(url, payments=payments, quick=quick, progress=progress)
    return {"status": "measured", "pgqueuer_reference_per_s": list(PGQUEUER_REFERENCE_PER_S),
            "before_split": dict(BEFORE_SPLIT), **figures}
