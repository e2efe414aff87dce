"""The resident payment worker (docs/guide/payment-queue.md): the generic queue worker on the payments' store.

The worker itself is `batch_assets.run_queue_worker` (claim loop and adaptive batch, executor, completer,
notifier, breaker); the payments add their store (`store.PAYMENTS`) and their own refusal (an amount
the limits service cannot be asked about is FAILED without a call, `queue.refuse_payment`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import sqlalchemy as sa

from batch_assets import Handler, QueueResult, QueueSettings, run_queue_worker
from batch_assets.reference.payments.queue import refuse_payment
from batch_assets.reference.payments.store import PAYMENTS

__all__ = ["run_worker"]


def run_worker(
    engine: sa.Engine,
    settings: QueueSettings,
    *,
    handler: Handler,
    stop: threading.Event | None = None,
    max_seconds: float | None = None,
    drain: bool = True,
    progress: Callable[[QueueResult], None] | None = None,
) -> QueueResult:
    """Process due payments until `stop` is set, `max_seconds` pass, or (drain=True) nothing is due
    (`batch_assets.run_queue_worker` on the payments' store)."""
    return run_queue_worker(engine, PAYMENTS, settings, handler=handler, stop=stop, max_seconds=max_seconds,
                                   drain=drain, progress=progress, refuse=refuse_payment)
