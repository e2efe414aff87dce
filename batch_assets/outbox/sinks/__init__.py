"""The outbox sinks: one module per sink behind one protocol, `send_batch(events)`.

`send_batch` returns only when the sink confirmed every event of the batch, durably: the file is
fsynced, Redis answered every XADD, RabbitMQ acked every publish (publisher confirms), JetStream
returned a PubAck for every message. Otherwise it raises; `SinkNotConfirmed.confirmed` names the
events that *were* confirmed, so the relay marks exactly those SENT and leaves the rest PENDING.

Every message carries the event id as its idempotency key: `message_id` (RabbitMQ), the
`Nats-Msg-Id` header (JetStream dedupes on it within its duplicate window), the entry's `id` field
(Redis), the object's `id` (file). Delivery is at least once; a consumer drops what it saw.

The brokers' clients are asyncio (aio-pika, nats-py): each sink runs one event loop on a thread of
its own for its lifetime (`loop`). A batch is published whole and its confirms awaited together — never
one round trip per event. Every send is bounded by `timeout_s`; a timeout or a lost connection drops the
connection, and the next batch connects again.

Each broker's client library is imported by its sink's module only, when the sink is built, and is
optional (the `brokers` extra): the relay and the file sink need none of them, and choosing a broker
whose library is missing is a ConfigError naming BATCH_ASSETS_OUTBOX_SINK and the extra.
"""

from __future__ import annotations

from batch_assets.errors import ConfigError
from batch_assets.outbox.sinks.amqp import RabbitMQSink
from batch_assets.outbox.sinks.base import (
    BROKERS_EXTRA,
    DEFAULT_NATS_STREAM,
    DEFAULT_STREAM,
    Sink,
    SinkNotConfirmed,
)
from batch_assets.outbox.sinks.file import JsonLinesSink
from batch_assets.outbox.sinks.nats import NatsJetStreamSink
from batch_assets.outbox.sinks.redis import RedisStreamSink
from batch_assets.settings import OUTBOX_SINK_VAR, OutboxSinkTarget

__all__ = [
    "BROKERS_EXTRA",
    "DEFAULT_NATS_STREAM",
    "DEFAULT_STREAM",
    "JsonLinesSink",
    "NatsJetStreamSink",
    "RabbitMQSink",
    "RedisStreamSink",
    "Sink",
    "SinkNotConfirmed",
    "make_sink",
]


def make_sink(target: OutboxSinkTarget, *, timeout_s: float = 10.0) -> Sink:
    """The sink of `target` with its default names (the Dagster resources pass their configured ones)."""
    if target.kind == "file":
        return JsonLinesSink(target.location)
    if target.kind == "redis":
        return RedisStreamSink(target.location, timeout_s=timeout_s)
    if target.kind == "amqp":
        return RabbitMQSink(target.location, timeout_s=timeout_s)
    if target.kind == "nats":
        return NatsJetStreamSink(target.location, timeout_s=timeout_s)
    raise ConfigError(f"unknown sink kind {target.kind!r}", field=OUTBOX_SINK_VAR)
