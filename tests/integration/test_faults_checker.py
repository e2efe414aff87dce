"""The fault campaign's own invariant checker (faults/checker.py) sees what it must, on a real database."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import date

import pytest
import sqlalchemy as sa

from faults import checker

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
