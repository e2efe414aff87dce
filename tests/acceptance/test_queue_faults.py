"""Acceptance: `queue work` rides out database outages instead of dying on them.

The fault campaign ended 2 of 3 workers rc 1 (`DatabaseUnavailable: terminating connection due to
administrator command`) when every backend of the database was terminated mid-drain. A worker
now reconnects with backoff and carries on; only an outage longer than `--db-outage-s` ends it,
with FAILURE, exit 1 and its run id. Real processes, the test's own database, a local limits stub.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from _cli import (
    COMMON_KEYS,
    EXIT_FAILED,
    EXIT_OK,
    CliProcess,
    assert_summary_keys,
    ok,
    rows,
    scalar,
    wait_for,
)
from helpers import LimitsStub
from sqlalchemy.engine import make_url

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PAYMENTS = 300
TERMINATE_ALL = sa.text(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()"
)


@pytest.fixture
def limits() -> Iterator[LimitsStub]:
    """A limits service that answers 200 after 0.1 s (so the drain lasts a while) and counts POSTs per key."""
    with LimitsStub(delay_s=0.1) as service:
        yield service


def done(engine: sa.Engine) -> int:
    return scalar(engine, "SELECT count(*) FROM payments WHERE status = 'DONE'")


def terminate_backends(admin: sa.Engine, engine: sa.Engine) -> int:
    """End every connection of the test's database (the worker's two and its run's pool)."""
    with admin.connect() as conn:
        return conn.execute(TERMINATE_ALL, {"db": make_url(engine.url).database}).scalar_one()


@pytest.mark.parametrize("mode", ["resident", "drain"])
def test_worker_survives_every_backend_terminated_mid_drain(cli_env, engine, admin_engine, limits, tmp_path, mode):
    """pg_terminate_backend of every backend mid-drain: the worker reconnects, every payment DONE once, exit 0."""
    ok(cli_env, "queue", "enqueue", "--count", str(PAYMENTS))
    env = dict(cli_env, BATCH_ASSETS_LIMITS_URL=limits.url)
    args = ["queue", "work", "--concurrency", "8"] + (["--drain"] if mode == "drain" else [])
    with CliProcess(env, args, tmp_path) as proc:
        wait_for(lambda: done(engine) >= 30, timeout=120, what="the worker to settle 30 payments", alive=proc)
        killed = terminate_backends(admin_engine, engine)
        done_at_fault = done(engine)
        # The worker keeps running (alive=proc) and finishes the work on new connections.
        wait_for(lambda: done(engine) == PAYMENTS, timeout=120, what="every payment DONE", alive=proc)
        if mode == "resident":
            proc.signal(signal.SIGTERM)
        result = proc.wait(timeout=120)
    assert killed >= 2 and done_at_fault < PAYMENTS, (killed, done_at_fault)  # the fault hit a running drain
    assert result.returncode == EXIT_OK, result.describe()
    s = result.summary
    assert s is not None, result.describe()
    assert_summary_keys(s, COMMON_KEYS)
    assert s["status"] == "SUCCESS" and s["run_id"], s
    assert s["stopped_by"] == ("stop" if mode == "resident" else "drained"), s
    assert s["reconnects"] >= 1, s
    assert dict(rows(engine, "SELECT status, count(*) FROM payments GROUP BY status")) == {"DONE": PAYMENTS}
    # Written DONE once each by this worker, and each payment POSTed exactly once: no result was
    # lost with the dead connection (that would have cost a second call after the lease).
    assert s["changed"] == PAYMENTS and s["lost_claims"] == 0, s
    assert len(limits.posts) == PAYMENTS and set(limits.posts.values()) == {1}, limits.posts.most_common(3)
    assert scalar(engine, "SELECT max(attempts) FROM payments") == 1
    # One warning for the outage (both connections lost together), with the driver's reason.
    warnings = [line for line in result.stderr.splitlines() if "database connection lost" in line]
    assert len(warnings) == 1 and re.search(r"lost \((OperationalError|AdminShutdown): \w", warnings[0]), warnings


def test_worker_fails_with_its_run_id_when_the_outage_outlasts_its_bound(
    cli_env, engine, admin_engine, limits, tmp_path
):
    """The database refuses connections longer than --db-outage-s: FAILURE, exit 1, run id, after trying."""
    ok(cli_env, "queue", "enqueue", "--count", str(PAYMENTS))
    env = dict(cli_env, BATCH_ASSETS_LIMITS_URL=limits.url)
    db = make_url(engine.url).database
    try:
        with CliProcess(env, ["queue", "work", "--concurrency", "8", "--db-outage-s", "3"], tmp_path) as proc:
            wait_for(lambda: done(engine) >= 30, timeout=120, what="the worker to settle 30 payments", alive=proc)
            with admin_engine.connect() as conn:
                conn.exec_driver_sql(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
            terminate_backends(admin_engine, engine)
            result = proc.wait(timeout=120)  # no SIGTERM: the worker ends by itself
    finally:
        with admin_engine.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
    assert result.returncode == EXIT_FAILED, result.describe()
    s = result.summary
    assert s is not None, result.describe()
    assert_summary_keys(s, COMMON_KEYS)
    assert s["status"] == "FAILURE" and s["run_id"], s
    # It rode the outage out for its bound (one warning, several attempts), then gave up.
    match = re.search(r"gave up after [0-9.]+s and (\d+) reconnect attempts; db_outage_s 3", s.get("error") or "")
    assert match and int(match.group(1)) >= 1, result.describe()
    warnings = [line for line in result.stderr.splitlines() if "database connection lost" in line]
    assert len(warnings) == 1 and "up to 3s" in warnings[0], result.stderr[-3000:]


LISTENER_PIDS = (
    "SELECT pid FROM pg_stat_activity WHERE application_name = 'batch_assets_listener' AND query LIKE 'LISTEN%'"
    " AND datname = current_database()"  # this test's worker only, not another test's on the same server
)


def test_idle_worker_listens_again_after_its_backends_are_terminated(cli_env, engine, admin_engine, limits, tmp_path):
    """An idle resident worker whose backends are terminated LISTENs again, settles new payments, warns once."""
    ok(cli_env, "queue", "enqueue", "--count", "20")
    env = dict(cli_env, BATCH_ASSETS_LIMITS_URL=limits.url)
    with CliProcess(env, ["queue", "work", "--concurrency", "4"], tmp_path) as proc:
        wait_for(lambda: done(engine) == 20, timeout=120, what="the first payments DONE", alive=proc)
        [old] = wait_for(lambda: [r.pid for r in rows(engine, LISTENER_PIDS)], timeout=60, what="the LISTEN",
                         alive=proc)
        assert terminate_backends(admin_engine, engine) >= 2
        wait_for(lambda: [r.pid for r in rows(engine, LISTENER_PIDS) if r.pid != old], timeout=60,
                 what="a new LISTEN connection", alive=proc)
        ok(cli_env, "queue", "enqueue", "--count", "20")
        wait_for(lambda: done(engine) == 40, timeout=120, what="the payments enqueued after the fault", alive=proc)
        proc.signal(signal.SIGTERM)
        result = proc.wait(timeout=120)
    assert result.returncode == EXIT_OK, result.describe()
    s = result.summary
    assert s is not None and s["status"] == "SUCCESS" and s["run_id"], result.describe()
    assert s["reconnects"] >= 2 and s["changed"] == 40, s  # both connections came back; all work is this run's
    assert dict(rows(engine, "SELECT status, count(*) FROM payments GROUP BY status")) == {"DONE": 40}
    warnings = [line for line in result.stderr.splitlines() if "database connection lost" in line]
    assert len(warnings) == 1, result.stderr[-3000:]
