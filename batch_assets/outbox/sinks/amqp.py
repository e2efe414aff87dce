"""The RabbitMQ sink (client: aio-pika), with publisher confirms."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from batch_assets.outbox.event import OutboxEvent, bodies_of
from batch_assets.outbox.sinks.base import DEFAULT_STREAM, client_library
from batch_assets.outbox.sinks.loop import AsyncSink


class RabbitMQSink(AsyncSink):
    """RabbitMQ through aio-pika with publisher confirms: persistent messages (delivery mode 2) on a durable
    exchange, routed by the event type (or a fixed routing key) to a durable queue bound to it, `message_id` =
    the event id. Unroutable messages (mandatory) count as unconfirmed."""

    name = "rabbitmq"

    def __init__(self, url: str, *, exchange: str = DEFAULT_STREAM, queue: str = DEFAULT_STREAM,
                 routing_key: str | None = None, binding_key: str = "#", timeout_s: float = 10.0) -> None:
        with client_library(self.name, "aio-pika"):
            import aio_pika  # noqa: F401 - imported here so that a missing library refuses the sink when chosen

        self.exchange_name, self.queue_name = exchange, queue
        self.routing_key, self.binding_key = routing_key, binding_key
        self._conn: Any = None
        self._exchange: Any = None
        super().__init__(url, timeout_s)

    async def _connect(self) -> None:
        import aio_pika

        self._conn = await aio_pika.connect(self._url, timeout=self.timeout_s)
        channel = await self._conn.channel(publisher_confirms=True, on_return_raises=True)
        self._exchange = await channel.declare_exchange(self.exchange_name, aio_pika.ExchangeType.TOPIC,
                                                        durable=True)
        if self.queue_name:
            queue = await channel.declare_queue(self.queue_name, durable=True)
            await queue.bind(self._exchange, routing_key=self.binding_key)

    async def _disconnect(self) -> None:
        conn, self._conn, self._exchange = self._conn, None, None
        if conn is not None:
            await conn.close()

    async def _publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        import aio_pika

        publishes = [
            self._exchange.publish(
                aio_pika.Message(body, message_id=str(e.id), type=e.event_type,
                                 content_type="application/json", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=self.routing_key or e.event_type,
                mandatory=True,
            )
            for e, body in zip(events, bodies_of(events), strict=True)
        ]
        results = await asyncio.gather(*publishes, return_exceptions=True)
        return [r if isinstance(r, BaseException) else None for r in results]

    def __repr__(self) -> str:
        return f"RabbitMQSink(exchange={self.exchange_name!r}, queue={self.queue_name!r})"
