"""The exception a payment handler raises to reject a payment for good (CONTRACT §7)."""

from __future__ import annotations


class PermanentFailure(Exception):
    """Raised by a payment handler: the payment is FAILED at once (no retry). Any other exception is transient."""
