"""A no-op payment handler plug-in (BATCH_ASSETS_PAYMENT_HANDLER=batch_assets.reference.payments.noop:handle).

The benchmark uses it to measure the queue itself; it is also the smallest example of a plug-in.
"""

from __future__ import annotations


async def handle(*, payment_id: str, amount_cents: int, attempts: int) -> None:
    """Accept every payment (DONE)."""
    return None
