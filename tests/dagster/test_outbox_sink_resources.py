"""The outbox sink is a resource the definitions choose by BATCH_ASSETS_OUTBOX_SINK (never the lock's Redis URL);
the relay job delivers through it, and the backlog check warns past its threshold and passes once drained."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from brokers import NATS_URL, nats_delete, nats_read, require, unique_name

from batch_assets.definitions import defs as load_defs
from batch_assets.orchestration.outbox_job import (
    FileSinkResource,
    NatsSinkResource,
    RabbitMQSinkResource,
    RedisSinkResource,
)
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]


@pytest.mark.parametrize(("value", "chosen"), [
    (None, FileSinkResource),
    ("file:/tmp/outbox-test.jsonl", FileSinkResource),
    ("redis://127.0.0.1:6379/15", RedisSinkResource),
    ("amqp://guest:guest@127.0.0.1:5672/%2F", RabbitMQSinkResource),
    ("nats://127.0.0.1:4222", NatsSinkResource),
])
def test_the_definitions_choose_the_sink_resource_by_the_outbox_sink_variable(
    dagster_env: Settings, monkeypatch: pytest.MonkeyPatch, value: str | None, chosen: type
) -> None:
    """One resource class per sink, chosen when the code location loads; the lock's BATCH_ASSETS_REDIS_URL
    chooses nothing; a broker URL reaches the resource as an EnvVar (shown by name, never by value)."""
    monkeypatch.setenv("BATCH_ASSETS_REDIS_URL", "redis://127.0.0.1:6379/15")
    if value is None:
        monkeypatch.delenv("BATCH_ASSETS_OUTBOX_SINK", raising=False)
    else:
        monkeypatch.setenv("BATCH_ASSETS_OUTBOX_SINK", value)
    resources: Any = load_defs().resources
    sink = resources["outbox_sink"]
    assert type(sink) is chosen
    if chosen is FileSinkResource:
        expected = "/tmp/outbox-test.jsonl" if value else str(dagster_env.home / "outbox.jsonl")
        assert sink.path == expected
    else:
        assert isinstance(sink.url, dg.EnvVar) and sink.url.env_var_name == "BATCH_ASSETS_OUTBOX_SINK"


@pytest.fixture
def nats_names() -> Iterator[tuple[str, str]]:
    require(NATS_URL, "NATS")
    stream = unique_name("BA_TEST").replace(".", "_")
    try:
        yield stream, unique_name("batch_assets.test")
    finally:
        nats_delete(stream)


def _add_events(engine: sa.Engine, n: int) -> set[int]:
    with engine.begin() as conn:
        return {int(i) for (i,) in conn.exec_driver_sql(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload) "
            "SELECT gen_random_uuid(), 'age_category_changed', '{}'::jsonb FROM generate_series(1, %(n)s) "
            "RETURNING id", {"n": n})}


def _backlog_check(instance: dg.DagsterInstance, max_pending: int) -> dg.AssetCheckEvaluation:
    job = load_defs().resolve_job_def("asset_checks_job")
    config = {"ops": {"outbox_events_outbox_backlog": {"config": {"max_pending": max_pending}}}}
    result = job.execute_in_process(instance=instance, run_config=config)
    assert result.success
    (evaluation,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "outbox_backlog"]
    return evaluation


def test_the_relay_job_delivers_to_nats_and_the_backlog_check_warns_then_passes(
    dagster_env: Settings, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, nats_names: tuple[str, str]
) -> None:
    """BATCH_ASSETS_OUTBOX_SINK=nats://: 60 PENDING events put outbox_backlog at WARN (threshold 50); the relay
    job sends every one to JetStream with its Nats-Msg-Id, and the check passes again."""
    stream, subject = nats_names
    monkeypatch.setenv("BATCH_ASSETS_OUTBOX_SINK", NATS_URL)
    ids = _add_events(engine, 60)
    with dg.instance_for_test() as instance:
        before = _backlog_check(instance, max_pending=50)
        assert (before.passed, before.severity) == (False, dg.AssetCheckSeverity.WARN)
        assert before.metadata["pending"].value == 60
        relay = load_defs().resolve_job_def("outbox_relay_job").execute_in_process(
            instance=instance,
            run_config={
                "ops": {"relay_outbox_events": {"config": {"batch_size": 25}}},
                "resources": {"outbox_sink": {"config": {
                    "url": {"env": "BATCH_ASSETS_OUTBOX_SINK"}, "stream": stream, "subject": subject}}},
            },
        )
        assert relay.success
        after = _backlog_check(instance, max_pending=50)
    assert after.passed and after.metadata["pending"].value == 0
    delivered = nats_read(stream)
    assert sorted(d.event_id for d in delivered) == sorted(ids)
    assert all(d.key == str(d.event_id) for d in delivered)
