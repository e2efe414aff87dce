"""Acceptance: no secret (key, database password, decrypted date of birth) in the CLI's output or Dagster's logs."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from _cli import (
    classify,
    dagster_event_text,
    rows,
    run_cli,
    summary_run_date,
    today_utc,
)
from sqlalchemy.engine import make_url

pytestmark = pytest.mark.integration


def url_with_password(db_url: str, password: str) -> str | None:
    """The test database URL with a password, if the server accepts the connection with it."""
    url = make_url(db_url).set(password=password).render_as_string(hide_password=False)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError:
        return None
    finally:
        engine.dispose()
    return url


def test_no_secret_in_stdout_stderr_or_the_dagster_event_log(cli_env, db_url, engine, cipher, key_text):
    """Key text, database password and decrypted DOBs never appear in output, the event log or the instance files."""
    password = "pw-" + uuid.uuid4().hex
    env = dict(cli_env)
    with_password = url_with_password(db_url, password)
    if with_password is not None:
        env["BATCH_ASSETS_DATABASE_URL"] = with_password
    else:
        password = None

    results = [run_cli(env, "seed", "customers", "--rows", "400", "--bad-fraction", "0.1", "--seed", "51")]
    assert results[0].returncode == 0, results[0].describe()
    run_date = summary_run_date(results[0].summary)
    for mode in ("full", "delta"):
        results.append(run_cli(env, "sweep", "customer-status", "--mode", mode, "--run-date", run_date.isoformat()))
    results.append(run_cli(env, "outbox", "relay"))
    # Failure paths print the most: a wrong key (breaker), a missing key, an unreachable lock store.
    from batch_assets.reference.customer_status.crypto import generate_key_text

    results.append(run_cli(dict(env, BATCH_ASSETS_ENCRYPTION_KEY=generate_key_text()),
                           "sweep", "customer-status", "--mode", "full"))
    results.append(run_cli(dict(env, BATCH_ASSETS_REDIS_URL="redis://127.0.0.1:1/0"),
                           "sweep", "customer-status", "--mode", "full"))
    bad_key_env = dict(env, BATCH_ASSETS_ENCRYPTION_KEY=key_text[:-4] + "!!!!")
    results.append(run_cli(bad_key_env, "sweep", "customer-status", "--mode", "full"))
    assert [r.returncode for r in results[:4]] == [0, 0, 0, 0], "\n".join(r.describe() for r in results)
    assert all(r.returncode != 0 for r in results[4:]), "\n".join(r.describe() for r in results[4:])

    truth = classify(engine, cipher, run_date)
    assert len(truth.good) > 300
    # Dates that may appear legitimately (the run date, today's timestamps) are not evidence of a leak.
    harmless = {(d + timedelta(days=k)).isoformat() for d in (run_date, today_utc()) for k in (-1, 0, 1)}
    dobs = {dob.isoformat() for dob in truth.good.values()} - harmless
    stored = [r.age_category for r in rows(engine, "SELECT age_category FROM customers")]
    assert any(stored), "the sweep ran"

    secrets = {"the encryption key": [key_text, key_text.rstrip("=")]}
    if password:
        secrets["the database password"] = [password]
    output = "\n".join(r.stdout + "\n" + r.stderr for r in results)
    run_count, events = dagster_event_text(Path(env["BATCH_ASSETS_HOME"]))
    assert run_count >= 4, "the job commands ran as Dagster runs on the CLI's instance"
    instance_files = "\n".join(
        p.read_bytes().decode("latin-1") for p in Path(env["BATCH_ASSETS_HOME"]).rglob("*") if p.is_file()
    )
    for where, text in (("stdout/stderr", output), ("the Dagster event log", events),
                        ("the files under BATCH_ASSETS_HOME", instance_files)):
        for name, values in secrets.items():
            assert not any(v in text for v in values), f"{name} appears in {where}"
        leaked = sorted(d for d in dobs if d in text)
        assert not leaked, f"{len(leaked)} decrypted dates of birth appear in {where}, e.g. {leaked[:3]}"


def test_a_resumed_delta_shows_no_next_review_date(cli_env, engine):
    """A delta resumed after a checkpoint [next_review_date, id] (written by another connection) names only the
    id: no customer's next_review_date in stdout/stderr, the Dagster event log or ba_run_history."""
    from batch_assets.reference.customer_status.job import checkpoint_fingerprint
    from batch_assets.reference.customer_status.rules_store import current_rules

    env = dict(cli_env, BATCH_ASSETS_RUN_DATE_WINDOW_DAYS="36500")
    seed = run_cli(env, "seed", "customers", "--rows", "600", "--seed", "53")
    assert seed.returncode == 0, seed.describe()
    first = summary_run_date(seed.summary)
    settle = run_cli(env, "sweep", "customer-status", "--mode", "full", "--run-date", first.isoformat())
    assert settle.returncode == 0, settle.describe()
    run_date = first + timedelta(days=20 * 365)  # many rows are due again by then, at their stored date
    harmless = {(d + timedelta(days=k)).isoformat() for d in (first, run_date, today_utc()) for k in (-1, 0, 1)}
    dates = {r.d.isoformat() for r in rows(engine, "SELECT DISTINCT next_review_date AS d FROM customers "
                                                   "WHERE next_review_date IS NOT NULL")} - harmless
    due = rows(engine, "SELECT next_review_date, id FROM customers WHERE status = 'ACTIVE' "
                       "AND next_review_date <= :d ORDER BY next_review_date, id", d=run_date)
    assert len(due) > 100 and due[40].next_review_date.isoformat() in dates
    after = [due[40].next_review_date.isoformat(), str(due[40].id)]
    with engine.begin() as conn:
        _, rules = current_rules(conn)
        conn.execute(sa.text(
            "INSERT INTO ba_checkpoints (sweep, mode, range_key, cursor, rules_fingerprint, status) "
            "VALUES ('customer_status', 'delta', 'all', CAST(:cursor AS jsonb), :fp, 'RUNNING')"
        ), {"cursor": json.dumps(after), "fp": checkpoint_fingerprint(rules, run_date)})

    result = run_cli(env, "sweep", "customer-status", "--mode", "delta", "--run-date", run_date.isoformat(),
                     "--page-size", "50")
    assert result.returncode == 0, result.describe()
    assert result.summary["resumed_from"] == {"after_id": after[1]}, result.summary
    assert 0 < result.summary["scanned"] < len(due)
    _, events = dagster_event_text(Path(cli_env["BATCH_ASSETS_HOME"]))
    history = "\n".join(json.dumps(r.summary) for r in rows(engine, "SELECT summary FROM ba_run_history"))
    assert "after_id" in events and "after_id" in history
    for where, text in (("stdout/stderr", result.stdout + result.stderr), ("the Dagster event log", events),
                        ("ba_run_history", history)):
        leaked = sorted(d for d in dates if d in text)
        assert not leaked, f"{len(leaked)} next_review_date values appear in {where}, e.g. {leaked[:3]}"
