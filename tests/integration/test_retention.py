"""Retention (docs/production/operations.md): what is old and finished goes, in short batches; nothing needed is
deleted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sqlalchemy as sa

from batch_assets.retention.prune import RetentionSettings, run_retention

pytestmark = pytest.mark.integration

# :n, :status, :age_days — outbox events created (and, when SENT, sent) :age_days ago.
PUT_EVENTS = sa.text(
    "INSERT INTO outbox_events (aggregate_id, event_type, payload, status, created_at, sent_at, attempts) "
    "SELECT gen_random_uuid(), 'x', '{}'::jsonb, :status, now() - make_interval(days => :age_days), "
    "CASE WHEN :status = 'SENT' THEN now() - make_interval(days => :age_days) END, 0 FROM generate_series(1, :n)"
)
# :run_id, :age_days
PUT_HISTORY = sa.text(
    "INSERT INTO ba_run_history (run_id, job, status, started_at, finished_at, summary) VALUES "
    "(:run_id, 'j', 'SUCCESS', now() - make_interval(days => :age_days), now() - make_interval(days => :age_days), "
    "'{}'::jsonb)"
)
# :range_key, :status, :generation, :age_days
PUT_CHECKPOINT = sa.text(
    "INSERT INTO ba_checkpoints (sweep, mode, range_key, status, counters, updated_at, generation) VALUES "
    "('s', 'full', :range_key, :status, '{}'::jsonb, now() - make_interval(days => :age_days), :generation)"
)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "batch_assets.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def _counts(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()  # noqa: S608 - fixed names
                for t in ("outbox_events", "ba_run_history", "ba_checkpoints", "customers")}


def _fill(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(PUT_EVENTS, {"n": 5, "status": "SENT", "age_days": 40})
        conn.execute(PUT_EVENTS, {"n": 3, "status": "SENT", "age_days": 1})
        conn.execute(PUT_EVENTS, {"n": 4, "status": "PENDING", "age_days": 40})
        conn.execute(PUT_HISTORY, {"run_id": "old", "age_days": 40})
        conn.execute(PUT_HISTORY, {"run_id": "recent", "age_days": 2})
        # a finished generation (every range DONE), old: goes
        conn.execute(PUT_CHECKPOINT, {"range_key": "a1", "status": "DONE", "generation": "A", "age_days": 40})
        conn.execute(PUT_CHECKPOINT, {"range_key": "a2", "status": "DONE", "generation": "A", "age_days": 41})
        # an unfinished generation, old: every row stays, its DONE range included
        conn.execute(PUT_CHECKPOINT, {"range_key": "b1", "status": "DONE", "generation": "B", "age_days": 40})
        conn.execute(PUT_CHECKPOINT, {"range_key": "b2", "status": "RUNNING", "generation": "B", "age_days": 40})
        # a finished generation written recently: stays
        conn.execute(PUT_CHECKPOINT, {"range_key": "c1", "status": "DONE", "generation": "C", "age_days": 1})
        # the engine on its own (no generation): DONE and old goes, RUNNING stays
        conn.execute(PUT_CHECKPOINT, {"range_key": "n1", "status": "DONE", "generation": None, "age_days": 40})
        conn.execute(PUT_CHECKPOINT, {"range_key": "n2", "status": "RUNNING", "generation": None, "age_days": 40})


def test_retention_run_deletes_only_old_finished_rows(cli_env: dict[str, str], engine: sa.Engine) -> None:
    """SENT events, history and finished generations older than 30 days go; PENDING, recent and unfinished stay."""
    _fill(engine)
    before = _counts(engine)
    done = _cli(cli_env, "retention", "run")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "SUCCESS"
    assert summary["deleted"] == {"outbox_events": 5, "ba_run_history": 1, "ba_checkpoints": 3}
    after = _counts(engine)
    assert after["customers"] == before["customers"]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT status, count(*) FROM outbox_events GROUP BY 1 ORDER BY 1")).all() == \
            [("PENDING", 4), ("SENT", 3)]
        kept = conn.execute(sa.text("SELECT range_key FROM ba_checkpoints WHERE sweep = 's' ORDER BY 1")).scalars()
        assert list(kept) == ["b1", "b2", "c1", "n2"]
        assert "recent" in conn.execute(sa.text("SELECT array_agg(run_id) FROM ba_run_history")).scalar_one()


@pytest.mark.parametrize("value", ["", "-1", "abc", "0"])
def test_bad_older_than_days_exits_2_naming_the_field(cli_env: dict[str, str], engine: sa.Engine, value: str) -> None:
    """`--older-than-days` empty, negative, not a number or 0: exit 2, one line naming the field, nothing deleted."""
    _fill(engine)
    before = _counts(engine)
    done = _cli(cli_env, "retention", "run", "--older-than-days", value)
    assert done.returncode == 2, done.stderr
    assert "older_than_days" in done.stderr
    assert _counts(engine) == before


def test_a_million_sent_events_are_pruned_in_short_transactions(engine: sa.Engine) -> None:
    """1M old SENT events (and PENDING ones between them) are deleted in batches of 5,000, each well under a second."""
    with engine.begin() as conn:
        conn.execute(PUT_EVENTS, {"n": 500_000, "status": "SENT", "age_days": 40})
        conn.execute(PUT_EVENTS, {"n": 1_000, "status": "PENDING", "age_days": 40})
        conn.execute(PUT_EVENTS, {"n": 500_000, "status": "SENT", "age_days": 40})
    result = run_retention(engine, RetentionSettings(batch_size=5_000))
    assert result.deleted["outbox_events"] == 1_000_000
    assert result.batches >= 200
    assert result.longest_batch_s < 1.0, result.longest_batch_s
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox_events WHERE status = 'PENDING'")).scalar_one() == 1000
