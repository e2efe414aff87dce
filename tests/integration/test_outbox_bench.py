"""The bench's outbox section: events/s to each real broker with confirms, beside the raw client; the checker
accepts it (and a report without it) and catches a ratio that is not relay / raw; the table shows it."""

from __future__ import annotations

import copy
import json
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from brokers import AMQP_URL, NATS_URL, reachable, require

from batch_assets.bench import check, render
from batch_assets.bench.outbox import drain_section
from batch_assets.bench.outbox_relay import run_outbox_bench

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


def test_the_drain_relays_a_first_computation_as_it_runs_and_the_checker_holds_its_counts(
    server_url: str, cipher: Any
) -> None:
    """A first computation of 3,000 rows with a follow-mode relay beside it: every event reaches the broker and is
    SENT, the backlog empties after the sweep ends, the peak backlog was sampled; the checker accepts the section
    and names a drain that lost events; the table says it."""
    if not (reachable(NATS_URL) or reachable(AMQP_URL)):
        pytest.skip("no broker (NATS or RabbitMQ) answers")
    drain = drain_section(server_url, cipher, date(2026, 6, 15), rows=3000, workers=2, progress=None)
    assert drain["status"] == "measured" and drain["broker"] in {"nats", "rabbitmq"}
    assert drain["events"] == drain["sent"] == 3000 and drain["relay_failures"] == 0
    assert drain["drained_s"] >= drain["sweep_s"] > 0 and drain["backlog_samples"] >= 1
    assert 0 <= drain["peak_backlog"] <= 3000
    report = json.loads(COMMITTED.read_text())
    report["rows"] = 3000  # the drain's size follows --rows (up to 1M)
    report["outbox"] = {"status": "measured", "events": 1000, "batch_size": 250, "brokers": {
        "nats": {"status": "not measured", "reason": "not in this test"}}, "drain": drain}
    assert [p for p in check.check_report(report) if p.startswith("outbox")] == []
    assert "Drain of a first computation: 3,000 events" in render.tables(report)
    lost = copy.deepcopy(report)
    lost["outbox"]["drain"]["sent"] = 2999
    assert [p for p in check.check_report(lost) if p.startswith("outbox")] == [
        "outbox.drain: a first computation of 3000 rows must make and send as many events, got events=3000 sent=2999"]
