"""What every sink shares: the `Sink` protocol, `SinkNotConfirmed`, the default names, and the rule that a
broker's client library is optional (the `brokers` extra)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from batch_assets.errors import ConfigError
from batch_assets.outbox.event import OutboxEvent
from batch_assets.settings import OUTBOX_SINK_VAR

DEFAULT_STREAM = "batch_assets.outbox"
"""Redis stream name; also the default RabbitMQ exchange and queue and the JetStream subject prefix."""
DEFAULT_NATS_STREAM = "BATCH_ASSETS_OUTBOX"

BROKERS_EXTRA = "brokers"
"""The pip extra that installs every broker's client library (redis, aio-pika, nats-py)."""


class SinkNotConfirmed(Exception):
    """The sink did not confirm every event of a batch; `confirmed` holds the ids it did confirm."""

    def __init__(self, message: str, confirmed: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.confirmed = frozenset(confirmed)


class Sink(Protocol):
    def send_batch(self, events: Sequence[OutboxEvent]) -> None:
        """Deliver the batch and wait for the sink's confirmation of every event, within the sink's timeout.

        Returning means every event was confirmed; anything else raises (SinkNotConfirmed names the
        confirmed part)."""

    def close(self) -> None:
        """Release the connection (idempotent)."""


@contextmanager
def client_library(sink: str, package: str) -> Iterator[None]:
    """Around the import of a sink's client library, done when the sink is built: without the library,
    choosing that sink is a ConfigError naming the setting that chose it and the extra to install."""
    try:
        yield
    except ImportError as exc:
        raise ConfigError(
            f"the {sink} sink needs the Python package {package}, which is not installed: "
            f"pip install 'batch-assets[{BROKERS_EXTRA}]'",
            field=OUTBOX_SINK_VAR,
        ) from exc
