"""Acceptance: the resident payment worker through `batch-assets` (docs/reference/cli.md, docs/guide/payment-queue.md).

SIGTERM to a resident `queue work`, `queue stats`, plug-in handlers and `dlq list --csv`,
each driven as a real process against the test's database and a local limits stub.
"""

from __future__ import annotations

import csv
import io
import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cli import (
    COMMON_KEYS,
    EXIT_OK,
    EXIT_USAGE,
    CliProcess,
    assert_summary_keys,
    execute,
    ok,
    rows,
    run_cli,
    scalar,
    wait_for,
)
from helpers import LimitsStub

pytestmark = pytest.mark.integration


@pytest.fixture
def slow_limits() -> Iterator[LimitsStub]:
    """A limits service that answers 200 after 0.2 s."""
    with LimitsStub(delay_s=0.2) as service:
        yield service


@pytest.mark.slow
def test_sigterm_stops_a_resident_worker_and_leaves_nothing_claimed(cli_env, engine, slow_limits, tmp_path):
    """SIGTERM mid-run: exit 0, JSON summary with run_id last, nothing left PROCESSING, unstarted claims unspent."""
    ok(cli_env, "queue", "enqueue", "--count", "400")
    env = dict(cli_env, BATCH_ASSETS_LIMITS_URL=slow_limits.url)
    with CliProcess(env, ["queue", "work", "--concurrency", "8"], tmp_path) as proc:
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM payments WHERE status = 'DONE'") >= 20,
                 timeout=90, what="the resident worker to settle payments", alive=proc)
        proc.signal(signal.SIGTERM)
        result = proc.wait(timeout=90)
    assert result.returncode == EXIT_OK, result.describe()
    s = result.summary
    assert s is not None, result.describe()
    assert_summary_keys(s, COMMON_KEYS)
    assert s["status"] == "SUCCESS" and s["run_id"] and s["stopped_by"] == "stop", s
    counts = dict(rows(engine, "SELECT status, count(*) FROM payments GROUP BY status"))
    assert "PROCESSING" not in counts, counts
    assert counts["DONE"] == s["changed"] and 0 < counts["DONE"] < 400, (counts, s)
    # Claimed but never called: given back with the attempt undone.
    assert scalar(engine, "SELECT count(*) FROM payments WHERE status = 'NEW' AND attempts <> 0") == 0
    assert s["released"] == s["scanned"] - s["changed"], s


def test_queue_stats_prints_counts_oldest_due_dlq_and_breaker(cli_env, engine):
    """`queue stats`: one JSON object with counts by status, oldest_due_s, dlq_size and the recorded breaker."""
    ok(cli_env, "queue", "enqueue", "--count", "3")
    execute(engine, "UPDATE payments SET next_attempt_at = now() - interval '1 hour' "
                    "WHERE id = (SELECT id FROM payments ORDER BY id LIMIT 1)")
    execute(engine, "UPDATE payments SET status = 'FAILED' "
                    "WHERE id = (SELECT id FROM payments ORDER BY id DESC LIMIT 1)")
    stats = ok(cli_env, "queue", "stats")
    assert stats["by_status"] == {"NEW": 2, "PROCESSING": 0, "DONE": 0, "FAILED": 1}, stats
    assert 3590 <= stats["oldest_due_s"] <= 3700, stats
    assert stats["dlq_size"] == 1 and stats["breaker"] == "closed", stats
    execute(engine, "INSERT INTO ba_queue_state (queue, breaker, recorded_by) VALUES ('payments', 'open', 'w1')")
    assert ok(cli_env, "queue", "stats")["breaker"] == "open"
    execute(engine, "UPDATE payments SET status = 'DONE'")
    assert ok(cli_env, "queue", "stats")["oldest_due_s"] == 0


PLUGIN = """
import os
import batch_assets

def handle(*, payment_id, amount_cents, attempts):
    with open(os.environ["PLUGIN_LOG"], "a") as log:
        log.write(f"{payment_id} {amount_cents} {attempts}\\n")
    if amount_cents % 2:
        raise batch_assets.PermanentFailure("odd amounts are rejected")
"""


def test_plugin_handler_through_the_cli(cli_env, engine, tmp_path: Path):
    """BATCH_ASSETS_PAYMENT_HANDLER=module:function: returning → DONE, PermanentFailure → FAILED at once."""
    module = f"ba_cli_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    log = tmp_path / "calls.log"
    env = dict(cli_env, PYTHONPATH=str(tmp_path), PLUGIN_LOG=str(log), BATCH_ASSETS_PAYMENT_HANDLER=f"{module}:handle")
    ok(env, "queue", "enqueue", "--count", "12", "--seed", "3")
    s = ok(env, "queue", "work", "--drain", "--max-seconds", "60")
    assert s["status"] == "SUCCESS" and s["stopped_by"] == "drained", s
    got = {r.id: r for r in rows(engine, "SELECT id, amount_cents, status, attempts, last_error FROM payments")}
    for row in got.values():
        expected = "FAILED" if row.amount_cents % 2 else "DONE"
        assert (row.status, row.attempts) == (expected, 1), row
        if expected == "FAILED":
            assert "odd amounts are rejected" in row.last_error
    calls = sorted(line.split() for line in log.read_text().splitlines())
    assert calls == sorted([str(r.id), str(r.amount_cents), "1"] for r in got.values())


def test_unimportable_plugin_exits_2_before_claiming(cli_env, engine):
    """An unimportable BATCH_ASSETS_PAYMENT_HANDLER: exit 2, the variable named, every payment untouched."""
    ok(cli_env, "queue", "enqueue", "--count", "5")
    env = dict(cli_env, BATCH_ASSETS_PAYMENT_HANDLER="ba_no_such_module_xyz:handle")
    result = run_cli(env, "queue", "work", "--drain")
    assert result.returncode == EXIT_USAGE, result.describe()
    assert "BATCH_ASSETS_PAYMENT_HANDLER" in result.stderr
    assert rows(engine, "SELECT status, attempts, count(*) FROM payments GROUP BY 1, 2") == [("NEW", 0, 5)]


def test_db_outage_bound_is_validated_before_claiming(cli_env, engine):
    """--db-outage-s above 600, negative or not a whole number: exit 2, one line naming it, nothing claimed."""
    ok(cli_env, "queue", "enqueue", "--count", "3")
    for value in ("601", "-1", "1.5", "６０"):
        result = run_cli(cli_env, "queue", "work", "--drain", "--db-outage-s", value)
        assert result.returncode == EXIT_USAGE, result.describe()
        assert "db-outage-s" in result.stderr or "db_outage_s" in result.stderr, result.describe()
    assert rows(engine, "SELECT status, attempts, count(*) FROM payments GROUP BY 1, 2") == [("NEW", 0, 3)]


def test_enqueue_priority_and_its_bounds(cli_env, engine):
    """`queue enqueue --priority P` writes P; a value outside smallint is exit 2 with nothing inserted."""
    ok(cli_env, "queue", "enqueue", "--count", "2", "--priority", "7")
    assert rows(engine, "SELECT priority, count(*) FROM payments GROUP BY 1") == [(7, 2)]
    result = run_cli(cli_env, "queue", "enqueue", "--count", "2", "--priority", "99999")
    assert result.returncode == EXIT_USAGE, result.describe()
    assert scalar(engine, "SELECT count(*) FROM payments") == 2


def test_dlq_list_csv(cli_env, engine):
    """`queue dlq list --csv` writes every FAILED payment as CSV (header once), paged by id."""
    ok(cli_env, "queue", "enqueue", "--count", "5")
    execute(engine, "UPDATE payments SET status = 'FAILED', attempts = 5, last_error = 'HTTP 400, \"bad\"' "
                    "WHERE id IN (SELECT id FROM payments ORDER BY id LIMIT 3)")
    result = run_cli(cli_env, "queue", "dlq", "list", "--csv")
    assert result.returncode == EXIT_OK, result.describe()
    table = list(csv.DictReader(io.StringIO(result.stdout)))
    failed = [str(r[0]) for r in rows(engine, "SELECT id FROM payments WHERE status = 'FAILED' ORDER BY id")]
    assert [r["id"] for r in table] == failed
    assert {r["last_error"] for r in table} == {'HTTP 400, "bad"'} and {r["attempts"] for r in table} == {"5"}
    limited = run_cli(cli_env, "queue", "dlq", "list", "--csv", "--limit", "2")
    assert len(list(csv.DictReader(io.StringIO(limited.stdout)))) == 2
    assert json.loads(run_cli(cli_env, "queue", "dlq", "list").stdout.strip().splitlines()[-1])["count"] == 3
