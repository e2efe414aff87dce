"""The queue section: the declared payment queue against the raw SKIP LOCKED floor and the figures from before
the worker was split into parts (`before_split`), pickup latency, the HTTP stub.

The measurement itself belongs to the payments domain
(`batch_assets.bench.payments.run_queue_bench`); the bench calls it
on its dedicated database and keeps what it returns. When that module is not
there, the section says so (`status: not measured`) and the checker fails
unless told `--allow-missing queue`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

QUEUE_MODULE = "batch_assets.bench.payments"
PGQUEUER_REFERENCE_PER_S = (5100.0, 6900.0)
"""PgQueuer's published throughput range (jobs/s), drawn beside ours as an outside reference."""

BEFORE_SPLIT = {
    "product_per_s": 45851.3, "floor_per_s": 66638.1, "ratio": 0.688, "pickup_p50_ms": 3.39, "pickup_p99_ms": 6.95,
    "source": "docs/bench/latest.json at 4eb15a0: the one-class payment worker before issue 18, quiet machine",
}
"""Today's figures before the worker was split into parts (issue 18), drawn beside the declared payments queue."""

QueueBench = Callable[..., dict[str, Any]]


def load_queue_bench() -> QueueBench | None:
    """The domain's run_queue_bench, or None when the module does not exist (yet)."""
    try:
        module = importlib.import_module(QUEUE_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != QUEUE_MODULE:
            raise  # the module exists but something it imports does not: a defect, not "not measured"
        return None
    return getattr(module, "run_queue_bench", None)


def queue_section(
    url: str,
    *,
    payments: int,
    quick: bool,
    progress: Callable[[str], None] | None,
    run: QueueBench | None = None,
) -> dict[str, Any]:
    """The queue section of the report: run_queue_bench's figures, or why they are missing."""
    run = run or load_queue_bench()
    if run is None:
        return {"status": "not measured",
                "reason": f"{QUEUE_MODULE}.run_queue_bench is not available in this build"}
    figures = run(url, payments=payments, quick=quick, progress=progress)
    return {"status": "measured", "pgqueuer_reference_per_s": list(PGQUEUER_REFERENCE_PER_S),
            "before_split": dict(BEFORE_SPLIT), **figures}
