"""The bench's outbox section: events/s to each real broker with confirms, beside the raw client; the checker
accepts it (and a report without it) and catches a ratio that is not relay / raw; the table shows it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from brokers import AMQP_URL, NATS_URL, require

from batch_assets.bench import check, render
from batch_assets.domains.outbox.benchmark import run_outbox_bench

pytestmark = pytest.mark.integration

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "bench" / "latest.json"


def test_the_outbox_section_measures_both_brokers_and_the_checker_holds_it_to_relay_over_raw(
    engine: sa.Engine,
) -> None:
    """1,000 events through RabbitMQ and JetStream, each beside its raw client: positive rates, ratio = relay /
    raw, every event SENT; the checker passes the committed report with the section added and fails a wrong
    ratio; the table gets an outbox row per broker."""
    require(AMQP_URL, "RabbitMQ")
    require(NATS_URL, "NATS")
    brokers = run_outbox_bench(engine, events=1000, batch_size=250,
                               brokers={"rabbitmq": AMQP_URL, "nats": NATS_URL})
    assert {b["status"] for b in brokers.values()} == {"measured"}
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM outbox_events WHERE status = 'SENT'").scalar() == 1000
    report = json.loads(COMMITTED.read_text())
    assert check.check_report(report) == []  # the committed report, without the section
    report["outbox"] = {"status": "measured", "events": 1000, "batch_size": 250, "brokers": brokers}
    assert check.check_report(report) == []
    table = render.tables(report)
    assert "### Outbox" in table and "| rabbitmq |" in table and "| nats |" in table
    wrong = copy.deepcopy(report)
    wrong["outbox"]["brokers"]["nats"]["ratio"] *= 2
    assert check.check_report(wrong) == ["outbox.brokers.nats.ratio is not relay_per_s / raw_per_s"]
