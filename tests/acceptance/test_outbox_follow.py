"""Acceptance, a real process: `outbox relay --follow` relays events as they are written and stops on SIGTERM."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pytest
from _cli import EXIT_OK, CliProcess, assert_summary_keys, execute, run_cli, scalar, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _write_events(engine, n: int) -> None:
    """Events inserted directly, the way the sweep's page transaction writes them."""
    execute(engine, "INSERT INTO outbox_events (aggregate_id, event_type, payload) "
                    "SELECT id, 'age_category_changed', jsonb_build_object('customer_id', id, 'from_category', "
                    "'MINOR', 'to_category', 'YOUNG_ADULT') FROM unnest(CAST(:ids AS uuid[])) AS id",
            ids=[uuid.uuid4() for _ in range(n)])


def _sent(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM outbox_events WHERE status = 'SENT'")


def test_relay_follow_sends_events_written_while_it_runs_and_stops_cleanly_on_sigterm(cli_env, engine, tmp_path):
    """--follow drains the backlog, then relays each later insert (woken by its notification); SIGTERM ends it
    with exit 0 and a SUCCESS summary; every event is in the sink once per delivery, keyed by its id."""
    _write_events(engine, 25)
    with CliProcess(cli_env, ["outbox", "relay", "--follow", "--batch-size", "10"], tmp_path) as relay:
        wait_for(lambda: _sent(engine) == 25, timeout=120, what="the backlog to be relayed", alive=relay)
        for round_ in range(3):  # the relay is idle and waiting: each insert must wake it
            _write_events(engine, 4)
            wait_for(lambda r=round_: _sent(engine) == 25 + 4 * (r + 1), timeout=20,
                     what=f"the events of round {round_} to be relayed", alive=relay)
        relay.signal(signal.SIGTERM)
        result = relay.wait(timeout=60)
    assert result.returncode == EXIT_OK, result.describe()
    assert_summary_keys(result.summary)
    assert result.summary["status"] == "SUCCESS" and result.summary["sent"] == 37
    sink = next(Path(cli_env["BATCH_ASSETS_HOME"]).rglob("outbox.jsonl"))
    messages = [json.loads(line) for line in sink.read_text().splitlines()]
    ids = {m["idempotency_key"] for m in messages}
    assert len(ids) == 37 == scalar(engine, "SELECT count(*) FROM outbox_events")
    assert all(m["idempotency_key"] == str(m["id"]) for m in messages)


def test_after_kill_9_of_a_following_relay_the_next_relay_is_not_locked_out(cli_env, engine, tmp_path):
    """A relay killed with SIGKILL leaves its lock and lease behind; the next relay takes them over at once
    (same host, process gone) instead of being skipped for lock-at-most-for, and relays what is pending."""
    _write_events(engine, 5)
    with CliProcess(cli_env, ["outbox", "relay", "--follow"], tmp_path) as relay:
        wait_for(lambda: _sent(engine) == 5, timeout=120, what="the first events to be relayed", alive=relay)
        relay.signal(signal.SIGKILL)
        relay.wait(timeout=30)
    assert scalar(engine, "SELECT count(*) FROM ba_job_locks WHERE name = 'outbox_relay' AND lock_until > now()") == 1
    _write_events(engine, 3)
    result = run_cli(cli_env, "outbox", "relay")
    assert result.returncode == EXIT_OK, result.describe()
    assert result.summary["status"] == "SUCCESS" and result.summary["sent"] == 3


BAD_SINKS = ["", "  ", "ftp://127.0.0.1/outbox", "kafka://127.0.0.1:9092", "file:", "amqp://", "nats://:4222",
             "amqp://guest:s3cret@127.0.0.1:99999/%2F", "outbox.jsonl"]


def test_a_bad_outbox_sink_is_exit_2_naming_the_variable_and_nothing_is_sent(cli_env, engine, tmp_path):
    """Empty, an unknown scheme, no host or path, a bad port: exit 2 with one line naming BATCH_ASSETS_OUTBOX_SINK
    (never repeating the value, which may hold a password); no event leaves PENDING."""
    _write_events(engine, 3)
    for value in BAD_SINKS:
        result = run_cli({**cli_env, "BATCH_ASSETS_OUTBOX_SINK": value}, "outbox", "relay")
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and "BATCH_ASSETS_OUTBOX_SINK" in lines[-1], (value, result.describe())
        assert "Traceback" not in result.stderr and "s3cret" not in result.stderr + result.stdout
    assert _sent(engine) == 0


def test_the_outbox_sink_variable_chooses_the_file_and_the_lock_redis_url_does_not(cli_env, engine, tmp_path):
    """BATCH_ASSETS_OUTBOX_SINK=file:PATH sends there even with the lock's BATCH_ASSETS_REDIS_URL set, whose
    stream receives nothing."""
    import redis

    client = redis.Redis.from_url("redis://127.0.0.1:6379/14", socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    client.delete("batch_assets.outbox")
    _write_events(engine, 7)
    target = tmp_path / "elsewhere" / "events.jsonl"
    env = {**cli_env, "BATCH_ASSETS_REDIS_URL": "redis://127.0.0.1:6379/14",
           "BATCH_ASSETS_OUTBOX_SINK": f"file:{target}"}
    try:
        result = run_cli(env, "outbox", "relay")
        assert result.returncode == EXIT_OK, result.describe()
        ids = sorted(json.loads(line)["id"] for line in target.read_text().splitlines())
        assert len(ids) == 7 and _sent(engine) == 7
        assert client.xlen("batch_assets.outbox") == 0
    finally:
        client.delete("batch_assets.outbox")
        client.close()
