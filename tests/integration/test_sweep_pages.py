"""Page processing of the customer-status sweep on a real PostgreSQL: writes, triggers, isolation, timeouts."""

from __future__ import annotations

import json
import uuid
from datetime import date

import pytest
import sqlalchemy as sa
from customer_rows import captured_statements, copy_customers, count, customer, fetch_customer, writes

from batch_assets.engine.definition import RunContext, WriteCounts
from batch_assets.engine.page_reader import PIN_READ_PLAN_SQL
from batch_assets.engine.runner import run_sweep
from batch_assets.engine.settings import SweepSettings
from batch_assets.reference.customer_status import sql
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.rules import DEFAULT_RULES, SENTINEL, evaluate
from batch_assets.reference.customer_status.sweep import CustomerStatusSweep

pytestmark = pytest.mark.integration

RUN_DATE = date(2025, 6, 1)
ONE_WORKER = SweepSettings(workers=1, window=1, page_size=100)


def _run(engine: sa.Engine, cipher: DobCipher, mode: str = "full", settings: SweepSettings = ONE_WORKER,
         definition: CustomerStatusSweep | None = None):
    definition = definition or CustomerStatusSweep(mode, cipher=cipher, run_date=RUN_DATE, rules=DEFAULT_RULES)
    return run_sweep(engine, definition, settings, RunContext("test-run", mode, RUN_DATE))


def _settled(cipher: DobCipher, dob: str) -> tuple:
    result = evaluate(date.fromisoformat(dob), RUN_DATE, DEFAULT_RULES)
    return customer(cipher, dob, category=result.category, next_review=result.next_review_date)


def _events(engine: sa.Engine) -> list[tuple]:
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT aggregate_id, event_type, payload, status FROM outbox_events ORDER BY id"
        ).all()


def _triggers(engine: sa.Engine) -> list[tuple]:
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT customer_id, from_category, to_category, effective_date FROM review_triggers ORDER BY id"
        ).all()


def test_unchanged_row_makes_zero_writes(engine: sa.Engine, cipher: DobCipher) -> None:
    """A row whose stored result equals the evaluation costs no statement besides the page read."""
    copy_customers(engine, [_settled(cipher, "1990-07-01"), _settled(cipher, "1950-01-01")])
    with captured_statements(engine) as statements:
        result = _run(engine, cipher)
    assert (result.scanned, result.unchanged, result.changed, result.decrypted) == (2, 2, 0, 2)
    assert writes(statements) == []
    assert len(statements) == 1  # the one page read
    assert _events(engine) == [] and _triggers(engine) == []


def test_first_computation_fires_no_trigger_but_one_event(engine: sa.Engine, cipher: DobCipher) -> None:
    """A stored NULL category is computed and stamped, with one outbox event and no review trigger."""
    row = customer(cipher, "2010-03-04")
    copy_customers(engine, [row])
    result = _run(engine, cipher)
    assert (result.changed, result.triggers, result.audit_events) == (1, 0, 1)
    assert fetch_customer(engine, row[0]) == ("MINOR", date(2028, 3, 4))
    assert _triggers(engine) == []
    [(aggregate_id, event_type, payload, status)] = _events(engine)
    assert (aggregate_id, event_type, status) == (row[0], "age_category_changed", "PENDING")
    assert payload == {"customer_id": str(row[0]), "from_category": None, "to_category": "MINOR"}


def test_real_transition_fires_exactly_one_trigger_with_the_effective_date(
    engine: sa.Engine, cipher: DobCipher
) -> None:
    """YOUNG_ADULT due on the 26th birthday becomes ADULT: one trigger effective that birthday, one small event."""
    # 26th birthday was 2025-05-20; the row is due since then (the delta missed a few days).
    row = customer(cipher, "1999-05-20", category="YOUNG_ADULT", next_review=date(2025, 5, 20))
    copy_customers(engine, [row])
    result = _run(engine, cipher, mode="delta")
    assert (result.scanned, result.changed, result.triggers, result.audit_events) == (1, 1, 1, 1)
    assert _triggers(engine) == [(row[0], "YOUNG_ADULT", "ADULT", date(2025, 5, 20))]
    [(_, _, payload, _)] = _events(engine)
    assert payload == {"customer_id": str(row[0]), "from_category": "YOUNG_ADULT", "to_category": "ADULT"}
    assert "1999" not in json.dumps(payload) and "2064" not in json.dumps(payload)
    assert fetch_customer(engine, row[0]) == ("ADULT", date(2064, 5, 20))
    again = _run(engine, cipher, mode="full")
    assert (again.changed, again.triggers, len(_triggers(engine)), len(_events(engine))) == (0, 0, 1, 1)


def test_changed_page_costs_two_statements(engine: sa.Engine, cipher: DobCipher) -> None:
    """A page of first computations and transitions is written with 2 statements: the preamble and one write
    (rows, review triggers and outbox events together, so a trigger exists exactly when its row committed)."""
    rows = [customer(cipher, f"19{70 + i}-01-0{1 + i % 9}", category="MINOR", next_review=RUN_DATE) for i in range(20)]
    rows += [customer(cipher, f"200{i}-02-03") for i in range(9)]
    copy_customers(engine, rows)
    with captured_statements(engine) as statements:
        result = _run(engine, cipher, settings=SweepSettings(workers=1, window=1, page_size=1000))
    assert (result.pages, result.changed, result.triggers, result.audit_events) == (1, 29, 20, 29)
    written = writes(statements)
    assert len(written) <= 2, written
    assert sum("UPDATE customers" in s for s in written) == 1
    assert sum("INSERT INTO review_triggers" in s for s in written) == 1


def test_page_transaction_carries_its_timeouts(engine: sa.Engine, cipher: DobCipher) -> None:
    """The page write runs with SET LOCAL statement_timeout / lock_timeout from the settings, and they end with it."""
    seen: list[tuple[str, str]] = []

    class Probe(CustomerStatusSweep):
        def write_page(self, conn: sa.Connection, changed) -> WriteCounts:
            seen.append((conn.exec_driver_sql("SHOW statement_timeout").scalar_one(),
                         conn.exec_driver_sql("SHOW lock_timeout").scalar_one()))
            return super().write_page(conn, changed)

    copy_customers(engine, [customer(cipher, "2001-01-01")])
    settings = SweepSettings(workers=1, window=1, page_timeout_s=7, lock_timeout_s=3)
    probe = Probe("full", cipher=cipher, run_date=RUN_DATE, rules=DEFAULT_RULES)
    with captured_statements(engine) as statements:
        result = _run(engine, cipher, settings=settings, definition=probe)
    assert result.changed == 1
    assert seen == [("7s", "3s")]
    timeouts = [p for s, p in statements if "set_config('statement_timeout'" in s]
    assert timeouts and all(p == {"statement_timeout": "7000ms", "lock_timeout": "3000ms"} for p in timeouts)
    with engine.connect() as conn:  # LOCAL: nothing leaks into the pooled session
        assert conn.exec_driver_sql("SHOW statement_timeout").scalar_one() == "0"


@pytest.mark.parametrize(("mode", "status"), [("full", "FAILURE"), ("delta", "SUCCESS")])
def test_poisoned_row_is_isolated_while_the_rest_commits(
    engine: sa.Engine, cipher: DobCipher, mode: str, status: str
) -> None:
    """A row whose write violates a constraint fails alone (write_error), stays due, and the page's others commit.

    A delta retries it tomorrow (it stays due), so the run succeeds; a full sweep would never read it again
    before the next full one, so the run ends FAILURE with its low watermark before the row."""
    rows = [customer(cipher, f"198{i}-04-05") for i in range(6)]
    poison = rows[3][0]
    copy_customers(engine, rows)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"ALTER TABLE customers ADD CONSTRAINT poison CHECK (id <> '{poison}' OR age_category IS NULL)"
        )
    seen: list[str] = []

    class Probe(CustomerStatusSweep):
        def write_row(self, conn: sa.Connection, outcome) -> WriteCounts:
            seen.append(conn.exec_driver_sql("SHOW statement_timeout").scalar_one())
            return super().write_row(conn, outcome)

    probe = Probe(mode, cipher=cipher, run_date=RUN_DATE, rules=DEFAULT_RULES)
    settings = SweepSettings(workers=1, window=1, row_timeout_s=2, page_timeout_s=9)
    result = _run(engine, cipher, mode, settings=settings, definition=probe)
    assert (result.changed, result.failed, result.failed_by_type["write_error"]) == (5, 1, 1)
    assert result.audit_events == 5 and result.status == status
    if status == "FAILURE":
        assert "row write(s) failed" in (result.stopped_reason or "") and result.last_cursor is None
    assert seen == ["2s"] * 6  # every row of the fallback in its own transaction with the row timeout
    assert fetch_customer(engine, poison) == (None, None)  # still due
    assert {e[0] for e in _events(engine)} == {r[0] for r in rows} - {poison}
    for row in rows:
        if row[0] != poison:
            assert fetch_customer(engine, row[0])[0] == "ADULT"


def test_failed_rows_stay_due(engine: sa.Engine, cipher: DobCipher) -> None:
    """Rows that cannot be evaluated never get a future date: the next delta run reads them again."""
    bad_text = customer(cipher, "31.12.1990", category="ADULT", next_review=date(2030, 1, 1))
    missing = customer(cipher, None, category="ADULT", next_review=date(2031, 1, 1))
    moved = (uuid.uuid4(), "ACTIVE", cipher.encrypt_text(uuid.uuid4(), "1990-01-01"), None, None)  # another row's
    future = customer(cipher, "2026-01-01")
    copy_customers(engine, [bad_text, missing, moved, future])
    result = _run(engine, cipher)
    assert result.failed_by_type == {"missing_data": 1, "invalid_value": 2, "decrypt_failure": 1, "write_error": 0}
    assert (result.changed, result.audit_events) == (0, 0)
    assert fetch_customer(engine, bad_text[0]) == ("ADULT", None)
    assert fetch_customer(engine, missing[0]) == ("ADULT", None)
    assert fetch_customer(engine, moved[0]) == (None, None)
    assert fetch_customer(engine, future[0]) == (None, None)
    delta = _run(engine, cipher, mode="delta")
    assert (delta.scanned, delta.failed) == (4, 4)


def test_delta_reads_only_due_rows(engine: sa.Engine, cipher: DobCipher) -> None:
    """delta selects NULL or <= run date; settled rows with a future date or the sentinel are not read."""
    due = [customer(cipher, "2007-06-01", category="MINOR", next_review=RUN_DATE), customer(cipher, "2000-01-01")]
    settled = [_settled(cipher, "1950-01-01"), _settled(cipher, "1990-01-01")]
    closed = customer(cipher, "2000-01-01", status="CLOSED")
    copy_customers(engine, [*due, *settled, closed])
    result = _run(engine, cipher, mode="delta")
    assert (result.scanned, result.changed) == (2, 2)
    assert fetch_customer(engine, settled[0][0]) == ("SENIOR", SENTINEL)
    assert fetch_customer(engine, closed[0]) == (None, None)


def test_delta_query_is_an_index_range_scan(engine: sa.Engine, cipher: DobCipher) -> None:
    """The delta after-cursor query walks customers_due_idx in order: no sort node."""
    rows = [customer(cipher, "2000-01-01", category="YOUNG_ADULT", next_review=date(2026, 1, i % 28 + 1))
            for i in range(5000)]
    copy_customers(engine, rows + [customer(cipher, "2000-01-01") for _ in range(3000)])
    params = {"run_date": RUN_DATE, "after_date": "-infinity", "after_id": uuid.UUID(int=0), "limit": 100,
              "max_value_bytes": 1024}
    with engine.connect() as conn:
        plan = conn.execute(sa.text("EXPLAIN (FORMAT JSON) " + sql.DELTA_AFTER_PAGE.text), params).scalar_one()
    text = json.dumps(plan)
    assert "customers_due_idx" in text
    assert '"Sort"' not in text


def test_outbox_rows_match_updates_in_bulk(engine: sa.Engine, cipher: DobCipher) -> None:
    """Several pages: every changed row is stamped and has exactly one event; count(events) == changed."""
    copy_customers(engine, [customer(cipher, f"19{50 + i % 50}-0{1 + i % 9}-1{i % 10}") for i in range(250)])
    result = _run(engine, cipher, settings=SweepSettings(workers=2, window=2, page_size=40))
    assert (result.scanned, result.changed, result.pages) == (250, 250, 7)
    assert count(engine, "outbox_events") == 250
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM customers WHERE next_review_date IS NULL").scalar_one() == 0


@pytest.mark.parametrize("analyzed", [False, True])
def test_full_query_walks_an_id_index_without_sort_even_without_statistics(engine: sa.Engine, analyzed: bool) -> None:
    """The full after-cursor query is an ordered index scan, right after a bulk load (no statistics) and after."""
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE customers SET (autovacuum_enabled = false)")
        conn.exec_driver_sql(
            "INSERT INTO customers (id, status, encrypted_dob, age_category, next_review_date) "
            "SELECT gen_random_uuid(), CASE WHEN mod(g, 10) = 0 THEN 'CLOSED' ELSE 'ACTIVE' END, "
            "'\\x00'::bytea, NULL, NULL FROM generate_series(1, 200000) AS g"
        )
        if analyzed:
            conn.exec_driver_sql("ANALYZE customers")
    params = {"after": uuid.UUID(int=2**127), "hi": uuid.UUID(int=2**128 - 1), "limit": 1000, "max_value_bytes": 1024}
    with engine.connect() as conn:
        conn.exec_driver_sql(PIN_READ_PLAN_SQL)  # what the sweep's reader connection runs first
        plan = conn.execute(sa.text("EXPLAIN (FORMAT JSON) " + sql.FULL_AFTER_PAGE.text), params).scalar_one()
    text = json.dumps(plan)
    assert '"Sort"' not in text and "Bitmap" not in text, text
    assert "customers_pkey" in text, text  # the only id index since migration 0009
