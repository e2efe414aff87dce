"""Acceptance, real processes: kill -9, SIGTERM, concurrent runs, a stolen lease, an expired lock
after a crash, and a lock store that is down. Everything through `batch-assets`; the database is polled
with deadlines to find the middle of a run.

Simulated time: lock-at-most-for (120 s) and the lease TTL (60 s) cannot be shortened from the command
line, so where a test needs them to have passed it sets `lock_until` / `expires_at` in the past with SQL
(`expire_locks`), which is exactly what the passage of time does to those rows.
"""

from __future__ import annotations

import signal
import socket
from datetime import date
from pathlib import Path

import pytest
from _cli import (
    EXIT_FAILED,
    EXIT_SKIPPED,
    SWEEP_KEYS,
    CliProcess,
    assert_summary_keys,
    classify,
    customers_snapshot,
    execute,
    expire_locks,
    mismatches,
    oracle,
    outbox_per_customer,
    rows,
    run_cli,
    scalar,
    seed_customers,
    summary_run_date,
    table_counts,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BIG = 150_000
SLOW_ARGS = ("--page-size", "200", "--workers", "1")


def sweep_args(mode: str, run_date: date) -> list[str]:
    return ["sweep", "customer-status", "--mode", mode, "--run-date", run_date.isoformat(), *SLOW_ARGS]


def computed(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM customers WHERE age_category IS NOT NULL")


def live_locks(engine) -> list[tuple]:
    return [tuple(r) for r in rows(engine, "SELECT name, owner, lock_until FROM ba_job_locks WHERE lock_until > now()")]


def live_leases(engine) -> list[tuple]:
    return [tuple(r) for r in rows(engine, "SELECT name, owner, expires_at FROM ba_leases WHERE expires_at > now()")]


def check_triggers_and_events(engine, truth, stored_before, run_date) -> None:
    """One trigger and one outbox event per category change of the age-category rule (docs/reference/rules.md), and
    no duplicates."""
    expected = set()
    for cid, dob in truth.good.items():
        exp = oracle(dob, run_date)
        if stored_before[cid] is not None and stored_before[cid] != exp.category:
            expected.add((cid, stored_before[cid], exp.category, exp.since))
    got = [tuple(r) for r in rows(engine, "SELECT customer_id, from_category, to_category, effective_date "
                                          "FROM review_triggers")]
    assert len(got) == len(set(got)), "duplicate review triggers"
    assert set(got) == expected
    per_customer = outbox_per_customer(engine)
    dupes = {cid: n for cid, n in per_customer.items() if n != 1}
    assert not dupes, f"{len(dupes)} customers have duplicated outbox events"
    changed = {cid for cid, dob in truth.good.items() if stored_before[cid] != oracle(dob, run_date).category}
    assert set(per_customer) == changed


def test_kill_9_mid_run_then_rerun_resumes_with_correct_rows_and_no_duplicates(cli_env, engine, cipher, tmp_path):
    """kill -9 mid-run, then run again: every row correct, no duplicate trigger/event, resumed, fewer rows scanned."""
    seeded = seed_customers(cli_env, BIG, "--due-fraction", "0.3", "--seed", "41")
    run_date = summary_run_date(seeded)
    stored_before = {r.id: r.age_category for r in rows(engine, "SELECT id, age_category FROM customers")}
    with CliProcess(cli_env, sweep_args("full", run_date), tmp_path) as proc:
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM outbox_events") >= 4000, timeout=45,
                 what="the first run to have written part of the table", alive=proc)
        proc.signal(signal.SIGKILL)
        killed = proc.wait(timeout=30)
    assert killed.returncode == -signal.SIGKILL, killed.describe()
    written = scalar(engine, "SELECT count(*) FROM outbox_events")
    due = scalar(engine, "SELECT count(*) FROM customers WHERE next_review_date <= :d", d=run_date)
    assert 0 < written and due > 0, "the kill must land mid-run"

    expire_locks(engine)  # simulated time: the crashed run's lock and lease have expired
    result = run_cli(cli_env, *sweep_args("full", run_date), timeout=90)
    assert result.returncode == 0, result.describe()
    s = result.summary
    assert_summary_keys(s, SWEEP_KEYS)
    assert s["status"] == "SUCCESS", s
    assert s["resumed_from"] is not None, f"the second run did not resume from the checkpoint: {s}"
    assert s["scanned"] < BIG, f"the second run rescanned the whole table: {s}"

    truth = classify(engine, cipher, run_date)
    assert mismatches(engine, truth, run_date) == []
    check_triggers_and_events(engine, truth, stored_before, run_date)


def test_sigterm_mid_run_drains_checkpoints_exits_and_releases_lock_and_lease(cli_env, engine, cipher, tmp_path):
    """SIGTERM mid-run: the run drains, records its checkpoint, exits FAILURE on its own and frees lock and lease."""
    seeded = seed_customers(cli_env, BIG, "--seed", "42")
    run_date = summary_run_date(seeded)
    with CliProcess(cli_env, sweep_args("full", run_date), tmp_path) as proc:
        wait_for(lambda: computed(engine) >= 5000, timeout=45, what="mid-run", alive=proc)
        proc.signal(signal.SIGTERM)
        at_signal = computed(engine)
        result = proc.wait(timeout=45)
    assert result.returncode not in (0, -signal.SIGTERM), "SIGTERM must end the run gracefully, non-zero\n" + \
        result.describe()
    s = result.summary
    assert s is not None, result.describe()
    assert_summary_keys(s)
    assert s["status"] == "FAILURE", s
    assert result.returncode == EXIT_FAILED, result.describe()
    done = computed(engine)
    assert 0 < done < BIG, "SIGTERM must land mid-run"
    # Draining finishes the pages in flight (window + prefetch, a few pages of 200), it takes no new ones.
    assert done - at_signal <= 10 * 200, f"{done - at_signal} rows were written after SIGTERM ({at_signal} before)"

    checkpoints = rows(engine, "SELECT mode, cursor, status FROM ba_checkpoints WHERE cursor IS NOT NULL")
    assert checkpoints, "no checkpoint recorded"
    # Drained: everything committed is correct (no half-written page).
    truth = classify(engine, cipher, run_date)
    done_ids = [r.id for r in rows(engine, "SELECT id FROM customers WHERE age_category IS NOT NULL")]
    assert mismatches(engine, truth, run_date, ids=done_ids) == []
    assert outbox_per_customer(engine).keys() == set(done_ids)

    assert live_leases(engine) == [], f"the stopped run still holds its lease: {live_leases(engine)}"
    assert live_locks(engine) == [], f"the stopped run still holds the job lock: {live_locks(engine)}"
    assert s["changed"] == done, f"the summary does not report the work done before the stop ({done} rows): {s}"


def test_after_sigterm_the_next_run_resumes_from_the_checkpoint(cli_env, engine, cipher, tmp_path):
    """After a SIGTERM stop, the next run resumes from the low-watermark checkpoint and completes every row."""
    seeded = seed_customers(cli_env, BIG, "--seed", "43")
    run_date = summary_run_date(seeded)
    with CliProcess(cli_env, sweep_args("full", run_date), tmp_path) as proc:
        # Past 40% (the CLI's 4 ranges run one after the other): at least one range has finished.
        wait_for(lambda: computed(engine) >= 0.4 * BIG, timeout=45, what="mid-run", alive=proc)
        proc.signal(signal.SIGTERM)
        stopped = proc.wait(timeout=45)
    assert stopped.returncode == EXIT_FAILED, stopped.describe()
    done = computed(engine)
    expire_locks(engine)  # isolates resumption from lock release (checked by the test above)
    result = run_cli(cli_env, *sweep_args("full", run_date), timeout=90)
    assert result.returncode == 0, result.describe()
    s = result.summary
    assert s["resumed_from"] is not None and s["scanned"] < BIG, s
    # the age-category rule (docs/reference/rules.md): at most the unfinished part of each range plus the pages in
    # flight is read again; a range
    # that finished (even one that finished before the others started) is not read at all.
    in_flight = 4 * (3 + 1) * 200  # 4 ranges x (window of 3 + 1 prefetched page) x page size
    assert s["scanned"] <= BIG - done + in_flight, f"the resumed run re-read finished work ({done} done): {s}"
    truth = classify(engine, cipher, run_date)
    assert mismatches(engine, truth, run_date) == []
    assert set(outbox_per_customer(engine).values()) == {1}
    assert scalar(engine, "SELECT count(*) FROM outbox_events") == BIG


@pytest.mark.parametrize("lock_store", ["postgres", "redis"])
def test_two_concurrent_runs_one_is_skipped_without_reading_a_row(cli_env, engine, cipher, tmp_path, lock_store,
                                                                   request):
    """Two runs at once (PostgreSQL or Redis lock): exactly one exits 75, SKIPPED, scanned 0; the other completes."""
    if lock_store == "redis":
        request.getfixturevalue("require_redis")
        # A Redis database of its own, so no other user of the local Redis shares the lock keys.
        cli_env = dict(cli_env, BATCH_ASSETS_REDIS_URL="redis://127.0.0.1:6379/13")
    # Warm the CLI's Dagster instance first (a run on the empty table), so this test is about the job lock
    # only; two first runs on a fresh instance are the next test.
    warm = run_cli(cli_env, "sweep", "customer-status", "--mode", "delta")
    assert warm.returncode == 0 and warm.summary["scanned"] == 0, warm.describe()
    seeded = seed_customers(cli_env, 100_000, "--seed", "44")
    run_date = summary_run_date(seeded)
    with CliProcess(cli_env, sweep_args("delta", run_date), tmp_path) as a, \
            CliProcess(cli_env, sweep_args("full", run_date), tmp_path) as b:
        results = [a.wait(timeout=90), b.wait(timeout=90)]
    codes = sorted(r.returncode for r in results)
    assert codes == [0, EXIT_SKIPPED], "\n\n".join(r.describe() for r in results)
    skipped = next(r for r in results if r.returncode == EXIT_SKIPPED)
    winner = next(r for r in results if r.returncode == 0)
    s = skipped.summary
    assert s is not None and s["status"] == "SKIPPED" and s["scanned"] == 0, skipped.describe()
    assert s["changed"] == 0 and s["failed"] == 0, s
    assert winner.summary["scanned"] == 100_000, winner.summary
    if s.get("run_id"):
        assert scalar(engine, "SELECT count(*) FROM ba_checkpoints WHERE run_id = :r", r=s["run_id"]) == 0
    truth = classify(engine, cipher, run_date)
    assert mismatches(engine, truth, run_date) == []
    assert set(outbox_per_customer(engine).values()) == {1}


def test_first_runs_on_a_fresh_instance_never_crash_one_runs_the_others_are_skipped(cli_env, engine, tmp_path):
    """Four sweeps started together on a brand-new BATCH_ASSETS_HOME: one runs, three exit 75; none crashes."""
    seeded = seed_customers(cli_env, 40_000, "--seed", "48")
    run_date = summary_run_date(seeded)
    assert not (Path(cli_env["BATCH_ASSETS_HOME"]) / "dagster_home" / "history").exists(), "instance must be new"
    procs = [CliProcess(cli_env, sweep_args("delta", run_date), tmp_path) for _ in range(4)]
    try:
        results = [p.wait(timeout=90) for p in procs]
    finally:
        for p in procs:
            p.kill_group()
    report = "\n\n".join(r.describe() for r in results)
    for r in results:
        assert r.summary is not None, "a job command must end with a JSON summary\n" + r.describe()
    assert sorted(r.returncode for r in results) == [0] + [EXIT_SKIPPED] * 3, report


def test_stolen_lease_stops_the_old_run_which_commits_nothing_more(cli_env, engine, tmp_path):
    """Lease taken over mid-run: the old owner ends FAILURE and writes no customer, trigger or event after the steal."""
    from batch_assets.locking.guard import steal_lease

    seeded = seed_customers(cli_env, BIG, "--due-fraction", "0.5", "--seed", "45")
    run_date = summary_run_date(seeded)
    with CliProcess(cli_env, sweep_args("full", run_date), tmp_path) as proc:
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM review_triggers") >= 3000, timeout=45,
                 what="mid-run", alive=proc)
        names = [r.name for r in rows(engine, "SELECT name FROM ba_leases")]
        assert len(names) == 1, names
        previous = steal_lease(engine, names[0], "thief@acceptance-test", 600)
        assert previous and previous != "thief@acceptance-test"
        snapshot, counts = customers_snapshot(engine), table_counts(engine)
        result = proc.wait(timeout=45)
    assert result.returncode == EXIT_FAILED, result.describe()
    assert result.summary is not None and result.summary["status"] == "FAILURE", result.describe()
    assert table_counts(engine) == counts, "the old owner wrote triggers or events after losing its lease"
    after = customers_snapshot(engine)
    written = [cid for cid in after if after[cid] != snapshot[cid]]
    assert not written, f"the old owner updated {len(written)} customers after losing its lease"
    assert scalar(engine, "SELECT owner FROM ba_leases WHERE name = :n", n=names[0]) == "thief@acceptance-test"


def test_crashed_run_is_taken_over_at_once_on_its_host_and_expires_elsewhere(cli_env, engine, cipher, tmp_path):
    """After kill -9 a holder on another host still excludes runs (exit 75) until its lock expires; on the
    crashed run's own host the dead holder is taken over at once, and the next run resumes."""
    seeded = seed_customers(cli_env, 100_000, "--seed", "46")
    run_date = summary_run_date(seeded)
    with CliProcess(cli_env, sweep_args("delta", run_date), tmp_path) as proc:
        wait_for(lambda: computed(engine) >= 3000, timeout=45, what="mid-run", alive=proc)
        proc.signal(signal.SIGKILL)
        assert proc.wait(timeout=30).returncode == -signal.SIGKILL
    assert live_locks(engine), "a crashed run's lock holds until it expires or is taken over"

    # Seen from another host, the dead process cannot be proven dead: the lock excludes.
    owners = {name: owner for name, owner, _ in live_locks(engine)}
    moved = {name: owner.replace(f"@{socket.gethostname()}:", "@another-host:") for name, owner in owners.items()}
    for name, owner in moved.items():
        execute(engine, "UPDATE ba_job_locks SET owner = :o WHERE name = :n", o=owner, n=name)
        execute(engine, "UPDATE ba_leases SET owner = :o WHERE name = :n", o=owner, n=name)
    before = customers_snapshot(engine)
    blocked = run_cli(cli_env, *sweep_args("delta", run_date))
    assert blocked.returncode == EXIT_SKIPPED, blocked.describe()
    assert blocked.summary["status"] == "SKIPPED" and blocked.summary["scanned"] == 0, blocked.summary
    assert customers_snapshot(engine) == before

    # On its own host the holder's process is gone: the next run takes lock and lease over, no waiting.
    for name, owner in owners.items():
        execute(engine, "UPDATE ba_job_locks SET owner = :o WHERE name = :n", o=owner, n=name)
        execute(engine, "UPDATE ba_leases SET owner = :o WHERE name = :n", o=owner, n=name)
    result = run_cli(cli_env, *sweep_args("delta", run_date), timeout=90)
    assert result.returncode == 0, result.describe()
    assert "taken over" in result.stderr, result.describe()
    s = result.summary
    assert s["status"] == "SUCCESS" and s["resumed_from"] is not None, s
    assert s["scanned"] < 100_000, s
    truth = classify(engine, cipher, run_date)
    assert mismatches(engine, truth, run_date) == []
    assert set(outbox_per_customer(engine).values()) == {1}
    assert live_locks(engine) == [] and live_leases(engine) == []


def test_lock_store_down_fails_closed_without_writing(cli_env, engine):
    """Redis lock store unreachable (default fail-closed policy): non-zero exit, FAILURE, nothing written."""
    seed_customers(cli_env, 2000, "--seed", "47")
    before, counts = customers_snapshot(engine), table_counts(engine)
    env = dict(cli_env, BATCH_ASSETS_REDIS_URL="redis://127.0.0.1:1/0")
    result = run_cli(env, "sweep", "customer-status", "--mode", "full")
    assert result.returncode not in (0, EXIT_SKIPPED), result.describe()
    assert result.summary is not None and result.summary["status"] == "FAILURE", result.describe()
    assert result.summary["scanned"] == 0 and result.summary["changed"] == 0, result.summary
    assert customers_snapshot(engine) == before and table_counts(engine) == counts
    assert scalar(engine, "SELECT count(*) FROM ba_checkpoints") == 0


def test_lock_store_down_fail_open_runs_on_the_lease(cli_env, engine):
    """Redis lock store unreachable with --lock-fail-open: the run warns, proceeds fenced by the lease, and succeeds."""
    seed_customers(cli_env, 2000, "--seed", "48")
    env = dict(cli_env, BATCH_ASSETS_REDIS_URL="redis://127.0.0.1:1/0")
    result = run_cli(env, "sweep", "customer-status", "--mode", "full", "--lock-fail-open")
    assert result.returncode == 0, result.describe()
    assert result.summary["status"] == "SUCCESS" and result.summary["scanned"] == 2000, result.summary
    assert "lock_fail_open" in result.stderr or "fail-open" in result.stderr.lower() or "unavailable" in result.stderr
    assert scalar(engine, "SELECT count(*) FROM customers WHERE next_review_date IS NULL") <= 2000 * 0.05
    assert scalar(engine, "SELECT count(*) FROM ba_leases") == 0
