"""The fault campaign's own invariant checker (faults/checker.py) sees what it must, on a real database."""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from dataclasses import replace
from datetime import date

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from helpers import wait_for

from faults import checker, writers

pytestmark = pytest.mark.integration

RUN_DATE = date(2026, 6, 15)


def _customer(conn: sa.Connection, cipher, dob: str, category: str | None, next_review: date | None) -> uuid.UUID:
    cid = uuid.uuid4()
    conn.execute(
        sa.text("INSERT INTO customers (id, status, encrypted_dob, age_category, next_review_date) "
                "VALUES (:id, 'ACTIVE', :blob, :cat, :nrd)"),
        {"id": cid, "blob": cipher.encrypt_text(cid, dob), "cat": category, "nrd": next_review},
    )
    return cid


def _check(engine: sa.Engine, key_text: str, baseline: checker.Baseline) -> checker.Report:
    with engine.connect() as conn:
        return checker.check_customers(conn, key_text, RUN_DATE, checker.DEFAULT_RULES, baseline)


def test_rule_matches_contract_examples() -> None:
    """The checker's own rule: whole years, 29 February → 1 March, the sentinel for the last category."""
    leap = checker.rule(date(2008, 2, 29), date(2026, 3, 1), checker.DEFAULT_RULES)
    assert (leap.category, leap.since, leap.next_review_date) == ("YOUNG_ADULT", date(2026, 3, 1), date(2034, 3, 1))
    assert checker.rule(date(2008, 2, 29), date(2026, 2, 28), checker.DEFAULT_RULES).category == "MINOR"
    assert checker.rule(date(1950, 1, 1), RUN_DATE, checker.DEFAULT_RULES).next_review_date == checker.SENTINEL


def test_detects_a_row_with_a_wrong_category(engine: sa.Engine, cipher, key_text: str) -> None:
    """A settled row is clean; the same row with the wrong category (and not due) is reported."""
    with engine.begin() as conn:
        good = _customer(conn, cipher, "1990-05-01", "ADULT", date(2055, 5, 1))
        bad = _customer(conn, cipher, "1990-05-02", "SENIOR", date(2055, 5, 2))
        due = _customer(conn, cipher, "1990-05-03", "YOUNG_ADULT", date(2016, 5, 3))
    with engine.connect() as conn:
        baseline = checker.take_baseline(conn)
    report = _check(engine, key_text, baseline)
    assert report.violations == Counter({"wrong_category": 1, "uncomputed": 1}), report.describe()
    assert str(bad) in report.examples["wrong_category"][0]
    assert str(due) in report.examples["uncomputed"][0]
    assert not any(str(good) in e for examples in report.examples.values() for e in examples)


def test_failed_row_must_stay_due(engine: sa.Engine, cipher, key_text: str) -> None:
    """A row that cannot be evaluated (no ciphertext) must keep a next_review_date that keeps it due."""
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO customers (id, status, encrypted_dob, age_category, next_review_date) "
                             "VALUES (:a, 'ACTIVE', NULL, NULL, NULL), (:b, 'ACTIVE', NULL, NULL, '2030-01-01')"),
                     {"a": uuid.uuid4(), "b": uuid.uuid4()})
    with engine.connect() as conn:
        baseline = checker.take_baseline(conn)
    report = _check(engine, key_text, baseline)
    assert report.violations == Counter({"failed_row_not_due": 1}), report.describe()
    assert report.info["unevaluable_missing_data"] == 2


def test_detects_a_duplicate_trigger_and_event(engine: sa.Engine, cipher, key_text: str) -> None:
    """One transition must leave exactly one review trigger and one outbox event."""
    with engine.begin() as conn:
        cid = _customer(conn, cipher, "2000-03-10", "YOUNG_ADULT", date(2026, 3, 10))
    with engine.connect() as conn:
        baseline = checker.take_baseline(conn)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE customers SET age_category = 'ADULT', next_review_date = '2065-03-10' "
                             "WHERE id = :id"), {"id": cid})
        for effective in ("2026-03-10", "2026-03-11"):  # the natural key is unique: a second one differs
            conn.execute(sa.text("INSERT INTO review_triggers (customer_id, from_category, to_category, "
                                 "effective_date) VALUES (:id, 'YOUNG_ADULT', 'ADULT', :d)"),
                         {"id": cid, "d": effective})
        for _ in range(2):
            conn.execute(sa.text(
                "INSERT INTO outbox_events (aggregate_id, event_type, payload) VALUES (:id, 'age_category_changed', "
                "jsonb_build_object('customer_id', CAST(:sid AS text), 'from_category', 'YOUNG_ADULT', "
                "'to_category', 'ADULT'))"
            ), {"id": cid, "sid": str(cid)})
    report = _check(engine, key_text, baseline)
    assert report.violations == Counter({"duplicate_trigger": 1, "duplicate_event": 1}), report.describe()
    assert report.duplicates == 2 and report.rows_lost == 0


def test_detects_a_missing_trigger(engine: sa.Engine, cipher, key_text: str) -> None:
    """A transition written without its trigger and event is a loss."""
    with engine.begin() as conn:
        cid = _customer(conn, cipher, "2000-03-10", "YOUNG_ADULT", date(2026, 3, 10))
    with engine.connect() as conn:
        baseline = checker.take_baseline(conn)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE customers SET age_category = 'ADULT', next_review_date = '2065-03-10' "
                             "WHERE id = :id"), {"id": cid})
    report = _check(engine, key_text, baseline)
    assert report.violations == Counter({"missing_trigger": 1, "missing_event": 1}), report.describe()


def test_detects_a_payment_done_twice(engine: sa.Engine) -> None:
    """The campaign's audit trigger sees a second write of DONE; the stub's counts flag a third accepted POST."""
    once, twice = uuid.uuid4(), uuid.uuid4()
    with engine.begin() as conn:
        checker.install_done_audit(conn)
        conn.execute(sa.text("INSERT INTO payments (id, amount_cents) VALUES (:a, 100), (:b, 200)"),
                     {"a": once, "b": twice})
        conn.execute(sa.text("UPDATE payments SET status = 'DONE' WHERE id IN (:a, :b)"), {"a": once, "b": twice})
        conn.execute(sa.text("UPDATE payments SET status = 'DONE', processed_at = now() WHERE id = :b"), {"b": twice})
    accepted = Counter({str(once): 3, str(twice): 1})
    with engine.connect() as conn:
        report = checker.check_payments(conn, accepted, accepted, complete=True)
    assert report.violations == Counter({"payment_done_twice": 1, "payment_posts_over_limit": 1}), report.describe()
    assert str(twice) in report.examples["payment_done_twice"][0]
    assert str(once) in report.examples["payment_posts_over_limit"][0]


def test_detects_a_half_expired_subscription(engine: sa.Engine) -> None:
    """EXPIRED with enrollments left, or ACTIVE with enrollments gone, breaks all-or-nothing."""
    with engine.begin() as conn:
        ids = [conn.execute(sa.text("INSERT INTO subscriptions (expiry_date, status) VALUES ('2026-01-01', 'ACTIVE') "
                                    "RETURNING id")).scalar() for _ in range(3)]
        for sid in ids:
            conn.execute(sa.text("INSERT INTO enrollments (subscription_id, course_id) VALUES (:s, 1), (:s, 2)"),
                         {"s": sid})
    with engine.connect() as conn:
        baseline = checker.take_baseline(conn)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE subscriptions SET status = 'EXPIRED' WHERE id = :s"), {"s": ids[0]})
        conn.execute(sa.text("DELETE FROM enrollments WHERE subscription_id = :s AND course_id = 1"), {"s": ids[1]})
    with engine.connect() as conn:
        report = checker.check_subscriptions(conn, RUN_DATE, baseline, complete=True)
    assert report.violations == Counter({"subscription_partial": 2, "subscription_not_expired": 2}), report.describe()


def test_detects_an_event_sent_but_not_in_the_sink(engine: sa.Engine) -> None:
    """SENT must mean in the sink, except for events the sink itself lost (restarted empty); PENDING is a loss."""
    with engine.begin() as conn:
        ids = [conn.execute(sa.text(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload, status) "
            "VALUES (:a, 'age_category_changed', '{}'::jsonb, :s) RETURNING id"), {"a": uuid.uuid4(), "s": status}
        ).scalar() for status in ("SENT", "SENT", "SENT", "PENDING")]
    with engine.connect() as conn:
        report = checker.check_outbox_sent(conn, Counter({ids[0]: 2}), lost_by_sink={ids[1]})
    assert report.violations == Counter({"event_not_sent": 2}), report.describe()
    assert any(f"event {ids[2]} SENT but not in the sink" == e for e in report.examples["event_not_sent"])
    assert report.info["sink_resends"] == 1


# --- other services writing beside the jobs -----------------------------------------------


def _aead(key_text: str) -> AESGCM:
    return AESGCM(checker.decode_key(key_text))


def _edit(engine: sa.Engine, aead: AESGCM, cid: uuid.UUID, plain: bytes | None) -> bytes | None:
    """Another service rewrites the row's encrypted_dob (the trigger clears next_review_date)."""
    blob = None if plain is None else checker.encrypt_bytes(aead, cid, plain)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE customers SET encrypted_dob = :b WHERE id = :id"), {"b": blob, "id": cid})
    return blob


def _write(engine: sa.Engine, cid: uuid.UUID, dob: str, *, event_from: str | None = "same") -> None:
    """The product's write of the rule for `dob`, with its outbox event (and trigger, from a category)."""
    result = checker.rule(date.fromisoformat(dob), RUN_DATE, checker.DEFAULT_RULES)
    with engine.begin() as conn:
        old = conn.execute(sa.text("SELECT age_category FROM customers WHERE id = :id"), {"id": cid}).scalar()
        conn.execute(sa.text("UPDATE customers SET age_category = :c, next_review_date = :d WHERE id = :id"),
                     {"c": result.category, "d": result.next_review_date, "id": cid})
        conn.execute(sa.text(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload) VALUES (:id, 'age_category_changed', "
            "jsonb_build_object('from_category', CAST(:f AS text), 'to_category', CAST(:t AS text)))"),
            {"id": cid, "f": old, "t": result.category})
        if old is not None:
            conn.execute(sa.text("INSERT INTO review_triggers (customer_id, from_category, to_category, "
                                 "effective_date) VALUES (:id, :f, :t, :d)"),
                         {"id": cid, "f": old, "t": result.category, "d": result.since})


def _fresh(engine: sa.Engine, aead: AESGCM, dob: str) -> uuid.UUID:
    cid = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO customers (id, status, encrypted_dob) VALUES (:id, 'ACTIVE', :b)"),
                     {"id": cid, "b": checker.encrypt_bytes(aead, cid, dob.encode())})
    return cid


def _beside(engine: sa.Engine) -> checker.Baseline:
    with engine.begin() as conn:
        checker.install_write_log(conn)
    with engine.connect() as conn:
        return checker.take_baseline(conn, with_blobs=True)


def test_evaluate_row_names_every_hostile_kind(key_text: str) -> None:
    """Empty ciphertext is missing_data, non-ASCII digits and an encrypted '' are invalid_value
    (docs/reference/rules.md)."""
    aead = _aead(key_text)
    donor = checker.encrypt_bytes(aead, uuid.uuid4(), b"1990-01-01")
    for kind, expected, build in writers.HOSTILE_CUSTOMERS:
        cid = uuid.uuid4()
        got = checker.evaluate_row(aead, cid, build(aead, cid, RUN_DATE, donor), RUN_DATE, checker.DEFAULT_RULES)
        assert (got if isinstance(got, str) else "computed") == expected, kind


def test_a_write_computed_from_the_dob_before_an_edit_is_stale(engine: sa.Engine, key_text: str) -> None:
    """Edited by another connection, then written with the old dob's result and not due: stale, once per row."""
    aead = _aead(key_text)
    stale, redone = _fresh(engine, aead, "1950-01-01"), _fresh(engine, aead, "1951-01-01")
    baseline = _beside(engine)
    edits = checker.Edits()
    for cid in (stale, redone):
        edits.add(cid, _edit(engine, aead, cid, b"2000-06-01"))
    _write(engine, stale, "1950-01-01")  # the sweep read 1950 before the edit and wrote over it
    _write(engine, redone, "2000-06-01")  # left due by the sweep, computed by the next run
    report = _check_edits(engine, key_text, baseline, edits)
    assert report.violations == Counter({"stale": 1, "stale_write": 1}), report.describe()
    assert report.stale == 1 and report.stale_rows == {stale}
    assert report.rows_lost == 0


def _check_edits(engine: sa.Engine, key_text: str, baseline: checker.Baseline, edits: checker.Edits, *,
                 pending: bool = False) -> checker.Report:
    with engine.connect() as conn:
        return checker.check_customers(conn, key_text, RUN_DATE, checker.DEFAULT_RULES, baseline, edits=edits,
                                       pending=pending)


def test_an_edited_row_may_stay_due_only_until_the_next_run(engine: sa.Engine, key_text: str) -> None:
    """Right after the run an edited row left due is expected; after the next run it is uncomputed."""
    aead = _aead(key_text)
    cid = _fresh(engine, aead, "1950-01-01")
    baseline = _beside(engine)
    edits = checker.Edits()
    edits.add(cid, _edit(engine, aead, cid, b"2000-06-01"))
    pending = _check_edits(engine, key_text, baseline, edits, pending=True)
    assert pending.ok and pending.info["edited_left_due"] == 1, pending.describe()
    assert _check_edits(engine, key_text, baseline, edits).violations == Counter({"uncomputed": 1})


def test_events_follow_the_writes_of_a_row_edited_between_runs(engine: sa.Engine, key_text: str) -> None:
    """Two right writes around an edit give two events and one trigger; an event of the old dob is extra."""
    aead = _aead(key_text)
    cid = _fresh(engine, aead, "1990-01-01")
    baseline = _beside(engine)
    _write(engine, cid, "1990-01-01")  # NULL -> ADULT: an event, no trigger
    edits = checker.Edits()
    edits.add(cid, _edit(engine, aead, cid, b"1950-01-01"))
    _write(engine, cid, "1950-01-01")  # ADULT -> SENIOR: an event and a trigger
    report = _check_edits(engine, key_text, baseline, edits)
    assert report.ok and report.info["transitions"] == 2, report.describe()
    with engine.begin() as conn:  # an event built from the old dob for the conflicting row
        conn.execute(sa.text(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload) VALUES (:id, 'age_category_changed', "
            "jsonb_build_object('from_category', 'ADULT', 'to_category', 'ADULT'))"), {"id": cid})
    assert _check_edits(engine, key_text, baseline, edits).violations == Counter({"wrong_event": 1})


def test_hostile_customer_outcomes(engine: sa.Engine, key_text: str) -> None:
    """A failed row passes only due with its category kept; a malformed date accepted as valid fails."""
    aead = _aead(key_text)
    rows = []
    for kind, expected, plain, cat, nrd in (
        ("kept", "invalid_value", b"1_90-01-01", "ADULT", None),
        ("not due", "decrypt_failure", None, "ADULT", date(2030, 1, 1)),
        ("changed", "missing_data", b"", "SENIOR", None),
        ("accepted", "invalid_value", b" 990-01-01", "SENIOR", checker.SENTINEL),
        ("valid", "computed", b"2026-06-15", "MINOR", date(2044, 6, 15)),
    ):
        cid = uuid.uuid4()
        blob = checker.encrypt_bytes(aead, uuid.uuid4() if plain is None else cid, plain or b"")
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO customers (id, status, encrypted_dob, age_category, next_review_date) "
                                 "VALUES (:id, 'ACTIVE', :b, :c, :d)"),
                         {"id": cid, "b": b"" if plain == b"" else blob, "c": cat, "d": nrd})
        rows.append(checker.HostileRow(kind, expected, cid, "new", "ADULT" if kind == "changed" else cat))
    rows[3] = checker.HostileRow("accepted", "invalid_value", rows[3].cid, "new", None)
    with engine.connect() as conn:
        out = checker.hostile_customer_outcomes(conn, key_text, RUN_DATE, checker.DEFAULT_RULES, rows)
        counts = checker.expected_failures(conn, key_text, RUN_DATE, checker.DEFAULT_RULES, due_only=True)
    assert {k: o.ok for k, o in out.items()} == {"kept": True, "not due": False, "changed": False,
                                                 "accepted": False, "valid": True}
    assert out["not due"].observed == ["NOT due, category kept (new)"]
    assert out["changed"].observed == ["due, category ADULT -> SENIOR (new)"]
    assert counts == Counter({"invalid_value": 1, "missing_data": 1})  # not-due and accepted rows are not read


def test_hostile_payment_outcomes(engine: sa.Engine) -> None:
    """DONE, or FAILED with a true last_error; a lapse named for a row never claimed, or a row left, fails."""
    rows, states = [], (("DONE", None, True), ("FAILED", "HTTP 400 from the limits service", True),
                        ("FAILED", "claim lapsed repeatedly; attempt 6 > max 5", False), ("FAILED", None, False),
                        ("PROCESSING", None, False), ("NEW", None, False))
    with engine.begin() as conn:
        for i, (status, error, _) in enumerate(states):
            pid = uuid.uuid4()
            conn.execute(sa.text("INSERT INTO payments (id, amount_cents, status, attempts, last_error) "
                                 "VALUES (:id, 1, :s, 5, :e)"), {"id": pid, "s": status, "e": error})
            rows.append(checker.HostileRow(f"k{i}", "DONE", pid, "NEW", None))
    with engine.connect() as conn:
        out = checker.hostile_payment_outcomes(conn, rows)
    assert [out[f"k{i}"].ok for i in range(len(states))] == [ok for _, _, ok in states]
    assert out["k4"].observed == ["left PROCESSING: lost"]


def test_dob_editor_writes_valid_ciphertexts_of_other_dates(engine: sa.Engine, db_url: str, key_text: str) -> None:
    """The concurrent writer edits on its own connection at its rate; each recorded ciphertext is what the row holds."""
    aead = _aead(key_text)
    ids = [_fresh(engine, aead, "1990-01-01") for _ in range(20)]
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE customers SET age_category = 'ADULT', next_review_date = '2055-01-01'"))
    writer_engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    editor = writers.DobEditor(writer_engine, key_text, ids, RUN_DATE, rate=400, seed=1)
    editor.start()
    try:
        wait_for(lambda: editor.edits.count >= 100, timeout=30, what="100 edits")
    finally:
        edits = editor.stop()
        writer_engine.dispose()
    assert editor.errors == 0 and edits.count >= 100
    assert edits.count / editor.elapsed_s < 400 * 1.5  # paced, not as fast as it can
    with engine.connect() as conn:
        rows = {cid: (bytes(blob), cat, nrd) for cid, blob, cat, nrd in conn.execute(sa.text(
            "SELECT id, encrypted_dob, age_category, next_review_date FROM customers"))}
    for cid, blobs in edits.blobs.items():
        blob, cat, nrd = rows[cid]
        assert blob == blobs[-1] and (cat, nrd) == ("ADULT", None)  # the trigger made it due, category kept
        assert isinstance(checker.evaluate_row(aead, cid, blob, RUN_DATE, checker.DEFAULT_RULES), checker.Expected)


def test_injected_hostile_rows_are_what_their_kind_says(engine: sa.Engine, db_url: str, key_text: str) -> None:
    """Every hostile kind, inserted or written over a settled row, evaluates to its kind in the checker.

    The row the "copied from another row" kind is written over is inserted first, so a donor taken without an order
    (the table's first row) would be that row itself, whose own ciphertext decrypts: the kind must still come out
    decrypt_failure (it came out 'computed', 1 run in 18, before the donor excluded the row written over)."""
    aead = _aead(key_text)
    seed = 3
    ids = [uuid.uuid4() for _ in writers.HOSTILE_CUSTOMERS]
    by_seed = sorted(ids, key=lambda cid: hashlib.md5(f"{cid}{seed}".encode()).hexdigest())  # writers.SETTLED_SQL
    copied = next(i for i, (kind, *_rest) in enumerate(writers.HOSTILE_CUSTOMERS) if "copied" in kind)
    for cid in [by_seed[copied], *(c for c in ids if c != by_seed[copied])]:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO customers (id, status, encrypted_dob) VALUES (:id, 'ACTIVE', :b)"),
                         {"id": cid, "b": checker.encrypt_bytes(aead, cid, b"1990-01-01")})
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT id FROM customers LIMIT 1")).scalar() == by_seed[copied]
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE customers SET age_category = 'ADULT', next_review_date = '2055-01-01'"))
    writer_engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        rows = writers.inject_hostile_customers(writer_engine, key_text, RUN_DATE, variants=tuple(writers.VARIANTS),
                                                seed=seed)
    finally:
        writer_engine.dispose()
    assert Counter(r.variant for r in rows) == {v: len(writers.HOSTILE_CUSTOMERS) for v in writers.VARIANTS}
    with engine.connect() as conn:
        state = {cid: (blob, cat, nrd) for cid, blob, cat, nrd in conn.execute(sa.text(
            "SELECT id, encrypted_dob, age_category, next_review_date FROM customers"))}
    for r in rows:
        blob, cat, nrd = state[r.cid]
        got = checker.evaluate_row(aead, r.cid, None if blob is None else bytes(blob), RUN_DATE, checker.DEFAULT_RULES)
        assert (got if isinstance(got, str) else "computed") == r.expected, (r.kind, r.variant)
        assert cat == r.category == {"new": None, "edited": "ADULT", "preset": "ADULT"}[r.variant]
        assert (nrd is None) == (r.variant != "preset")


def test_report_tables_show_stale_rows_and_each_hostile_kind() -> None:
    """The fault table has a stale column; the hostile table has one line per kind, FAIL when any fault saw it fail."""
    from faults.campaign import FaultResult, FaultSpec
    from faults.report import fault_table, hostile_table

    first, second = (FaultResult(FaultSpec("sweep", "hostile", "full"), seed=i, injected=True, recovered=True)
                     for i in (1, 2))
    first.report.add("stale", "a row holds the result of its old date of birth")
    first.report.stale_rows.add(uuid.uuid4())
    for res, ok in ((first, True), (second, False)):
        outcome = checker.HostileOutcome("' 990-01-01'", "invalid_value")
        outcome.see("due, category kept" if ok else "NOT due, category None -> SENIOR", ok, "new")
        res.hostile = {outcome.kind: outcome}
    table = fault_table([first, second])
    assert table[0].split(" | ")[4] == "stale" and table[2].split(" | ")[4] == "1"
    line = hostile_table([first, second])[2]
    assert line.startswith("| customer | ' 990-01-01' | counted as `invalid_value`")
    assert "due, category kept (new); NOT due, category None -> SENIOR (new)" in line
    assert line.endswith("| 2 | **FAIL** |") and second.outcome == "FAIL" and first.outcome == "FAIL"


# --- hostile declarations ------------------------------------------------------------------------------------------


def _team(engine: sa.Engine, key_text: str) -> checker.Canaries:
    import random

    from faults.declarations import create_team_tables

    return create_team_tables(engine, random.Random(7), key_text, owner=None)


def _accounts(engine: sa.Engine) -> dict[uuid.UUID, checker.Account]:
    with engine.connect() as conn:
        return checker.team_accounts(conn)


def test_team_rows_a_run_must_not_write_are_seen(engine: sa.Engine, key_text: str) -> None:
    """Out of scope (CLOSED, or the row whose status is the key's text) and hostile rows must stay as they were; the
    others are the rule's, or (a run that did not finish) as they were."""
    _team(engine, key_text)
    before = _accounts(engine)
    rows = sorted(before.items(), key=lambda kv: str(kv[0]))
    open_rows = [(k, a) for k, a in rows if a.status == "OPEN"]
    hostile = {k for k, a in open_rows if a.points % 10 == 0}
    trap = next(k for k, a in rows if a.status == key_text)
    with engine.begin() as conn:
        for k, a in open_rows:
            if k not in hostile:
                tier, review = checker.team_tier(a.points, RUN_DATE)
                conn.execute(sa.text("UPDATE accounts SET tier = :t, tier_review_on = :r WHERE id = :k"),
                             {"t": tier, "r": review, "k": k})
    after = _accounts(engine)
    clean = checker.check_team_accounts(before, after, RUN_DATE, hostile=lambda p: p % 10 == 0, complete=True)
    assert clean.ok and clean.info["team_rows_written"] == len(open_rows) - len(hostile), clean.describe()
    assert not checker.check_team_accounts(before, after, RUN_DATE, complete=True).ok, "hostile rows left: uncomputed"
    wrong_key = next(k for k, _ in open_rows if k not in hostile)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE accounts SET tier = 'PWNED' WHERE id = ANY(:ids)"),
                     {"ids": [trap, next(iter(hostile)), wrong_key]})
    report = checker.check_team_accounts(before, _accounts(engine), RUN_DATE, hostile=lambda p: p % 10 == 0,
                                         complete=False)
    assert report.violations == Counter({"team_row_written": 2, "team_row_wrong": 1}), report.describe()
    assert key_text not in report.describe(), "a row is named by its key, never by its values"


def test_a_refused_command_that_wrote_anything_is_seen(engine: sa.Engine, key_text: str) -> None:
    """database_state changes with a row of any table and with a trigger installed on a team's table."""
    _team(engine, key_text)
    with engine.connect() as conn:
        first = checker.database_state(conn)
        assert checker.changed_tables(first, checker.database_state(conn)) == []
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO ba_job_locks (name, owner, lock_until) "
                             "VALUES ('team_tier', 'x', now())")
    with engine.connect() as conn:
        second = checker.database_state(conn)
    assert checker.changed_tables(first, second) == ["ba_job_locks"]
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE FUNCTION team_wake() RETURNS trigger LANGUAGE plpgsql AS "
                             "$$ BEGIN RETURN NEW; END $$")
        conn.exec_driver_sql("CREATE TRIGGER team_wake AFTER INSERT ON team_jobs FOR EACH ROW "
                             "EXECUTE FUNCTION team_wake()")
    with engine.connect() as conn:
        assert checker.changed_tables(second, checker.database_state(conn)) == ["(columns, indexes, triggers)"]


def test_canaries_are_found_in_the_products_tables_and_never_shown(engine: sa.Engine, key_text: str) -> None:
    """A row's code, a row's points and the key are found wherever they stand (inside other words too); the finding
    names what it found, never the value."""
    canaries = _team(engine, key_text)
    code, points = sorted(canaries.codes)[0], sorted(canaries.points)[0]
    assert canaries.found("run 1a2b3c4d, 123456789012 rows, duration 0.123456789 s") == []
    found = canaries.found(f'{{"error": "SystemExit: v={code}", "kind": "p{points}", "x": "{key_text}"}}')
    assert found == ["the encryption key", "a row's value (code)", "a row's value (points)"]
    assert not any(value in " ".join(found) for value in (code, points, key_text))
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO outbox_events (aggregate_id, event_type, payload) "
                             "VALUES (gen_random_uuid(), 'team_tier_changed', CAST(:p AS jsonb))"),
                     {"p": f'{{"key": "k", "old": {{"code": "{code}"}}}}'})
        texts = dict(checker.bookkeeping_texts(conn))
    assert {"ba_run_history", "ba_checkpoints", "outbox_events"} <= set(texts), sorted(texts)
    assert canaries.found(texts["outbox_events"]) == ["a row's value (code)"]


def test_instance_files_are_read_row_by_row_for_the_cases_runs(tmp_path) -> None:
    """A SQLite event log is read row by row (a value is whole there whatever the pages), only the case's runs'
    rows where a table has a run_id; other files as they are; files older than the case are left out."""
    import os
    import sqlite3
    import time

    from faults.declarations import instance_texts

    runs = tmp_path / "dagster_home" / "history" / "runs"
    runs.mkdir(parents=True)
    index = sqlite3.connect(runs / "index.db")
    index.execute("CREATE TABLE event_logs (id integer, run_id text, event text)")
    index.execute("CREATE TABLE kvs (key text, value text)")
    index.executemany("INSERT INTO event_logs VALUES (?, ?, ?)", [
        (1, "mine", "SystemExit: v=" + "x" * 5000 + "zq0123456789abcd"), (2, "other", "zq00000000000000")])
    index.execute("INSERT INTO kvs VALUES ('cursor', 'zq1111111111111a')")
    index.commit()
    index.close()
    (tmp_path / "dagster_home" / "step.log").write_text("points 123456789")
    old = tmp_path / "old.log"
    old.write_text("zq2222222222222b")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    texts = dict(instance_texts(tmp_path, time.time() - 60, {"mine"}))
    joined = "\n".join(texts.values())
    assert "zq0123456789abcd" in joined and "zq1111111111111a" in joined and "123456789" in joined
    assert "zq00000000000000" not in joined, "another run's rows"
    assert "zq2222222222222b" not in joined, "a file the case did not change"


def test_a_refusal_must_be_one_line_naming_the_file_and_the_attribute(tmp_path) -> None:
    """Exit 2, one stderr line with the file and `: attribute:`, no run, nothing written; anything else is named."""
    from faults.declarations import refusal_problems
    from faults.product import CliResult

    path = tmp_path / "team" / "defs.yaml"
    line = f"error: {path}: where: closes a parenthesis it did not open\n"
    good = CliResult(["jobs", "list"], 2, "", line, 1.0)
    assert refusal_problems(good, "refused", path, "where", []) == []
    assert refusal_problems(good, "refused", path, "key", []) == [
        "the line does not name team/defs.yaml and `key`"]
    assert refusal_problems(good, "refused", path, "where", ["accounts"]) == ["written: accounts"]
    started = CliResult(["jobs", "run"], 1, '{"status": "FAILURE", "run_id": "r1"}\n', "Traceback\n  boom\n", 1.0)
    assert refusal_problems(started, "refused", path, "where", []) == [
        "exit 1, not 2", "2 stderr lines, not 1", "a run was started"]
    field_line = CliResult(["jobs", "run"], 2, "", "error: mode: must be one of delta, full, got an object\n", 1.0)
    assert refusal_problems(field_line, "field", path, "mode", []) == []
    assert refusal_problems(field_line, "field", path, "workers", []) == ["the line does not name `workers`"]


def test_the_quick_campaign_draws_one_declaration_and_the_full_one_runs_them_all() -> None:
    """faults-quick runs one hostile declaration drawn by the seed among those that must pass; `make faults` every
    one; a known failure never passes unnoticed."""
    import random

    from faults.campaign import QUICK, FaultResult, FaultSpec, plan
    from faults.declarations import CASES, CATALOGUE, QUICK_CASES

    quick = [s for s in plan(QUICK, random.Random(5), quick=True, redis=True) if s.job == "decl"]
    assert len(quick) == 1 and quick[0].mode in QUICK_CASES
    drawn = {[s for s in plan(QUICK, random.Random(seed), quick=True, redis=True) if s.job == "decl"][0].mode
             for seed in range(60)}
    assert len(drawn) > len(QUICK_CASES) // 2
    full = [s.mode for s in plan(QUICK, random.Random(5), quick=False, redis=True) if s.job == "decl"]
    assert full == [c.name for c in CATALOGUE] and len(set(full)) == len(full)
    # A case marked as a known failure (none is today): reported, never failing the campaign, until it passes.
    known = replace(CASES["handler_exits"], known="the queue's worker ends on the handler's SystemExit")
    res = FaultResult(FaultSpec("decl", "hostile_decl", known.name), seed=1, injected=True, recovered=True)
    res.declaration = checker.DeclarationOutcome(known.name, known.title, known.component, known.expected,
                                                 known=known.known)
    res.report.add("canary_leak", "a row's value (code) in the output of `queue work`")
    assert res.outcome == "known failure"
    res.report = checker.Report()
    res.report.add("known_failure_passes", "take its mark off")
    assert res.outcome == "FAIL"


def test_the_declarations_table_shows_wrong_rows_leaks_and_a_known_failure() -> None:
    """One line per hostile declaration: wrong rows and leaks counted, FAIL with its violations, a known failure with
    its reason; the fault table has one line for all of them."""
    from faults.campaign import FaultResult, FaultSpec
    from faults.declarations import CASES
    from faults.report import declarations_table, fault_table

    results = []
    for name in ("where_breakout", "compute_exits", "handler_exits"):
        case = CASES[name]
        if name == "handler_exits":  # as a known failure (none is today), to show how one is reported
            case = replace(case, known="the queue's KwargsHandler catches Exception only")
        res = FaultResult(FaultSpec("decl", "hostile_decl", name), seed=1, injected=True, recovered=True)
        res.declaration = checker.DeclarationOutcome(name, case.title, case.component, case.expected, known=case.known)
        res.declaration.observed.append("jobs run: exit 2, one line naming `where`")
        results.append(res)
    results[1].report.add("team_row_written", "a hostile row 1 was written")
    results[1].report.add("canary_leak", "a row's value (code) in the output of `jobs run`")
    results[2].report.add("canary_leak", "a row's value (code) in the output of `queue work`")
    lines = declarations_table(results)
    assert lines[2].endswith("| 0 | 0 | pass |"), lines[2]
    assert "| 1 | 1 | **FAIL**: canary_leak=1" in lines[3], lines[3]
    assert "| 0 | 1 | **known failure**: the queue's KwargsHandler" in lines[4], lines[4]
    table = fault_table(results)
    assert len(table) == 3 and table[2].startswith("| hostile declaration · a team's declared job"), table
    assert "| 3 | pass 1, FAIL (wrong rows+leaks) 1, known failure 1 | 1 |" in table[2], table[2]
