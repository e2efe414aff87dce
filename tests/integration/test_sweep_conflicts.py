"""Another connection edits rows between a sweep's read and its write (docs/reference/tables.md): the edit wins, the
row is
counted in `conflicts`, left due, gets no trigger or event from the old value, and the next run computes it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import date

import pytest
import sqlalchemy as sa
from customer_rows import copy_customers, customer, fetch_customer
from helpers import wait_for

from batch_assets.engine.definition import RowOutcome, RunContext, WriteCounts
from batch_assets.engine.runner import run_sweep
from batch_assets.engine.settings import SweepSettings
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.rules import DEFAULT_RULES, evaluate
from batch_assets.reference.customer_status.sweep import CustomerStatusSweep
from batch_assets.reference.subscriptions.expiry import ExpirySettings, run_expiry
from batch_assets.reference.subscriptions.sweep import ExpiryFailures, ExpirySweep

pytestmark = pytest.mark.integration

RUN_DATE = date(2025, 6, 1)
ONE_PAGE = SweepSettings(workers=1, window=1, page_size=100)


class EditingSweep(CustomerStatusSweep):
    """The customer-status sweep with another connection's edit committed just before its first page write."""

    def __init__(self, mode: str, cipher: DobCipher, edit: Callable[[], None]) -> None:
        super().__init__(mode, cipher=cipher, run_date=RUN_DATE, rules=DEFAULT_RULES)
        self.edit: Callable[[], None] | None = edit

    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        edit, self.edit = self.edit, None
        if edit is not None:
            edit()  # commits on its own connection: the page was read (and computed) before it
        return super().write_page(conn, changed)


def _rewrite_dob(engine: sa.Engine, cipher: DobCipher, cid: uuid.UUID, dob: str) -> Callable[[], None]:
    def edit() -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE customers SET encrypted_dob = %(blob)s WHERE id = %(id)s",
                                 {"blob": cipher.encrypt_text(cid, dob), "id": cid})
    return edit


def _sweep(engine: sa.Engine, definition: CustomerStatusSweep, settings: SweepSettings = ONE_PAGE):
    return run_sweep(engine, definition, settings, RunContext("conflict-run", definition.mode, RUN_DATE))


def _plain(mode: str, cipher: DobCipher) -> CustomerStatusSweep:
    return CustomerStatusSweep(mode, cipher=cipher, run_date=RUN_DATE, rules=DEFAULT_RULES)


def _side_effects(engine: sa.Engine, cid: uuid.UUID) -> tuple[list[tuple], list[dict]]:
    with engine.connect() as conn:
        triggers = conn.exec_driver_sql(
            "SELECT from_category, to_category, effective_date FROM review_triggers WHERE customer_id = %(id)s",
            {"id": cid}).all()
        events = conn.exec_driver_sql(
            "SELECT payload FROM outbox_events WHERE aggregate_id = %(id)s ORDER BY id", {"id": cid}).scalars().all()
    return [tuple(t) for t in triggers], list(events)


def _expected(dob: str) -> tuple[str, date]:
    result = evaluate(date.fromisoformat(dob), RUN_DATE, DEFAULT_RULES)
    return result.category, result.next_review_date


@pytest.mark.parametrize("mode", ["full", "delta"])
def test_fresh_row_edited_between_read_and_write_is_a_conflict_left_due(
    engine: sa.Engine, cipher: DobCipher, mode: str
) -> None:
    """A never-computed row (NULL/NULL) whose dob is rewritten meanwhile is not written and stays due."""
    edited = customer(cipher, "1950-03-04")  # SENIOR / 9999-12-31 from the dob that was read
    others = [customer(cipher, "2001-01-01"), customer(cipher, "1990-07-01")]
    copy_customers(engine, [edited, *others])
    definition = EditingSweep(mode, cipher, _rewrite_dob(engine, cipher, edited[0], "2010-08-09"))
    result = _sweep(engine, definition)
    assert (result.status, result.scanned, result.changed, result.conflicts, result.unchanged) == (
        "SUCCESS", 3, 2, 1, 0)
    assert result.to_summary()["conflicts"] == 1
    assert fetch_customer(engine, edited[0]) == (None, None)  # not SENIOR from the old dob; due
    assert _side_effects(engine, edited[0]) == ([], [])
    for row in others:
        assert fetch_customer(engine, row[0]) == _expected("2001-01-01" if row is others[0] else "1990-07-01")
    delta = _sweep(engine, _plain("delta", cipher))
    assert (delta.scanned, delta.changed, delta.conflicts) == (1, 1, 0)
    assert fetch_customer(engine, edited[0]) == _expected("2010-08-09")
    [event] = _side_effects(engine, edited[0])[1]
    assert (event["from_category"], event["to_category"]) == (None, "MINOR")


def test_settled_row_edited_before_its_transition_is_written_gets_no_trigger(
    engine: sa.Engine, cipher: DobCipher
) -> None:
    """A due transition (YOUNG_ADULT → ADULT) whose dob is rewritten meanwhile leaves no trigger or event."""
    row = customer(cipher, "1999-05-20", category="YOUNG_ADULT", next_review=date(2025, 5, 20))
    copy_customers(engine, [row])
    result = _sweep(engine, EditingSweep("delta", cipher, _rewrite_dob(engine, cipher, row[0], "2005-01-02")))
    assert (result.changed, result.conflicts, result.triggers, result.audit_events) == (0, 1, 0, 0)
    assert fetch_customer(engine, row[0]) == ("YOUNG_ADULT", None)  # the edit cleared the date: due
    assert _side_effects(engine, row[0]) == ([], [])
    delta = _sweep(engine, _plain("delta", cipher))
    assert (delta.changed, delta.triggers) == (1, 0)  # from the new dob: still YOUNG_ADULT, no transition
    assert fetch_customer(engine, row[0]) == _expected("2005-01-02")
    assert _side_effects(engine, row[0]) == ([], [])


def test_failure_marker_is_not_written_over_a_repaired_row(engine: sa.Engine, cipher: DobCipher) -> None:
    """A row read with a bad dob and repaired meanwhile is not marked failed: a conflict; the next run computes it."""
    row = customer(cipher, "not a date", category="ADULT", next_review=date(2031, 1, 5))
    copy_customers(engine, [row])
    result = _sweep(engine, EditingSweep("full", cipher, _rewrite_dob(engine, cipher, row[0], "1990-07-01")))
    assert (result.failed_by_type["invalid_value"], result.conflicts) == (1, 1)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT review_failure, next_review_date FROM customers").one() == (None, None)
    delta = _sweep(engine, _plain("delta", cipher))
    assert (delta.changed, delta.failed) == (1, 0)
    assert fetch_customer(engine, row[0]) == _expected("1990-07-01")


def test_row_by_row_fallback_applies_the_same_check(engine: sa.Engine, cipher: DobCipher) -> None:
    """When the page write fails (a poisoned row), each row's own write still refuses a row edited meanwhile."""
    rows = [customer(cipher, f"198{i}-04-05") for i in range(4)]
    poison, edited = rows[1][0], rows[2][0]
    copy_customers(engine, rows)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"ALTER TABLE customers ADD CONSTRAINT poison CHECK (id <> '{poison}' OR age_category IS NULL)")
    result = _sweep(engine, EditingSweep("delta", cipher, _rewrite_dob(engine, cipher, edited, "1950-01-01")))
    assert (result.changed, result.conflicts, result.failed_by_type["write_error"]) == (2, 1, 1)
    assert fetch_customer(engine, edited) == (None, None)
    assert _side_effects(engine, edited) == ([], [])


def test_a_writer_blocking_the_page_write_then_editing_wins(engine: sa.Engine, cipher: DobCipher) -> None:
    """A row locked by another service's open transaction is written only after it commits, and then only if
    it still holds what was read: its edit is not overwritten (the write re-checks the committed row)."""
    rows = [customer(cipher, "1970-01-01"), customer(cipher, "1980-01-01")]
    copy_customers(engine, rows)
    target = rows[0][0]
    with engine.connect() as writer:
        writer.begin()
        writer.exec_driver_sql("SELECT 1 FROM customers WHERE id = %(id)s FOR UPDATE", {"id": target})
        outcome: list = []
        sweeping = threading.Thread(target=lambda: outcome.append(_sweep(engine, _plain("full", cipher))))
        sweeping.start()
        try:
            wait_for(lambda: _waiting_on_a_lock(engine), timeout=10, what="the page write waiting on the row lock")
            writer.exec_driver_sql("UPDATE customers SET encrypted_dob = %(blob)s WHERE id = %(id)s",
                                   {"blob": cipher.encrypt_text(target, "2012-12-12"), "id": target})
            writer.commit()
        finally:
            if writer.in_transaction():
                writer.rollback()
            sweeping.join(timeout=30)
    [result] = outcome
    assert (result.changed, result.conflicts) == (1, 1)
    assert fetch_customer(engine, target) == (None, None)
    assert fetch_customer(engine, rows[1][0]) == _expected("1980-01-01")


def _waiting_on_a_lock(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()").scalar())


# --- subscription expiry -----------------------------------------------------------------------------


class EditingExpiry(ExpirySweep):
    """The expiry with another connection's edit committed just before its first batch write."""

    def __init__(self, edit: Callable[[], None], *, fail_batch: bool = False) -> None:
        super().__init__("nightly", run_date=EXPIRY_RUN_DATE, max_retries=3)
        self.edit: Callable[[], None] | None = edit
        self.fail_batch = fail_batch

    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        edit, self.edit = self.edit, None
        if edit is not None:
            edit()
        if self.fail_batch:
            conn.exec_driver_sql("SELECT 1/0")  # the batch statement fails: one subscription per transaction
        return super().write_page(conn, changed)


EXPIRY_RUN_DATE = date(2024, 6, 15)


def _subscriptions(engine: sa.Engine, rows: Sequence[tuple[int, date]]) -> None:
    with engine.begin() as conn:
        for sub_id, expiry in rows:
            conn.exec_driver_sql("INSERT INTO subscriptions (id, expiry_date, status) VALUES (%(id)s, %(d)s, 'ACTIVE')",
                                 {"id": sub_id, "d": expiry})
            conn.exec_driver_sql("INSERT INTO enrollments (subscription_id, course_id) VALUES (%(id)s, 1)",
                                 {"id": sub_id})


def _subscription(engine: sa.Engine, sub_id: int) -> tuple:
    with engine.connect() as conn:
        return tuple(conn.exec_driver_sql(
            "SELECT status, expiry_date, (SELECT count(*) FROM enrollments WHERE subscription_id = s.id) "
            "FROM subscriptions s WHERE id = %(id)s", {"id": sub_id}).one())


@pytest.mark.parametrize("fail_batch", [False, True])
def test_expiry_of_a_subscription_changed_since_the_read_is_a_conflict(engine: sa.Engine, fail_batch: bool) -> None:
    """A subscription renewed, or moved to another past date, after the read is not expired: a conflict, left to the
    next run (which expires the moved one), in the batch statement and in the one-per-transaction fallback."""
    _subscriptions(engine, [(1, date(2024, 1, 1)), (2, date(2024, 2, 1)), (3, date(2024, 3, 1))])

    def edit() -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE subscriptions SET expiry_date = '2025-01-01' WHERE id = 1")  # renewed
            conn.exec_driver_sql("UPDATE subscriptions SET expiry_date = '2024-05-01' WHERE id = 2")  # moved

    settings = ExpirySettings().to_sweep_settings()
    result = run_sweep(engine, EditingExpiry(edit, fail_batch=fail_batch), settings,
                       RunContext("expiry-run", "nightly", EXPIRY_RUN_DATE))
    assert (result.status, result.scanned, result.changed, result.conflicts, result.failed) == (
        "SUCCESS", 3, 1, 2, 0)
    assert _subscription(engine, 1) == ("ACTIVE", date(2025, 1, 1), 1)
    assert _subscription(engine, 2) == ("ACTIVE", date(2024, 5, 1), 1)
    assert _subscription(engine, 3) == ("EXPIRED", date(2024, 3, 1), 0)
    again = run_expiry(engine, run_date=EXPIRY_RUN_DATE, settings=ExpirySettings())
    assert (again.scanned, again.expired, again.conflicts) == (1, 1, 0)
    assert again.to_summary("r2")["conflicts"] == 0
    assert _subscription(engine, 2) == ("EXPIRED", date(2024, 5, 1), 0)


def test_a_failed_expiry_does_not_mark_a_renewed_subscription_failed(engine: sa.Engine) -> None:
    """A subscription whose expiry failed is recorded FAILED only if it still holds what was read: one renewed
    between the failed write and the record stays ACTIVE with its enrollments."""
    _subscriptions(engine, [(7, date(2024, 1, 1)), (8, date(2024, 1, 2))])
    with engine.begin() as conn:
        conn.exec_driver_sql("""
            CREATE FUNCTION test_refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'refused';
            END; $$""")
        conn.exec_driver_sql("CREATE TRIGGER test_refuse_delete BEFORE DELETE ON enrollments "
                             "FOR EACH ROW EXECUTE FUNCTION test_refuse_delete()")

    class RenewingFailures(ExpiryFailures):
        def record(self, conn: sa.Connection, outcome: RowOutcome, exc: BaseException) -> Callable[[], None] | None:
            if outcome.change[0] == 7:
                with engine.begin() as other:
                    other.exec_driver_sql("UPDATE subscriptions SET expiry_date = '2026-01-01' WHERE id = 7")
            return super().record(conn, outcome, exc)

    settings = ExpirySettings().to_sweep_settings()
    definition = ExpirySweep("nightly", run_date=EXPIRY_RUN_DATE, max_retries=3)
    definition.write_failures = RenewingFailures(definition.from_status, definition.max_retries)
    result = run_sweep(engine, definition, settings, RunContext("expiry-run", "nightly", EXPIRY_RUN_DATE))
    assert (result.changed, result.failed) == (0, 2)
    with engine.connect() as conn:
        rows = dict(conn.exec_driver_sql("SELECT id, status FROM subscriptions").all())
    assert rows == {7: "ACTIVE", 8: "FAILED"}
    assert _subscription(engine, 7) == ("ACTIVE", date(2026, 1, 1), 1)
