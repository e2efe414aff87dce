"""The payments queue, declared as any team declares a queue (docs/guide/payment-queue.md,
docs/reference/declarations.md): a `QueueDeclaration`.

Its handler is a factory (`payment_handler`), so the default handler (docs/guide/payment-queue.md) stays:
BATCH_ASSETS_PAYMENT_HANDLER
when set, else the POST to BATCH_ASSETS_LIMITS_URL, else the simulated handler (demo). Its store keeps
the object names migrations 0001, 0002 and 0006 gave the payments' indexes, trigger and channel.
"""

from __future__ import annotations

from batch_assets import (
    Backoff,
    Handler,
    QueueDeclaration,
    QueueSettings,
    QueueSpec,
    Refusal,
    handler_factory,
    load_settings,
)
from batch_assets.reference.payments.handler import default_handler, plugin_spec_from_environment
from batch_assets.reference.payments.queue import refuse_payment
from batch_assets.reference.payments.store import PAYMENTS_SPEC


@handler_factory
def payment_handler(settings: QueueSettings) -> Handler:
    """The payments' handler for one worker run (read from the environment when the run starts)."""
    return default_handler(load_settings().limits_url, settings.http_timeout_s, concurrency=settings.concurrency,
                           plugin=plugin_spec_from_environment())


class PaymentsQueue(QueueDeclaration):
    """The declaration of `payments`, with the object names its migrations gave it."""

    def spec(self) -> QueueSpec:
        return PAYMENTS_SPEC

    def refusal(self) -> Refusal | None:
        """An amount the limits service cannot be asked about is FAILED without a call."""
        return refuse_payment


PAYMENTS_QUEUE = PaymentsQueue(
    name="payments",
    table="payments",
    key="id",
    columns=["id", "amount_cents"],
    handler="batch_assets.reference.payments.declaration:payment_handler",
    max_attempts=5,
    backoff=Backoff(base_s=60, max_s=3600),
    concurrency=8,
    priority="priority",
)
