"""The outbox bench: events/s from PENDING to confirmed-and-SENT through each broker, beside a raw client loop.

For each broker that answers, the same `events` outbox events are relayed (claim → publish the batch → await
every confirm → mark SENT, `relay_outbox` as the product runs it), then the raw client publishes the same
bodies in the same batch size and awaits the same confirms, with no database at all. The ratio relay / raw is
what the relay costs over the broker itself (goal ≥ 0.8); the two take turns for a few rounds and the best
round of each is compared (a shared machine's bursts of load otherwise decide the ratio). Each run uses names
of its own (exchange and queue, JetStream stream), deleted afterwards; the raw loop uses other message ids
than the relay, so JetStream's dedupe never drops them. Both serialize their messages inside the timed loop;
neither counts connecting.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from batch_assets.outbox.relay import backlog, follow_outbox, relay_outbox
from batch_assets.outbox.settings import RelaySettings
from batch_assets.outbox.sinks import NatsJetStreamSink, RabbitMQSink

DEFAULT_BROKERS = {"rabbitmq": "amqp://guest:guest@127.0.0.1:5672/%2F", "nats": "nats://127.0.0.1:4222"}
BATCH_SIZE = 500
ROUNDS = 3
_BODY = {"customer_id": "00000000-0000-0000-0000-000000000000", "from_category": "MINOR", "to_category": "ADULT"}


def _reachable(url: str) -> bool:
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or (5672 if parts.scheme == "amqp"
                                                                                 else 4222)), timeout=1).close()
    except OSError:
        return False
    return True


def _insert_events(engine: sa.Engine, n: int) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE outbox_events")
        conn.exec_driver_sql(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload) "
            "SELECT gen_random_uuid(), 'age_category_changed', %(body)s::jsonb FROM generate_series(1, %(n)s)",
            {"n": n, "body": json.dumps(_BODY)},
        )


_AGGREGATE_ID = str(uuid.UUID(int=0))
_CREATED_AT = datetime.now(UTC).isoformat()


def _bodies(lo: int, hi: int) -> list[bytes]:
    """The raw client's messages, serialized as it publishes them: the relay's message (`OutboxEvent.to_message`:
    the same fields, so the same size) with an aggregate id and a created_at of the same length."""
    return [json.dumps({"id": i, "idempotency_key": str(i), "aggregate_id": _AGGREGATE_ID,
                        "event_type": "age_category_changed", "payload": _BODY, "created_at": _CREATED_AT},
                       separators=(",", ":")).encode() for i in range(lo, hi)]


async def _raw_rabbitmq(url: str, n: int, batch: int) -> float:
    import aio_pika

    conn = await aio_pika.connect(url)
    name = f"batch_assets.bench.raw.{uuid.uuid4().hex[:8]}"
    try:
        channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(name, durable=True)
        await queue.bind(exchange, routing_key="#")
        started = time.perf_counter()
        for lo in range(0, n, batch):
            bodies = _bodies(lo, min(n, lo + batch))
            await asyncio.gather(*(exchange.publish(
                aio_pika.Message(b, message_id=f"raw-{lo + i}", type="age_category_changed",
                                 content_type="application/json", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key="age_category_changed", mandatory=True) for i, b in enumerate(bodies)))
        elapsed = time.perf_counter() - started
        await queue.delete(if_unused=False, if_empty=False)
        await exchange.delete()
        return elapsed
    finally:
        await conn.close()


async def _raw_nats(url: str, n: int, batch: int) -> float:
    import nats

    nc = await nats.connect(url)
    name = f"BA_BENCH_RAW_{uuid.uuid4().hex[:8]}"
    try:
        js = nc.jetstream(timeout=30, publish_async_max_pending=100_000)
        await js.add_stream(name=name, subjects=[f"{name}.>"])
        started = time.perf_counter()
        for lo in range(0, n, batch):
            bodies = _bodies(lo, min(n, lo + batch))
            acks = [await js.publish_async(f"{name}.age_category_changed", b, stream=name,
                                           headers={"Nats-Msg-Id": f"raw-{lo + i}"})
                    for i, b in enumerate(bodies)]
            await nc.flush()
            await asyncio.gather(*acks)
        elapsed = time.perf_counter() - started
        await js.delete_stream(name)
        return elapsed
    finally:
        await nc.close()


def _relay_through(engine: sa.Engine, kind: str, url: str, n: int, batch: int) -> float:
    """Seconds to relay n PENDING events through the product's sink of `kind` (names of this run's own)."""
    sink, name = _bench_sink(kind, url)
    _insert_events(engine, n)
    try:
        sink.send_batch([])  # connects and declares, outside the timing as the raw loop's connect is
        started = time.perf_counter()
        result = relay_outbox(engine, sink=sink, owner="bench", settings=RelaySettings(batch_size=batch,
                                                                                        send_timeout_s=30))
        elapsed = time.perf_counter() - started
        if not result.ok or result.sent != n:
            raise RuntimeError(f"the relay sent {result.sent} of {n} ({result.error})")
    finally:
        sink.close()
    _drop(kind, url, name)
    return elapsed


def _bench_sink(kind: str, url: str) -> tuple[Any, str]:
    """The product's sink of `kind` under names of this run's own, and that name (for `_drop`)."""
    suffix = uuid.uuid4().hex[:8]
    if kind == "rabbitmq":
        name = f"batch_assets.bench.relay.{suffix}"
        return RabbitMQSink(url, exchange=name, queue=name, timeout_s=30), name
    name = f"BA_BENCH_RELAY_{suffix}"
    return NatsJetStreamSink(url, stream=name, subject=name, timeout_s=30), name


def drain_broker(brokers: Mapping[str, str] = DEFAULT_BROKERS) -> tuple[str, str] | None:
    """The broker a drain goes to: the first that answers, NATS first (the faster with confirms), or None."""
    for kind in ("nats", "rabbitmq"):
        url = brokers.get(kind)
        if url and _reachable(url):
            return kind, url
    return None


class Drain:
    """A follow-mode relay draining the outbox into a broker (names of its own, deleted at the end) while the
    caller produces events, with the backlog sampled meanwhile: `peak_backlog`, and `wait_empty` for the end."""

    SAMPLE_S = 1.0

    def __init__(self, engine: sa.Engine, kind: str, url: str, batch_size: int = BATCH_SIZE) -> None:
        self.engine, self.kind, self.url = engine, kind, url
        self.sink, self.name = _bench_sink(kind, url)
        self.settings = RelaySettings(batch_size=batch_size, send_timeout_s=30, poll_s=0.5)
        self.peak_backlog = 0
        self.samples = 0
        self._stop = threading.Event()
        self._results: list[Any] = []
        self._relay = threading.Thread(target=self._follow, name="bench-drain-relay", daemon=True)
        self._sampler = threading.Thread(target=self._sample, name="bench-drain-backlog", daemon=True)

    def _follow(self) -> None:
        self._results.append(follow_outbox(self.engine, sink=self.sink, owner="bench-drain", settings=self.settings,
                                           stop=self._stop))

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._observe()
            self._stop.wait(self.SAMPLE_S)

    def _observe(self) -> int:
        pending, _ = backlog(self.engine)
        self.peak_backlog = max(self.peak_backlog, pending)
        self.samples += 1
        return pending

    def __enter__(self) -> Drain:
        self._relay.start()
        self._sampler.start()
        return self

    def wait_empty(self, timeout_s: float) -> bool:
        """Poll the backlog until it is 0 (True) or the deadline passes (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._observe() == 0:
                return True
            self._stop.wait(0.2)
        return False

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._relay.join(timeout=60)
        self._sampler.join(timeout=10)
        self.sink.close()
        _drop(self.kind, self.url, self.name)

    @property
    def failures(self) -> int:
        return sum(r.failures for r in self._results)


def _drop(kind: str, url: str, name: str) -> None:
    async def drop() -> None:
        if kind == "rabbitmq":
            import aio_pika

            conn = await aio_pika.connect(url)
            try:
                channel = await conn.channel()
                await channel.queue_delete(name)
                await channel.exchange_delete(name)
            finally:
                await conn.close()
        else:
            import nats

            nc = await nats.connect(url)
            try:
                await nc.jetstream().delete_stream(name)
            finally:
                await nc.close()

    asyncio.run(drop())


def run_outbox_bench(
    engine: sa.Engine,
    *,
    events: int,
    batch_size: int = BATCH_SIZE,
    brokers: Mapping[str, str] = DEFAULT_BROKERS,
    rounds: int = ROUNDS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """{broker: relay_per_s, raw_per_s, ratio, rounds} with confirms on, or why a broker was not measured.

    Relay and raw client take turns, `rounds` times each, so a burst of other load on the machine hits both
    alike; the rates are the best round of each (the least disturbed), the ratio is best relay / best raw, and
    every round's pair is kept (`per_round`) so the spread shows."""
    out: dict[str, Any] = {}
    raw_loops = {"rabbitmq": _raw_rabbitmq, "nats": _raw_nats}
    for kind, url in brokers.items():
        if not _reachable(url):
            out[kind] = {"status": "not measured", "reason": f"no {kind} at {urlsplit(url).hostname}:"
                                                              f"{urlsplit(url).port}"}
            continue
        pairs = []
        for _ in range(rounds):
            relay_s = _relay_through(engine, kind, url, events, batch_size)
            raw_s = asyncio.run(raw_loops[kind](url, events, batch_size))
            pairs.append((events / relay_s, events / raw_s))
        relay_per_s, raw_per_s = max(p[0] for p in pairs), max(p[1] for p in pairs)
        out[kind] = {"status": "measured", "relay_per_s": round(relay_per_s, 1), "raw_per_s": round(raw_per_s, 1),
                     "ratio": round(relay_per_s / raw_per_s, 3), "rounds": rounds,
                     "per_round": [{"relay_per_s": round(a, 1), "raw_per_s": round(b, 1)} for a, b in pairs]}
        if progress is not None:
            progress(f"  outbox → {kind}: relay {relay_per_s:,.0f} events/s, raw client {raw_per_s:,.0f}/s "
                     f"({relay_per_s / raw_per_s:.2f}×, best of {rounds} rounds each)")
    return out
