"""The outbox section: events/s to each broker with confirms on, beside a raw client loop (issue 19).

The measurement belongs to the outbox domain (`batch_assets.domains.outbox.benchmark.run_outbox_bench`); the
bench runs it on its dedicated database after the sweeps. A broker that does not answer is "not measured"
with the reason (a machine without brokers still gets a complete report); CI runs both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

QUICK_EVENTS = 5_000
FULL_EVENTS = 100_000
GO_OUTBOX_REFERENCE_PER_S = 7_300.0
"""go-outbox's published RabbitMQ-with-confirms figure (msg/s), shown beside ours as an outside reference."""


def outbox_section(engine: sa.Engine, *, quick: bool, progress: Callable[[str], None] | None) -> dict[str, Any]:
    """{"status": "measured", "events", "batch_size", "brokers": {name: figures or why not}}."""
    from batch_assets.domains.outbox.benchmark import BATCH_SIZE, run_outbox_bench

    events = QUICK_EVENTS if quick else FULL_EVENTS
    brokers = run_outbox_bench(engine, events=events, batch_size=BATCH_SIZE, progress=progress)
    return {"status": "measured", "events": events, "batch_size": BATCH_SIZE,
            "go_outbox_reference_per_s": GO_OUTBOX_REFERENCE_PER_S, "brokers": brokers}
