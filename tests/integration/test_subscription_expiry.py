"""The nightly subscription expiry on a real PostgreSQL: atomic per row, isolated failures, retries, lock."""

from __future__ import annotations

import logging
import threading
import time
from datetime import date
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import wait_for

from batch_assets.errors import ConfigError, LockNotAcquired
from batch_assets.locking.lock import PostgresJobLock
from batch_assets.reference.subscriptions.expiry import (
    JOB_LOCK_NAME,
    ExpiryResult,
    ExpirySettings,
    run_expiry,
    run_expiry_job,
)
from batch_assets.reference.subscriptions.seed import AUDIT_COURSE_ID, seed_subscriptions

pytestmark = pytest.mark.integration

RUN_DATE = date(2024, 6, 15)
SUMMARY_KEYS = {"status", "run_id", "scanned", "changed", "unchanged", "failed", "failed_by_type", "duration_s"}

# Test-only failure: deleting an enrollment of a subscription listed in test_fail_subscriptions raises.
FAIL_TRIGGER = (
    "CREATE TABLE test_fail_subscriptions (id bigint PRIMARY KEY)",
    """
    CREATE FUNCTION test_fail_enrollment_delete() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM test_fail_subscriptions WHERE id = OLD.subscription_id) THEN
            RAISE EXCEPTION 'provoked failure for subscription %', OLD.subscription_id;
        END IF;
        RETURN OLD;
    END;
    $$
    """,
    """
    CREATE TRIGGER test_fail_enrollment_delete BEFORE DELETE ON enrollments
        FOR EACH ROW EXECUTE FUNCTION test_fail_enrollment_delete()
    """,
)


def _install_failure(engine: sa.Engine, *ids: int) -> None:
    with engine.begin() as conn:
        for ddl in FAIL_TRIGGER:
            conn.execute(sa.text(ddl))
        for i in ids:
            conn.execute(sa.text("INSERT INTO test_fail_subscriptions (id) VALUES (:id)"), {"id": i})


def _insert(engine: sa.Engine, rows: list[tuple[int, date | None, str]], enrollments_per: int = 2) -> None:
    with engine.begin() as conn:
        for sub_id, expiry, status in rows:
            conn.execute(
                sa.text("INSERT INTO subscriptions (id, expiry_date, status) VALUES (:id, :d, :s)"),
                {"id": sub_id, "d": expiry, "s": status},
            )
            for k in range(enrollments_per):
                conn.execute(
                    sa.text("INSERT INTO enrollments (subscription_id, course_id) VALUES (:id, :c)"),
                    {"id": sub_id, "c": k + 1},
                )


def _subs(engine: sa.Engine) -> dict[int, sa.Row]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT s.id, s.status, s.retry_count, s.last_error, "
                "(SELECT count(*) FROM enrollments e WHERE e.subscription_id = s.id) AS enrollments "
                "FROM subscriptions s"
            )
        ).all()
    return {r.id: r for r in rows}


def _settings(**kw: Any) -> ExpirySettings:
    return ExpirySettings(**kw)


def test_settings_defaults_and_validation() -> None:
    """Nothing given: the documented defaults; invalid values (0 included) raise ConfigError naming the field."""
    s = ExpirySettings()
    assert (s.batch_size, s.max_retries, s.lock_ttl_s, s.lock_min_s, s.row_timeout_s) == (500, 3, 120, 60, 5)
    for kw, name in (
        ({"batch_size": -1}, "batch_size"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 20_000}, "batch_size"),
        ({"lock_min_s": 10, "lock_ttl_s": 5}, "lock_min_s"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"nope": 1}, "nope"),
    ):
        with pytest.raises(ConfigError) as info:
            ExpirySettings(**kw)
        assert info.value.field == name


def test_expires_only_active_past_rows_and_deletes_their_enrollments(engine: sa.Engine) -> None:
    """ACTIVE rows with expiry_date < run date become EXPIRED without enrollments; all others are untouched."""
    _insert(
        engine,
        [
            (1, date(2024, 6, 14), "ACTIVE"),
            (2, date(2023, 1, 1), "ACTIVE"),
            (3, RUN_DATE, "ACTIVE"),  # expires today: not yet
            (4, date(2025, 1, 1), "ACTIVE"),
            (5, None, "ACTIVE"),  # no expiry date
            (6, date(2024, 1, 1), "EXPIRED"),
        ],
    )
    result = run_expiry(engine, run_date=RUN_DATE, settings=_settings())
    subs = _subs(engine)
    assert {i: (s.status, s.enrollments) for i, s in subs.items()} == {
        1: ("EXPIRED", 0),
        2: ("EXPIRED", 0),
        3: ("ACTIVE", 2),
        4: ("ACTIVE", 2),
        5: ("ACTIVE", 2),
        6: ("EXPIRED", 2),
    }
    assert (result.scanned, result.expired, result.failed, result.enrollments_deleted) == (2, 2, 0, 4)
    summary = result.to_summary("r1")
    assert SUMMARY_KEYS <= set(summary)
    assert (summary["changed"], summary["run_date"], summary["status"]) == (2, "2024-06-15", "SUCCESS")


def test_second_run_finds_nothing(engine: sa.Engine) -> None:
    """A second run on the same run date selects nothing and changes nothing."""
    seed_subscriptions(engine, 50, seed=1, expired_fraction=0.4, run_date=RUN_DATE)
    first = run_expiry(engine, run_date=RUN_DATE, settings=_settings())
    assert first.expired == 20
    again = run_expiry(engine, run_date=RUN_DATE, settings=_settings())
    assert (again.scanned, again.expired, again.failed, again.batches) == (0, 0, 0, 0)


def test_batches_are_bounded(engine: sa.Engine) -> None:
    """Rows are read in keyset batches of at most batch_size; every expired row is handled once."""
    seed_subscriptions(engine, 100, seed=2, expired_fraction=0.3, run_date=RUN_DATE)
    seen: list[int] = []
    result = run_expiry(
        engine, run_date=RUN_DATE, settings=_settings(batch_size=7), progress=lambda r: seen.append(r.scanned)
    )
    assert result.expired == result.scanned == 30
    assert result.batches == 5 and result.max_batch_rows == 7
    assert seen == [7, 14, 21, 28, 30]


def test_failure_is_atomic_and_isolated(engine: sa.Engine) -> None:
    """A failing enrollment delete leaves that row FAILED (retry 1, last_error), enrollments intact; others EXPIRED."""
    _insert(engine, [(i, date(2024, 6, i), "ACTIVE") for i in range(1, 7)])
    _install_failure(engine, 3)
    result = run_expiry(engine, run_date=RUN_DATE, settings=_settings(batch_size=2))
    subs = _subs(engine)
    assert (subs[3].status, subs[3].retry_count, subs[3].enrollments) == ("FAILED", 1, 2)
    assert "provoked failure for subscription 3" in subs[3].last_error
    assert all((subs[i].status, subs[i].enrollments) == ("EXPIRED", 0) for i in (1, 2, 4, 5, 6))
    assert (result.scanned, result.expired, result.failed) == (6, 5, 1)
    assert result.failed_by_type == {"raise_exception": 1}
    assert result.to_summary("r")["failed_by_type"] == {"raise_exception": 1}


def test_500_failed_expiries_log_one_warning_per_batch(engine: sa.Engine, caplog: pytest.LogCaptureFixture) -> None:
    """Each failed subscription is logged at DEBUG only; each batch logs one WARNING counting its failures by kind."""
    ids = list(range(1, 501))
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO subscriptions (id, expiry_date, status) "
                             "SELECT g, DATE '2024-06-01', 'ACTIVE' FROM generate_series(1, 500) AS g"))
        conn.execute(sa.text("INSERT INTO enrollments (subscription_id, course_id) SELECT g, 1 "
                             "FROM generate_series(1, 500) AS g"))
    _install_failure(engine, *ids)
    caplog.set_level(logging.DEBUG, logger="batch_assets")
    result = run_expiry(engine, run_date=RUN_DATE, settings=_settings(batch_size=250))
    assert (result.scanned, result.failed) == (500, 500)
    per_row = [r for r in caplog.records if "expiry failed" in r.getMessage()]
    assert len(per_row) == 500 and {r.levelno for r in per_row} == {logging.DEBUG}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    counted = [w for w in warnings if "failed systemically (raise_exception 250)" in w]
    assert len(counted) == 2 and len(warnings) <= 4, warnings  # per batch: the count, and its page write's fallback


def test_failed_rows_are_not_selected_by_the_nightly_run(engine: sa.Engine) -> None:
    """A FAILED row is skipped by later nightly runs: retry_count stays 1."""
    _insert(engine, [(1, date(2024, 6, 1), "ACTIVE"), (2, date(2024, 6, 2), "ACTIVE")])
    _install_failure(engine, 1)
    run_expiry(engine, run_date=RUN_DATE, settings=_settings())
    again = run_expiry(engine, run_date=date(2024, 7, 1), settings=_settings())
    assert again.scanned == 0
    s = _subs(engine)[1]
    assert (s.status, s.retry_count, s.enrollments) == ("FAILED", 1, 2)


def test_retry_failed_honours_max_retries_and_expires_on_success(engine: sa.Engine) -> None:
    """retry_failed retries FAILED rows under max_retries; a success is EXPIRED with last_error cleared."""
    _insert(engine, [(1, date(2024, 6, 1), "ACTIVE"), (2, date(2024, 6, 2), "ACTIVE")])
    _install_failure(engine, 1, 2)
    settings = _settings(max_retries=2)
    run_expiry(engine, run_date=RUN_DATE, settings=settings)
    assert {s.retry_count for s in _subs(engine).values()} == {1}

    with engine.begin() as conn:  # subscription 2 gets one more failed retry than 1
        conn.execute(sa.text("UPDATE subscriptions SET retry_count = 2 WHERE id = 2"))
    first = run_expiry(engine, run_date=RUN_DATE, settings=settings, retry_failed=True)
    assert (first.mode, first.scanned, first.failed) == ("retry_failed", 1, 1)
    assert {i: (s.status, s.retry_count) for i, s in _subs(engine).items()} == {1: ("FAILED", 2), 2: ("FAILED", 2)}

    exhausted = run_expiry(engine, run_date=RUN_DATE, settings=settings, retry_failed=True)
    assert exhausted.scanned == 0  # both reached max_retries

    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM test_fail_subscriptions"))
    healed = run_expiry(engine, run_date=RUN_DATE, settings=_settings(max_retries=3), retry_failed=True)
    assert (healed.scanned, healed.expired) == (2, 2)
    assert {i: (s.status, s.retry_count, s.last_error, s.enrollments) for i, s in _subs(engine).items()} == {
        1: ("EXPIRED", 2, None, 0),
        2: ("EXPIRED", 2, None, 0),
    }


def test_locked_enrollment_times_out_and_is_marked_failed(engine: sa.Engine) -> None:
    """An enrollment locked by another transaction makes that row fail on lock_timeout; the run does not stall."""
    _insert(engine, [(1, date(2024, 6, 1), "ACTIVE"), (2, date(2024, 6, 2), "ACTIVE")])
    with engine.connect() as other:
        with other.begin():
            other.execute(sa.text("SELECT id FROM enrollments WHERE subscription_id = 1 FOR UPDATE")).all()
            started = time.monotonic()
            result = run_expiry(engine, run_date=RUN_DATE, settings=_settings(row_timeout_s=0.2))
            elapsed = time.monotonic() - started
    subs = _subs(engine)
    assert (subs[1].status, subs[1].retry_count, subs[1].enrollments) == ("FAILED", 1, 2)
    assert subs[2].status == "EXPIRED"
    assert result.failed_by_type == {"lock_not_available": 1}
    assert elapsed < 5


def test_unrecordable_failure_ends_the_run(engine: sa.Engine) -> None:
    """With the subscription row itself locked, neither expiry nor marking succeeds: it stays ACTIVE, the run ends."""
    _insert(engine, [(1, date(2024, 6, 1), "ACTIVE"), (2, date(2024, 6, 2), "ACTIVE")])
    with engine.connect() as other:
        with other.begin():
            other.execute(sa.text("SELECT id FROM subscriptions WHERE id = 1 FOR UPDATE")).all()
            result = run_expiry(engine, run_date=RUN_DATE, settings=_settings(row_timeout_s=0.2))
    subs = _subs(engine)
    assert (subs[1].status, subs[1].retry_count, subs[1].enrollments) == ("ACTIVE", 0, 2)  # next run retries it
    assert subs[2].status == "EXPIRED"
    assert (result.scanned, result.failed, result.expired) == (2, 1, 1)


def test_seed_is_deterministic_and_demo_failures_are_marked(engine: sa.Engine) -> None:
    """The seed is deterministic, moves the sequences, and its failing rows end FAILED by the demo guard."""
    assert seed_subscriptions(engine, 200, seed=5, run_date=RUN_DATE, failing_fraction=0.1) == 200
    with engine.begin() as conn:
        first = conn.execute(sa.text("SELECT id, customer_id, expiry_date FROM subscriptions ORDER BY id")).all()
        audit = conn.execute(
            sa.text("SELECT count(*) FROM enrollments WHERE course_id = :c"), {"c": AUDIT_COURSE_ID}
        ).scalar()
        assert conn.execute(sa.text("SELECT count(*) FROM enrollments")).scalar() == 400
        # sequences were moved past the seeded ids: a plain insert does not collide
        new_id = conn.execute(sa.text("INSERT INTO subscriptions (expiry_date) VALUES (NULL) RETURNING id")).scalar()
        assert new_id == 201
        conn.execute(sa.text("DELETE FROM subscriptions WHERE id = :id"), {"id": new_id})
    assert sum(1 for r in first if r.expiry_date < RUN_DATE) == 60
    assert audit == 6

    result = run_expiry(engine, run_date=RUN_DATE, settings=_settings())
    assert (result.expired, result.failed) == (54, 6)
    assert result.failed_by_type == {"raise_exception": 6}


def test_seed_same_seed_same_rows(engine: sa.Engine) -> None:
    """Two seeds with the same seed into empty tables produce identical rows."""
    seed_subscriptions(engine, 30, seed=9, run_date=RUN_DATE)
    with engine.begin() as conn:
        a = conn.execute(sa.text("SELECT id, customer_id, expiry_date FROM subscriptions ORDER BY id")).all()
        ea = conn.execute(sa.text("SELECT id, subscription_id, course_id FROM enrollments ORDER BY id")).all()
        conn.execute(sa.text("DELETE FROM enrollments"))
        conn.execute(sa.text("DELETE FROM subscriptions"))
        conn.execute(sa.text("SELECT setval('subscriptions_id_seq', 1, false), setval('enrollments_id_seq', 1, false)"))
    seed_subscriptions(engine, 30, seed=9, run_date=RUN_DATE)
    with engine.connect() as conn:
        b = conn.execute(sa.text("SELECT id, customer_id, expiry_date FROM subscriptions ORDER BY id")).all()
        eb = conn.execute(sa.text("SELECT id, subscription_id, course_id FROM enrollments ORDER BY id")).all()
    assert a == b and ea == eb


def test_stop_event_ends_the_run_between_rows(engine: sa.Engine) -> None:
    """A set stop event ends the run before more rows are touched."""
    seed_subscriptions(engine, 20, seed=3, expired_fraction=1.0, run_date=RUN_DATE)
    stop = threading.Event()
    result = run_expiry(
        engine, run_date=RUN_DATE, settings=_settings(batch_size=5), stop=stop, progress=lambda r: stop.set()
    )
    assert (result.expired, result.stopped_by) == (5, "stop")
    # Due subscriptions are left ACTIVE: a stopped run did not do its work, so it is not SUCCESS.
    assert result.status == "FAILURE" and "next run continues" in (result.error or "")


def test_job_raises_lock_not_acquired_when_the_lock_is_held(engine: sa.Engine) -> None:
    """With the job lock held by another owner, run_expiry_job raises LockNotAcquired and changes nothing."""
    _insert(engine, [(1, date(2024, 6, 1), "ACTIVE")])
    lock = PostgresJobLock(engine)
    assert lock.acquire(JOB_LOCK_NAME, "someone-else", 60)
    with pytest.raises(LockNotAcquired):
        run_expiry_job(engine, run_date=RUN_DATE, settings=_settings(), run_id="r1")
    assert _subs(engine)[1].status == "ACTIVE"
    assert lock.holder(JOB_LOCK_NAME) == "someone-else"


def test_job_takes_and_releases_the_lock_honouring_lock_at_least_for(engine: sa.Engine) -> None:
    """The job holds the lock while it runs and releases it after; lock-at-least-for blocks an immediate rerun."""
    _insert(engine, [(1, date(2024, 6, 1), "ACTIVE")])
    lock = PostgresJobLock(engine)
    holders: list[str | None] = []
    result = run_expiry_job(
        engine,
        run_date=RUN_DATE,
        settings=_settings(lock_min_s=60),
        run_id="r1",
        lock=lock,
        progress=lambda r: holders.append(lock.holder(JOB_LOCK_NAME)),
    )
    assert isinstance(result, ExpiryResult) and result.expired == 1
    assert holders and holders[0] is not None and holders[0].startswith("r1@")
    assert lock.holder(JOB_LOCK_NAME) is not None  # kept until lock-at-least-for passes
    with pytest.raises(LockNotAcquired):
        run_expiry_job(engine, run_date=RUN_DATE, settings=_settings(), run_id="r2")

    with engine.begin() as conn:  # let the minimum hold pass
        conn.execute(sa.text("UPDATE ba_job_locks SET lock_until = now() - interval '1 s', min_until = now()"))
    again = run_expiry_job(engine, run_date=RUN_DATE, settings=_settings(lock_min_s=0.001), run_id="r3")
    assert again.scanned == 0


def test_job_stops_when_the_lock_is_lost(engine: sa.Engine) -> None:
    """If another owner takes the lock mid-run (it expired), the job stops after the batch with FAILURE."""
    seed_subscriptions(engine, 20, seed=4, expired_fraction=1.0, run_date=RUN_DATE)
    lock = PostgresJobLock(engine)

    def steal(result: ExpiryResult) -> None:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE ba_job_locks SET owner = 'thief' WHERE name = :n"), {"n": JOB_LOCK_NAME})

    result = run_expiry_job(
        engine, run_date=RUN_DATE, settings=_settings(batch_size=5), run_id="r1", lock=lock, progress=steal
    )
    assert (result.expired, result.stopped_by, result.status) == (5, "lock_lost", "FAILURE")
    assert lock.holder(JOB_LOCK_NAME) == "thief"  # release did not delete the new owner's lock


def test_nightly_batch_uses_the_expiring_index(engine: sa.Engine) -> None:
    """The keyset batch query can use subscriptions_expiring_idx (plan test)."""
    from batch_assets.reference.subscriptions.expiry import NIGHTLY_BATCH

    seed_subscriptions(engine, 2000, seed=6, run_date=RUN_DATE, enrollments_per=0)
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE subscriptions"))
        conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
        plan = conn.execute(
            sa.text("EXPLAIN (FORMAT JSON) " + str(NIGHTLY_BATCH)),
            {"run_date": RUN_DATE, "after_date": date(2024, 1, 1), "after_id": 10, "limit": 500},
        ).scalar_one()
    assert "subscriptions_expiring_idx" in str(plan)
    assert '"Sort"' not in str(plan)  # the keyset order is the index order


def test_unreachable_database_ends_failure_after_three_tries_without_the_password() -> None:
    """Against an unreachable database the run retries, then ends FAILURE naming the cause, never the password."""
    from batch_assets.db.engine import create_engine

    down = create_engine("postgresql+psycopg://postgres:s3cret@127.0.0.1:1/x", pool_size=1)
    try:
        result = run_expiry(down, run_date=RUN_DATE, settings=_settings(retry_backoff_s=0.01))
    finally:
        down.dispose()
    assert (result.status, result.stopped_by, result.batch_retries) == ("FAILURE", "batch_failures", 2)
    assert "cannot reach database" in result.error and "s3cret" not in result.error


def test_healthy_batch_is_one_statement_and_a_bad_row_only_costs_its_batch(engine: sa.Engine) -> None:
    """A batch without bad rows is expired by one statement; a batch with one falls back to one row per transaction."""
    _insert(engine, [(i, date(2024, 5, 1 + i % 28), "ACTIVE") for i in range(1, 41)])  # all before RUN_DATE
    _install_failure(engine, 33)
    statements: list[str] = []

    def capture(_conn, _cursor, statement, *_rest) -> None:
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        result = run_expiry(engine, run_date=RUN_DATE, settings=_settings(batch_size=10))
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    batch_writes = [s for s in statements if "WITH expired AS" in s]
    single_writes = [s for s in statements if s.lstrip().startswith("UPDATE subscriptions") and "= ANY" not in s]
    assert len(batch_writes) == 4  # one per batch of 10
    assert len(single_writes) == 10 + 1  # the bad row's batch, row by row, plus its MARK_FAILED
    assert (result.scanned, result.expired, result.failed) == (40, 39, 1)
    assert _subs(engine)[33].status == "FAILED"


def _all_or_nothing(engine: sa.Engine, enrollments_per: int) -> None:
    """Every subscription is either EXPIRED without enrollments or not EXPIRED with all of them."""
    for sub in _subs(engine).values():
        if sub.status == "EXPIRED":
            assert sub.enrollments == 0, sub
        else:
            assert sub.enrollments == enrollments_per, sub


def test_a_lost_connection_is_retried_and_the_run_ends_success(engine: sa.Engine) -> None:
    """The run's backend is terminated after the first batch: the batch is retried on a fresh connection."""
    _insert(engine, [(i, date(2024, 5, 1 + i % 28), "ACTIVE") for i in range(1, 31)])
    killed: list[int] = []

    def kill_the_run_connection(result: ExpiryResult) -> None:
        if killed:
            return
        with engine.begin() as conn:  # every other backend of this database: the run's own connection
            killed.extend(conn.execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalars())

    result = run_expiry(
        engine, run_date=RUN_DATE, settings=_settings(batch_size=10, retry_backoff_s=0.01),
        progress=kill_the_run_connection,
    )
    assert killed and any(killed)
    assert (result.status, result.batch_retries, result.expired, result.failed) == ("SUCCESS", 1, 30, 0)
    _all_or_nothing(engine, 2)
    assert {s.status for s in _subs(engine).values()} == {"EXPIRED"}


def test_three_consecutive_batch_failures_end_the_run_failure(engine: sa.Engine) -> None:
    """A batch that keeps failing with a connection-class error is retried twice, then the run ends FAILURE."""
    _insert(engine, [(i, date(2024, 6, i), "ACTIVE") for i in range(1, 6)])
    with engine.begin() as conn:  # the server reports a connection failure for every write of subscriptions
        conn.execute(sa.text(
            "CREATE FUNCTION test_conn_failure() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'provoked connection failure' USING ERRCODE = '08006'; END; $$"))
        conn.execute(sa.text(
            "CREATE TRIGGER test_conn_failure BEFORE UPDATE ON subscriptions "
            "FOR EACH STATEMENT EXECUTE FUNCTION test_conn_failure()"))
    result = run_expiry(engine, run_date=RUN_DATE, settings=_settings(retry_backoff_s=0.01))
    assert (result.status, result.stopped_by, result.batch_retries) == ("FAILURE", "batch_failures", 2)
    assert "3 consecutive batch failures" in result.error and "provoked connection failure" in result.error
    _all_or_nothing(engine, 2)
    assert {s.status for s in _subs(engine).values()} == {"ACTIVE"}


def test_rows_reaching_max_retries_are_reported_by_id(engine: sa.Engine) -> None:
    """A retry that fails again and brings retry_count to max_retries names the row in `exhausted_ids`."""
    _insert(engine, [(1, date(2024, 6, 1), "ACTIVE"), (2, date(2024, 6, 2), "ACTIVE")])
    _install_failure(engine, 1, 2)
    settings = _settings(max_retries=2)
    first = run_expiry(engine, run_date=RUN_DATE, settings=settings)
    assert (first.failed, first.exhausted) == (2, 0)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM test_fail_subscriptions WHERE id = 2"))
    retry = run_expiry(engine, run_date=RUN_DATE, settings=settings, retry_failed=True)
    assert (retry.expired, retry.failed, retry.exhausted, retry.exhausted_ids) == (1, 1, 1, [1])
    assert retry.to_summary("r")["retries_exhausted"] == 1


def _terminate_backend_waiting_in(engine: sa.Engine, statement_like: str, what: str) -> None:
    """Wait (deadline 30 s) until a backend running a statement LIKE `statement_like` waits on a lock; kill it."""
    waiting_pid = wait_for(lambda: _scalar(engine, (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
        "AND query LIKE :statement"), statement=statement_like), timeout=30, interval=0.02, what=what)
    assert _scalar(engine, "SELECT pg_terminate_backend(:pid)", pid=waiting_pid)


def test_a_connection_lost_inside_a_batch_write_is_retried_on_a_fresh_connection(engine: sa.Engine) -> None:
    """The guarded run's backend is terminated while its batch write waits on a lock: that transaction rolls back
    whole and is run again on a fresh connection; the run ends SUCCESS with every subscription all-or-nothing."""
    _insert(engine, [(i, date(2024, 5, i), "ACTIVE") for i in range(1, 25)])
    blocker = engine.connect()
    blocking = blocker.begin()
    # An enrollment of subscription 15 (second batch of 10) is locked: that batch's write waits on it.
    blocker.execute(sa.text("SELECT id FROM enrollments WHERE subscription_id = 15 FOR UPDATE")).all()
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(run_expiry_job(
                engine, run_date=RUN_DATE, run_id="r-kill", lock=PostgresJobLock(engine),
                settings=_settings(batch_size=10, row_timeout_s=60, batch_timeout_s=60, lock_ttl_s=120,
                                   lock_min_s=0.001, retry_backoff_s=0.01),
            ))
        except BaseException as exc:  # reported by the assertions below
            outcome.append(exc)

    runner = threading.Thread(target=run, name="expiry-under-test")
    runner.start()
    try:
        _terminate_backend_waiting_in(engine, "%WITH expired AS%", "the batch write to wait on the lock")
    finally:
        blocking.rollback()
        blocker.close()
        runner.join(timeout=60)
    assert not runner.is_alive()
    result = outcome[0]
    assert isinstance(result, ExpiryResult), result
    assert (result.status, result.expired, result.failed, result.batch_retries) == ("SUCCESS", 24, 0, 1)
    _all_or_nothing(engine, 2)
    assert {s.status for s in _subs(engine).values()} == {"EXPIRED"}


def _scalar(engine: sa.Engine, sql: str, **params: object) -> object:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def test_a_connection_lost_while_recording_a_failure_retries_only_that_record(engine: sa.Engine) -> None:
    """The backend is terminated while MARK_FAILED waits: only that record is run again on a fresh connection,
    so the failed row is counted once and marked once (before, the whole batch was redone and counted it twice)."""
    _insert(engine, [(i, date(2024, 6, i), "ACTIVE") for i in range(1, 6)])
    _install_failure(engine, 3)
    with engine.begin() as conn:  # recording a failure waits on advisory lock 4242 while the test holds it
        conn.execute(sa.text(
            "CREATE FUNCTION test_wait_on_mark() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NEW; END; $$"))
        conn.execute(sa.text(
            "CREATE TRIGGER test_wait_on_mark BEFORE UPDATE ON subscriptions FOR EACH ROW "
            "WHEN (NEW.status = 'FAILED') EXECUTE FUNCTION test_wait_on_mark()"))
    holder = engine.connect()
    holder.execute(sa.text("SELECT pg_advisory_lock(4242)"))
    holder.commit()
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(run_expiry(engine, run_date=RUN_DATE,
                                      settings=_settings(row_timeout_s=60, retry_backoff_s=0.01)))
        except BaseException as exc:  # reported by the assertions below
            outcome.append(exc)

    runner = threading.Thread(target=run, name="expiry-under-test")
    runner.start()
    try:
        _terminate_backend_waiting_in(engine, "%retry_count + 1%", "the failure record to wait on the lock")
    finally:
        holder.execute(sa.text("SELECT pg_advisory_unlock(4242)"))
        holder.close()
        runner.join(timeout=60)
    assert not runner.is_alive()
    result = outcome[0]
    assert isinstance(result, ExpiryResult), result
    assert (result.status, result.expired, result.failed, result.batch_retries) == ("SUCCESS", 4, 1, 1)
    assert result.failed_by_type == {"raise_exception": 1}
    subs = _subs(engine)
    assert (subs[3].status, subs[3].retry_count, subs[3].enrollments) == ("FAILED", 1, 2)
