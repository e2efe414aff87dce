"""Acceptance: the customer-status sweep, driven only through `batch-assets` (docs/reference/cli.md,
docs/reference/tables.md, docs/reference/rules.md)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import date, timedelta

import pytest
from _cli import (
    DEFAULT_RULES,
    EXIT_FAILED,
    EXIT_SKIPPED,
    EXIT_USAGE,
    SWEEP_KEYS,
    assert_summary_keys,
    classify,
    customers_snapshot,
    execute,
    mismatches,
    nonzero,
    ok,
    oracle,
    outbox_per_customer,
    rows,
    run_cli,
    scalar,
    seed_customers,
    summary_run_date,
    table_counts,
)

pytestmark = pytest.mark.integration

NEW_RULES = (("MINOR", 0), ("YOUNG_ADULT", 21), ("ADULT", 30), ("SENIOR", 67))
NEW_RULES_TEXT = ",".join(f"{name}={age}" for name, age in NEW_RULES)


def sweep(env, mode: str, run_date: date, *extra: str):
    return run_cli(env, "sweep", "customer-status", "--mode", mode, "--run-date", run_date.isoformat(), *extra)


def rules_shown(env) -> tuple[tuple[str, int], ...]:
    """The rules `rules show` reports: its JSON `rules` list, or the NAME=AGE,... line it prints."""
    result = run_cli(env, "rules", "show")
    assert result.returncode == 0, result.describe()
    listed = (result.summary or {}).get("rules")
    if isinstance(listed, list) and all(isinstance(r, dict) for r in listed):
        return tuple((r["category"], int(r["min_age"])) for r in listed)
    for line in (result.stdout + "\n" + result.stderr).splitlines():
        m = re.search(r"([A-Z_0-9]+=\d+(?:,[A-Z_0-9]+=\d+)*)", line)
        if m:
            return tuple((p.split("=")[0], int(p.split("=")[1])) for p in m.group(1).split(","))
    raise AssertionError("rules show printed no rules\n" + result.describe())


def nothing_written(engine) -> dict[str, int]:
    """Row counts of every table a sweep may write (business and bookkeeping)."""
    return {
        table: scalar(engine, f"SELECT count(*) FROM {table}")
        for table in ("review_triggers", "outbox_events", "ba_checkpoints", "ba_job_locks", "ba_leases")
    } | {"computed": scalar(engine, "SELECT count(*) FROM customers WHERE age_category IS NOT NULL "
                                    "OR next_review_date IS NOT NULL")}


def test_full_sweep_first_run_and_rerun_follow_the_contract(cli_env, engine, cipher):
    """full: every good row per the age-category rule (docs/reference/rules.md), failures by kind, a clean outbox; a
    second full run writes nothing."""
    seeded = seed_customers(cli_env, 3000, "--bad-fraction", "0.09", "--seed", "11")
    run_date = summary_run_date(seeded)
    truth = classify(engine, cipher, run_date)
    kinds = truth.kinds()
    assert set(kinds) == {"missing_data", "invalid_value", "decrypt_failure"}, kinds
    if isinstance(seeded.get("bad_by_kind"), dict):
        assert nonzero(seeded["bad_by_kind"]) == kinds

    result = sweep(cli_env, "full", run_date)
    assert result.returncode == 0, result.describe()
    s = result.summary
    assert s is not None, result.describe()
    assert_summary_keys(s, SWEEP_KEYS)
    assert s["status"] == "SUCCESS" and s["mode"] == "full" and s["run_date"] == run_date.isoformat(), s
    assert isinstance(s["run_id"], str) and s["run_id"], s
    assert s["resumed_from"] is None, s
    assert s["scanned"] == 3000, s
    assert s["changed"] == len(truth.good), s
    assert s["unchanged"] == 0, s
    assert s["failed"] == len(truth.bad), s
    assert nonzero(s["failed_by_type"]) == kinds, s
    assert s["triggers"] == 0, "a first computation writes no trigger"
    assert s["audit_events"] == len(truth.good), s
    assert len(truth.good) <= s["decrypted"] <= s["scanned"], s
    assert s["pages"] >= 1, s

    assert mismatches(engine, truth, run_date) == []
    # Failures keep their stored (NULL) category and stay due.
    bad_rows = rows(engine, "SELECT age_category, next_review_date FROM customers WHERE id = ANY(:ids)",
                    ids=list(truth.bad))
    assert all(r.age_category is None and r.next_review_date is None for r in bad_rows)

    assert scalar(engine, "SELECT count(*) FROM review_triggers") == 0
    per_customer = outbox_per_customer(engine)
    assert set(per_customer) == set(truth.good) and set(per_customer.values()) == {1}
    for r in rows(engine, "SELECT aggregate_id, event_type, payload::text AS payload FROM outbox_events"):
        assert r.event_type == "age_category_changed"
        payload = json.loads(r.payload)
        text = r.payload.lower()
        assert "next_review" not in text and "dob" not in text and "birth" not in text, r.payload
        dob = truth.good[r.aggregate_id]
        exp = oracle(dob, run_date)
        assert dob.isoformat() not in r.payload and exp.next_review_date.isoformat() not in r.payload, r.payload
        assert not any(isinstance(v, str) and len(v) == 10 and v[4] == "-" for v in payload.values()), payload

    # A second full run changes nothing and writes nothing.
    before, counts = customers_snapshot(engine), table_counts(engine)
    again = sweep(cli_env, "full", run_date)
    assert again.returncode == 0, again.describe()
    s2 = again.summary
    assert s2["status"] == "SUCCESS" and s2["changed"] == 0, s2
    assert s2["unchanged"] == len(truth.good) and s2["failed"] == len(truth.bad), s2
    assert s2["triggers"] == 0 and s2["audit_events"] == 0, s2
    assert customers_snapshot(engine) == before, "an unchanged row was written"
    assert table_counts(engine) == counts


def test_delta_rereads_only_the_rows_kept_due_by_failures(cli_env, engine, cipher):
    """After a full run, delta reads exactly the failed rows (kept due), changes nothing and succeeds."""
    seeded = seed_customers(cli_env, 3000, "--bad-fraction", "0.09", "--seed", "12")
    run_date = summary_run_date(seeded)
    truth = classify(engine, cipher, run_date)
    ok(cli_env, "sweep", "customer-status", "--mode", "full", "--run-date", run_date.isoformat())
    before, counts = customers_snapshot(engine), table_counts(engine)
    delta = sweep(cli_env, "delta", run_date)
    assert delta.returncode == 0, (
        "a delta over the failed rows the contract keeps due must not fail the run\n" + delta.describe()
    )
    d = delta.summary
    assert d["status"] == "SUCCESS" and d["scanned"] == len(truth.bad) and d["changed"] == 0, d
    assert nonzero(d["failed_by_type"]) == truth.kinds(), d
    assert customers_snapshot(engine) == before and table_counts(engine) == counts


def test_delta_picks_exactly_the_row_whose_dob_was_edited(cli_env, engine, cipher):
    """Writing encrypted_dob clears next_review_date (trigger); the next delta recomputes exactly that row."""
    seeded = seed_customers(cli_env, 2000, "--seed", "13")
    run_date = summary_run_date(seeded)
    truth = classify(engine, cipher, run_date)
    ok(cli_env, "sweep", "customer-status", "--mode", "delta", "--run-date", run_date.isoformat())
    assert mismatches(engine, truth, run_date) == []
    quiet = sweep(cli_env, "delta", run_date)
    assert quiet.returncode == 0 and quiet.summary["scanned"] == 0, quiet.describe()

    target = next(cid for cid in sorted(truth.good) if oracle(truth.good[cid], run_date).category == "YOUNG_ADULT")
    new_dob = date(run_date.year - 70, 3, 10)
    execute(engine, "UPDATE customers SET encrypted_dob = :blob WHERE id = :id",
            blob=cipher.encrypt_text(target, new_dob.isoformat()), id=target)
    assert scalar(engine, "SELECT next_review_date FROM customers WHERE id = :id", id=target) is None
    before, events_before = customers_snapshot(engine), outbox_per_customer(engine)
    delta = sweep(cli_env, "delta", run_date)
    assert delta.returncode == 0, delta.describe()
    d = delta.summary
    assert d["scanned"] == 1 and d["changed"] == 1, d
    assert d["triggers"] == 1 and d["audit_events"] == 1, d
    after = customers_snapshot(engine)
    assert {cid for cid in after if after[cid] != before[cid]} == {target}
    exp = oracle(new_dob, run_date)
    assert after[target][2:4] == (exp.category, exp.next_review_date)
    trig = rows(engine, "SELECT customer_id, from_category, to_category, effective_date FROM review_triggers")
    assert [tuple(t) for t in trig] == [(target, "YOUNG_ADULT", "SENIOR", exp.since)]
    assert outbox_per_customer(engine)[target] == events_before[target] + 1
    payload = scalar(engine, "SELECT payload::text FROM outbox_events WHERE aggregate_id = :id ORDER BY id DESC "
                             "LIMIT 1", id=target)
    assert new_dob.isoformat() not in payload and exp.next_review_date.isoformat() not in payload


@pytest.mark.parametrize(
    "args",
    [
        ["--mode", "full", "--page-size", "1001"],
        ["--mode", "full", "--run-date", "2026-13-01"],
        ["--mode", "weekly"],
        ["--mode", "delta", "--workers", "-1"],
    ],
    ids=["page-size-1001", "run-date-2026-13-01", "unknown-mode", "negative-workers"],
)
def test_invalid_sweep_arguments_exit_2_and_write_nothing(cli_env, engine, args):
    """Bad usage or configuration exits 2 before any row is read or written."""
    seed_customers(cli_env, 50, "--seed", "3")
    before = customers_snapshot(engine)
    result = run_cli(cli_env, "sweep", "customer-status", *args)
    assert result.returncode == EXIT_USAGE, result.describe()
    assert customers_snapshot(engine) == before
    assert set(nothing_written(engine).values()) == {0}
    assert scalar(engine, "SELECT count(*) FROM ba_run_history") == 0


def test_config_change_recomputes_the_right_rows_with_contract_triggers(cli_env, engine, cipher):
    """rules set + config-change: rows per the new rules, one trigger per category change, contract effective date."""
    seeded = seed_customers(cli_env, 4000, "--due-fraction", "0.05", "--seed", "21")
    run_date = summary_run_date(seeded)
    truth = classify(engine, cipher, run_date)
    assert not truth.bad
    stored = {r.id: (r.age_category, r.next_review_date) for r in
              rows(engine, "SELECT id, age_category, next_review_date FROM customers")}
    assert all(cat is not None for cat, _ in stored.values()), "--due-fraction settles the table"

    show = ok(cli_env, "rules", "set", "--thresholds", NEW_RULES_TEXT)
    assert show["status"] == "SUCCESS"
    assert rules_shown(cli_env) == NEW_RULES

    before = customers_snapshot(engine)
    result = sweep(cli_env, "config-change", run_date)
    assert result.returncode == 0, result.describe()
    s = result.summary
    assert_summary_keys(s, SWEEP_KEYS)
    assert s["status"] == "SUCCESS" and s["mode"] == "config-change" and s["scanned"] == 4000, s
    assert mismatches(engine, truth, run_date, NEW_RULES) == []

    expected_triggers = set()
    expected_changed = set()
    for cid, dob in truth.good.items():
        exp = oracle(dob, run_date, NEW_RULES)
        if stored[cid] != (exp.category, exp.next_review_date):
            expected_changed.add(cid)
        if stored[cid][0] != exp.category:
            expected_triggers.add((cid, stored[cid][0], exp.category, exp.since))
    assert expected_triggers, "the rule change must move some categories"
    got = {tuple(r) for r in rows(engine, "SELECT customer_id, from_category, to_category, effective_date "
                                          "FROM review_triggers")}
    assert got == expected_triggers
    assert s["triggers"] == len(expected_triggers), s
    assert s["changed"] == len(expected_changed), s
    per_customer = outbox_per_customer(engine)
    assert set(per_customer) == {t[0] for t in expected_triggers} and set(per_customer.values()) == {1}
    after = customers_snapshot(engine)
    written = {cid for cid in after if after[cid][0] != before[cid][0]}
    assert written == expected_changed, "exactly the rows whose result differs are written"

    # A second change that leaves most rows alone (a new last category): fewer decryptions than rows.
    rules2 = NEW_RULES + (("ELDER", 90),)
    ok(cli_env, "rules", "set", "--thresholds", ",".join(f"{n}={a}" for n, a in rules2))
    stored = {r.id: (r.age_category, r.next_review_date) for r in
              rows(engine, "SELECT id, age_category, next_review_date FROM customers")}
    result = sweep(cli_env, "config-change", run_date)
    assert result.returncode == 0, result.describe()
    s = result.summary
    assert s["scanned"] == 4000 and s["decrypted"] < s["scanned"], s
    unaffected = sum(1 for cid, dob in truth.good.items() if oracle(dob, run_date, rules2).category not in
                     ("SENIOR", "ELDER"))
    assert unaffected > len(truth.good) // 2, "most rows must be unaffected for this check to mean something"
    assert mismatches(engine, truth, run_date, rules2) == []
    elder = {(cid, "SENIOR", "ELDER", oracle(dob, run_date, rules2).since)
             for cid, dob in truth.good.items()
             if stored[cid][0] == "SENIOR" and oracle(dob, run_date, rules2).category == "ELDER"}
    assert elder
    got2 = {tuple(r) for r in rows(engine, "SELECT customer_id, from_category, to_category, effective_date "
                                           "FROM review_triggers")} - got
    assert got2 == elder


@pytest.mark.parametrize(
    "thresholds",
    [
        "MINOR=0,ADULT=26,YOUNG_ADULT=18",
        "MINOR=0,ADULT=18,ADULT=26",
        "MINOR=5,YOUNG_ADULT=18",
        "MINOR=0,YOUNG_ADULT=18,ADULT=18",
        "MINOR=0,YOUNG_ADULT=eighteen",
    ],
    ids=["unordered", "duplicate-name", "not-starting-at-0", "equal-ages", "not-a-number"],
)
def test_rules_set_rejects_invalid_thresholds(cli_env, engine, thresholds):
    """`rules set` with invalid thresholds exits 2 and leaves the rules unchanged."""
    assert rules_shown(cli_env) == DEFAULT_RULES
    result = run_cli(cli_env, "rules", "set", "--thresholds", thresholds)
    assert result.returncode == EXIT_USAGE, result.describe()
    assert rules_shown(cli_env) == DEFAULT_RULES


def test_explicit_database_url_without_key_exits_2_before_touching_data(cli_env, engine):
    """With BATCH_ASSETS_DATABASE_URL set and no key, key-needing commands stop with exit 2 and write nothing."""
    seed_customers(cli_env, 30, "--seed", "5")
    env = {k: v for k, v in cli_env.items() if k != "BATCH_ASSETS_ENCRYPTION_KEY"}
    before = customers_snapshot(engine)
    result = run_cli(env, "sweep", "customer-status", "--mode", "full")
    assert result.returncode == EXIT_USAGE, result.describe()
    assert "BATCH_ASSETS_ENCRYPTION_KEY" in result.stderr + result.stdout
    seeding = run_cli(env, "seed", "customers", "--rows", "10")
    assert seeding.returncode == EXIT_USAGE, seeding.describe()
    assert customers_snapshot(engine) == before
    assert set(nothing_written(engine).values()) == {0}


def test_wrong_key_trips_the_breaker_and_writes_nothing(cli_env, engine):
    """A wrong key makes every decryption fail: the breaker trips, exit 1, status FAILURE, customers untouched."""
    from batch_assets.reference.customer_status.crypto import generate_key_text

    seed_customers(cli_env, 1500, "--seed", "7")
    before = customers_snapshot(engine)
    env = dict(cli_env, BATCH_ASSETS_ENCRYPTION_KEY=generate_key_text())
    result = run_cli(env, "sweep", "customer-status", "--mode", "full")
    assert result.returncode == EXIT_FAILED, result.describe()
    s = result.summary
    assert s is not None and s["status"] == "FAILURE", result.describe()
    assert s["changed"] == 0, s
    assert s.get("failed_by_type", {}).get("decrypt_failure", 0) > 0, s
    assert customers_snapshot(engine) == before
    assert table_counts(engine) == {"review_triggers": 0, "outbox_events": 0}


def test_after_a_failed_run_the_next_run_is_not_skipped(cli_env, engine, cipher):
    """A run that ended (here: tripped breaker) holds no lock: the next run with the right key runs (not exit 75)."""
    from batch_assets.reference.customer_status.crypto import generate_key_text

    seeded = seed_customers(cli_env, 1200, "--seed", "8")
    run_date = summary_run_date(seeded)
    failed = run_cli(dict(cli_env, BATCH_ASSETS_ENCRYPTION_KEY=generate_key_text()),
                     "sweep", "customer-status", "--mode", "full", "--run-date", run_date.isoformat())
    assert failed.returncode == EXIT_FAILED, failed.describe()
    locks = [tuple(r) for r in rows(engine, "SELECT name, owner, lock_until > now() FROM ba_job_locks")]
    leases = [tuple(r) for r in rows(engine, "SELECT name, owner, expires_at > now() FROM ba_leases")]
    result = sweep(cli_env, "full", run_date)
    assert result.returncode != EXIT_SKIPPED, (
        f"the failed run {failed.summary.get('run_id')} ended but still holds the job lock/lease "
        f"(locks={locks}, leases={leases}); the next run was skipped\n{result.describe()}"
    )
    assert result.returncode == 0, result.describe()
    truth = classify(engine, cipher, run_date)
    assert mismatches(engine, truth, run_date) == []


def test_sweep_default_run_date_is_today_and_one_per_run(cli_env, engine, cipher):
    """Without --run-date the run date is today (UTC by default) and used for every row."""
    seeded = seed_customers(cli_env, 200, "--seed", "9")
    s = ok(cli_env, "sweep", "customer-status", "--mode", "delta")
    run_date = date.fromisoformat(s["run_date"])
    assert run_date == summary_run_date(seeded) or abs((run_date - summary_run_date(seeded)).days) <= 1
    truth = classify(engine, cipher, run_date)
    assert s["changed"] == len(truth.good)
    assert mismatches(engine, truth, run_date) == []
    # A later run date makes exactly the rows whose next_review_date has come due.
    later = run_date + timedelta(days=300)  # inside the run-date window (366 days)
    due = scalar(engine, "SELECT count(*) FROM customers WHERE next_review_date <= :d", d=later)
    s2 = ok(cli_env, "sweep", "customer-status", "--mode", "delta", "--run-date", later.isoformat())
    assert s2["scanned"] == due, s2
    assert mismatches(engine, classify(engine, cipher, later), later) == []
    assert uuid.UUID(s2["run_id"]) != uuid.UUID(s["run_id"])


def test_rows_written_by_other_services_follow_sections_4_and_5_at_the_edges(cli_env, engine, cipher):
    """29 February, birthdays on the run date, future/invalid/missing/copied ciphertexts and CLOSED rows (the
    encrypted date of birth (docs/reference/formats.md), the age-category rule (docs/reference/rules.md))."""
    from datetime import date as d

    ids = {name: uuid.uuid4() for name in "abcdefghijk"}
    plain = {"a": "2008-02-29", "b": "2008-02-28", "c": "1961-03-01", "d": "2026-02-28", "e": "2026-03-05",
             "f": "2026-02-30", "g": "1990-1-1", "j": "1980-05-05", "k": "1960-02-29"}
    blobs = {name: cipher.encrypt_text(ids[name], text) for name, text in plain.items()}
    blobs["h"] = blobs["a"]  # a ciphertext copied onto another row does not decrypt
    blobs["i"] = None
    for name, cid in ids.items():
        execute(engine, "INSERT INTO customers (id, status, encrypted_dob) VALUES (:id, :s, :b)",
                id=cid, s="CLOSED" if name == "j" else "ACTIVE", b=blobs[name])

    first = sweep(cli_env, "delta", d(2026, 2, 28))
    assert first.returncode == 0, first.describe()
    s = first.summary
    assert s["scanned"] == 10 and s["changed"] == 5 and s["triggers"] == 0, s
    assert nonzero(s["failed_by_type"]) == {"missing_data": 1, "invalid_value": 3, "decrypt_failure": 1}, s

    def stored(name):
        r = rows(engine, "SELECT age_category, next_review_date FROM customers WHERE id = :id", id=ids[name])[0]
        return (r.age_category, r.next_review_date)

    assert stored("a") == ("MINOR", d(2026, 3, 1))  # 18 on 1 March in a common year
    assert stored("b") == ("YOUNG_ADULT", d(2034, 2, 28))
    assert stored("c") == ("ADULT", d(2026, 3, 1))
    assert stored("d") == ("MINOR", d(2044, 2, 28))  # born on the run date: age 0
    assert stored("k") == ("SENIOR", d(9999, 12, 31))
    for name in "efghi":
        assert stored(name) == (None, None), name
    assert stored("j") == (None, None), "CLOSED rows are never swept"

    second = sweep(cli_env, "delta", d(2026, 3, 1))
    assert second.returncode == 0, second.describe()
    s2 = second.summary
    assert s2["scanned"] == 7 and s2["changed"] == 2 and s2["triggers"] == 2 and s2["audit_events"] == 2, s2
    assert stored("a") == ("YOUNG_ADULT", d(2034, 3, 1))
    assert stored("c") == ("SENIOR", d(9999, 12, 31))
    triggers = {tuple(r) for r in rows(engine, "SELECT customer_id, from_category, to_category, effective_date "
                                               "FROM review_triggers")}
    assert triggers == {(ids["a"], "MINOR", "YOUNG_ADULT", d(2026, 3, 1)),
                        (ids["c"], "ADULT", "SENIOR", d(2026, 3, 1))}
    # The same edges, recomputed by the independent oracle of the other tests.
    assert oracle(d(2008, 2, 29), d(2026, 3, 1)).next_review_date == d(2034, 3, 1)
    assert oracle(d(1960, 2, 29), d(2026, 2, 28)).since == d(2025, 3, 1)
