"""The outbox sinks against the real local brokers (RabbitMQ, NATS JetStream, Redis, a file): every event of a
relay pass delivered with its id, a broker that is down or never confirms leaves events PENDING and loses none,
and a consumer that dedupes by id sees each event exactly once when the relay sends again."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from brokers import (
    AMQP_URL,
    NATS_URL,
    REDIS_URL,
    Delivered,
    address,
    closed_port_url,
    nats_delete,
    nats_read,
    proxied_url,
    rabbit_delete,
    rabbit_read,
    redis_delete,
    redis_read,
    require,
    unique_name,
)
from helpers import TcpProxy

from batch_assets.outbox.event import OutboxEvent
from batch_assets.outbox.relay import relay_batch, relay_outbox
from batch_assets.outbox.settings import RelaySettings
from batch_assets.outbox.sinks import (
    JsonLinesSink,
    NatsJetStreamSink,
    RabbitMQSink,
    RedisStreamSink,
    Sink,
    SinkNotConfirmed,
)

pytestmark = pytest.mark.integration


@dataclass
class Broker:
    """One real broker for one test: its sink (at any URL), a consumer reading back what it holds, cleanup."""

    kind: str
    url: str
    make: Callable[[str, float], Sink]
    read: Callable[[], list[Delivered]]
    cleanup: Callable[[], None]

    def sink(self, url: str | None = None, timeout_s: float = 10.0) -> Sink:
        return self.make(url or self.url, timeout_s)


def _rabbitmq() -> Broker:
    require(AMQP_URL, "RabbitMQ")
    exchange, queue = unique_name("batch_assets.test.x"), unique_name("batch_assets.test.q")
    return Broker("rabbitmq", AMQP_URL,
                  lambda url, t: RabbitMQSink(url, exchange=exchange, queue=queue, timeout_s=t),
                  lambda: rabbit_read(queue), lambda: rabbit_delete(exchange, queue))


def _nats() -> Broker:
    require(NATS_URL, "NATS")
    stream, subject = unique_name("BA_TEST").replace(".", "_"), unique_name("batch_assets.test")
    return Broker("nats", NATS_URL, lambda url, t: NatsJetStreamSink(url, stream=stream, subject=subject, timeout_s=t),
                  lambda: nats_read(stream), lambda: nats_delete(stream))


def _redis() -> Broker:
    require(REDIS_URL, "Redis")
    stream = unique_name("batch_assets.test")
    return Broker("redis", REDIS_URL, lambda url, t: RedisStreamSink(url, stream=stream, timeout_s=t),
                  lambda: redis_read(stream), lambda: redis_delete(stream))


BROKERS = {"rabbitmq": _rabbitmq, "nats": _nats, "redis": _redis}


@pytest.fixture(params=sorted(BROKERS))
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    made = BROKERS[request.param]()
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture(params=["rabbitmq", "nats"])
def real_broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """The two brokers with confirms of their own (publisher confirms, PubAcks)."""
    made = BROKERS[request.param]()
    try:
        yield made
    finally:
        made.cleanup()


def _add_events(engine: sa.Engine, n: int) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload) "
            "SELECT id, 'age_category_changed', jsonb_build_object('customer_id', id, 'to_category', 'ADULT') "
            "FROM unnest(CAST(%(ids)s AS uuid[])) AS id",
            {"ids": [uuid.uuid4() for _ in range(n)]},
        )


def _ids(engine: sa.Engine, status: str | None = None) -> set[int]:
    with engine.connect() as conn:
        if status is None:
            return {int(i) for (i,) in conn.exec_driver_sql("SELECT id FROM outbox_events")}
        return {int(i) for (i,) in conn.exec_driver_sql(
            "SELECT id FROM outbox_events WHERE status = %(s)s", {"s": status})}


def _drain(engine: sa.Engine, sink: Sink, batch_size: int = 100) -> None:
    result = relay_outbox(engine, sink=sink, batch_size=batch_size)
    assert result.ok, result.error


def test_each_sink_delivers_every_event_with_its_id_while_events_are_written(
    engine: sa.Engine, broker: Broker
) -> None:
    """Relay passes while another connection writes events: the consumer reads every event once, keyed by its id
    (message_id / Nats-Msg-Id / the entry's idempotency key), persistent, and every event ends SENT."""
    _add_events(engine, 300)
    sink = broker.sink()
    done = threading.Event()

    def write() -> None:
        try:
            for _ in range(10):
                _add_events(engine, 25)
        finally:
            done.set()

    writer = threading.Thread(target=write)
    try:
        writer.start()
        while not done.is_set():
            _drain(engine, sink, batch_size=40)
        writer.join()
        _drain(engine, sink, batch_size=40)
    finally:
        sink.close()
    delivered = broker.read()
    assert len(_ids(engine)) == 550
    assert _ids(engine, "SENT") == _ids(engine)
    assert Counter(d.event_id for d in delivered) == Counter(_ids(engine))
    assert all(d.key == str(d.event_id) and d.persistent for d in delivered)


def test_the_file_sink_delivers_every_event_with_its_id(engine: sa.Engine, tmp_path: Path) -> None:
    """The JSON-lines sink behind the same protocol: every event once, with its id as idempotency key."""
    _add_events(engine, 120)
    sink = JsonLinesSink(tmp_path / "o.jsonl")
    _drain(engine, sink, batch_size=50)
    lines = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert sorted(m["id"] for m in lines) == sorted(_ids(engine)) and all(m["idempotency_key"] == str(m["id"])
                                                                          for m in lines)


@pytest.mark.parametrize("fault", ["closed_port", "resets", "confirm_never_arrives"])
def test_a_broker_that_is_down_or_silent_leaves_events_pending_and_the_next_pass_delivers_them(
    engine: sa.Engine, real_broker: Broker, fault: str
) -> None:
    """Unreachable (closed port), resetting every connection, or taking the batch on an open connection and
    never confirming it (timeout): the pass fails, every event stays PENDING, none is lost; after recovery the
    next pass delivers every event, each with its id (the unconfirmed batch twice in RabbitMQ, once in JetStream
    which dedupes on Nats-Msg-Id; never another id)."""
    _add_events(engine, 200)
    proxy = TcpProxy(address(real_broker.url))
    timeout_s = 1.5
    if fault == "closed_port":
        down = real_broker.sink(closed_port_url(real_broker.url), timeout_s)
        sink = real_broker.sink(timeout_s=timeout_s)
    else:
        down = sink = real_broker.sink(proxied_url(real_broker.url, proxy.port), timeout_s)
    try:
        if fault == "confirm_never_arrives":
            proxy.mode = "up"
            relay_batch(engine, sink=sink, owner="relay", settings=RelaySettings(batch_size=20, send_timeout_s=5))
            proxy.mode = "mute"  # the broker gets the publishes; their confirms / PubAcks are held back
        sent_before = _ids(engine, "SENT")
        result = relay_outbox(engine, sink=down, settings=RelaySettings(batch_size=50, send_timeout_s=timeout_s))
        assert not result.ok and result.sent == 0
        assert _ids(engine, "SENT") == sent_before and len(_ids(engine, "PENDING")) == 200 - len(sent_before)
        with engine.connect() as conn:  # the failed batch's claim was given back: the next pass retries at once
            assert conn.exec_driver_sql("SELECT count(*) FROM outbox_events WHERE claimed_by IS NOT NULL").scalar() == 0
        proxy.mode = "up"
        _drain(engine, sink, batch_size=50)
    finally:
        for s in {id(down): down, id(sink): sink}.values():
            s.close()
        proxy.close()
    delivered = real_broker.read()
    assert _ids(engine, "SENT") == _ids(engine)
    assert {d.event_id for d in delivered} == _ids(engine)  # at least once: 0 lost
    assert all(d.key == str(d.event_id) for d in delivered)  # a duplicate only ever carries the same id
    if fault == "confirm_never_arrives":  # the broker had taken the unconfirmed batch of 50
        assert len(delivered) == (250 if real_broker.kind == "rabbitmq" else 200)


class _LeaseLapsesDuringSend:
    """A real sink in front of which the first batch's claim lease passes while it is being sent, and a second
    relay takes and sends the batch again: the first relay's confirmed batch is not marked SENT by it."""

    def __init__(self, inner: Sink, engine: sa.Engine, other: Sink) -> None:
        self.inner, self.engine, self.other = inner, engine, other
        self.fired = False

    def send_batch(self, events: Sequence[OutboxEvent]) -> None:
        self.inner.send_batch(events)  # confirmed by the broker
        if not self.fired:
            self.fired = True
            with self.engine.begin() as conn:  # the passage of time: relay-a's claim lease is over
                conn.exec_driver_sql("UPDATE outbox_events SET claimed_until = now() - interval '1 second'")
            relay_outbox(self.engine, sink=self.other, owner="relay-b", settings=RelaySettings(batch_size=30))

    def close(self) -> None:
        self.inner.close()


def test_a_consumer_that_dedupes_by_id_sees_every_event_once_when_the_relay_sends_again(
    engine: sa.Engine, broker: Broker
) -> None:
    """A claim lease that lapsed mid-send makes two relays send the same batch (confirmed, not marked SENT by
    the first): the broker holds duplicates only with the same id (JetStream drops them itself on Nats-Msg-Id),
    and a consumer that keeps the ids it saw gets every event exactly once."""
    _add_events(engine, 90)
    first, second = broker.sink(), broker.sink()
    try:
        sink = _LeaseLapsesDuringSend(first, engine, second)
        claimed, marked = relay_batch(engine, sink=sink, owner="relay-a", settings=RelaySettings(batch_size=30))
        assert (claimed, marked) == (30, 0)  # fenced: relay-b owns those rows now and marked them SENT
        _drain(engine, first)
    finally:
        first.close()
        second.close()
    delivered = broker.read()
    raw = Counter(d.event_id for d in delivered)
    assert set(raw) == _ids(engine) == _ids(engine, "SENT")
    assert all(d.key == str(d.event_id) for d in delivered)
    if broker.kind == "nats":
        assert max(raw.values()) == 1  # the broker's own dedupe on Nats-Msg-Id
    else:
        assert sum(raw.values()) == 90 + 30  # the first batch arrived twice ...
    seen: set[str] = set()
    once = [d for d in delivered if d.key not in seen and not seen.add(d.key)]  # type: ignore[func-returns-value]
    assert sorted(d.event_id for d in once) == sorted(_ids(engine))  # ... and the deduping consumer sees it once


def test_an_unroutable_rabbitmq_message_is_not_confirmed_and_stays_pending(engine: sa.Engine) -> None:
    """With no queue bound (the exchange routes nowhere) RabbitMQ returns the mandatory messages: nothing is
    confirmed, nothing is marked SENT."""
    require(AMQP_URL, "RabbitMQ")
    exchange = unique_name("batch_assets.test.x")
    _add_events(engine, 5)
    sink = RabbitMQSink(AMQP_URL, exchange=exchange, queue="", timeout_s=5)
    try:
        with pytest.raises(SinkNotConfirmed) as info:
            relay_batch(engine, sink=sink, owner="relay", settings=RelaySettings(batch_size=10))
        assert info.value.confirmed == frozenset()
        assert len(_ids(engine, "PENDING")) == 5
    finally:
        sink.close()
        rabbit_delete(exchange, unique_name("none"))
