"""Hostile customer rows other services may write (docs/reference/tables.md, docs/reference/rules.md), swept for real
on PostgreSQL: each gets a
counted, named outcome, keeps its category, is left due, feeds the breaker only when it says the key is wrong,
and a page's memory stays bounded in bytes whatever the rows hold."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from datetime import date

import pytest
import sqlalchemy as sa
from customer_rows import copy_customers, customer

from batch_assets.engine.definition import RowOutcome, RunContext, WriteCounts
from batch_assets.engine.runner import run_sweep
from batch_assets.engine.settings import SweepSettings
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.rules import DEFAULT_RULES, evaluate
from batch_assets.reference.customer_status.sweep import MAX_VALUE_BYTES, CustomerStatusSweep

pytestmark = pytest.mark.integration

RUN_DATE = date(2025, 6, 1)
SETTLED = ("ADULT", date(2031, 1, 5))
"""What every hostile row holds before the sweep: a category and a date that is not due."""

INVALID_PLAINTEXTS = (" 990-01-01", "1_90-01-01", "+990-01-01", "١٩٩٠-٠١-٠١", "1990-01-01\n", "1990-01-011",
                      "0000-01-01", "2023-02-29", "2025-06-02", "")


def _hostile_rows(cipher: DobCipher) -> dict[uuid.UUID, tuple[str, bytes | None]]:
    """id → (expected failure kind, encrypted_dob) for every kind of hostile value."""
    def new(blob_of) -> tuple[uuid.UUID, bytes | None]:
        cid = uuid.uuid4()
        return cid, blob_of(cid)

    kinds: list[tuple[str, object]] = [
        ("missing_data", lambda cid: None),
        ("missing_data", lambda cid: b""),
        # Too long to read into a page: authenticated a part at a time. 2 MB that do not decrypt (random, or a date's
        # ciphertext with 2 MB appended) are decrypt_failure; a 2 MB plaintext that decrypts is invalid_value.
        ("decrypt_failure", lambda cid: os.urandom(2 * 1024 * 1024)),
        ("decrypt_failure", lambda cid: cipher.encrypt_text(cid, "1990-01-01") + b" " * 2_000_000),
        ("invalid_value", lambda cid: cipher.encrypt(cid, b"1990-01-01" + b" " * 2_000_000)),
        ("decrypt_failure", lambda cid: b"\x01" * (MAX_VALUE_BYTES + 1)),
        ("decrypt_failure", lambda cid: os.urandom(20)),  # too short
        ("decrypt_failure", lambda cid: os.urandom(38)),  # garbage of the right length
        ("decrypt_failure", lambda cid: cipher.encrypt_text(uuid.uuid4(), "1990-01-01")),  # another row's
        ("decrypt_failure", lambda cid: cipher.encrypt_text(cid, "1990-01-01")[:-1]),  # half-written
        ("invalid_value", lambda cid: cipher.encrypt(cid, b"\xff\xfe1990-01")),  # not even text
    ]
    kinds += [("invalid_value", lambda cid, t=text: cipher.encrypt(cid, t.encode())) for text in INVALID_PLAINTEXTS]
    rows = {}
    for kind, blob_of in kinds:
        cid, blob = new(blob_of)  # type: ignore[arg-type]
        rows[cid] = (kind, blob)
    return rows


def _insert(engine: sa.Engine, rows: dict[uuid.UUID, tuple[str, bytes | None]], status: str = "ACTIVE") -> None:
    """Another service's INSERTs (its own connection and transaction)."""
    with engine.begin() as conn:
        for cid, (_, blob) in rows.items():
            conn.exec_driver_sql(
                "INSERT INTO customers (id, status, encrypted_dob, age_category, next_review_date) "
                "VALUES (%(id)s, %(status)s, %(blob)s, %(category)s, %(date)s)",
                {"id": cid, "status": status, "blob": blob, "category": SETTLED[0], "date": SETTLED[1]},
            )


def _stored(engine: sa.Engine) -> dict[uuid.UUID, tuple]:
    with engine.connect() as conn:
        return {r[0]: tuple(r[1:]) for r in conn.exec_driver_sql(
            "SELECT id, age_category, next_review_date, review_failure FROM customers")}


def _side_effects(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return (conn.exec_driver_sql("SELECT count(*) FROM review_triggers").scalar_one(),
                conn.exec_driver_sql("SELECT count(*) FROM outbox_events").scalar_one())


class Recording(CustomerStatusSweep):
    """Notes the largest encrypted_dob a page handed to compute (what a page holds in memory)."""

    largest = 0

    def compute(self, row):  # type: ignore[no-untyped-def]
        if isinstance(row[1], bytes):
            Recording.largest = max(Recording.largest, len(row[1]))
        return super().compute(row)


def _sweep(engine: sa.Engine, cipher: DobCipher, mode: str, settings: SweepSettings | None = None,
           definition: CustomerStatusSweep | None = None):
    definition = definition or Recording(mode, cipher=cipher, run_date=RUN_DATE, rules=DEFAULT_RULES)
    settings = settings or SweepSettings(workers=2, window=2, page_size=10)
    return run_sweep(engine, definition, settings, RunContext("hostile", mode, RUN_DATE))


def _expected_counts(rows: dict[uuid.UUID, tuple[str, bytes | None]]) -> dict[str, int]:
    counts = {"missing_data": 0, "invalid_value": 0, "decrypt_failure": 0, "write_error": 0}
    for kind, _ in rows.values():
        counts[kind] += 1
    return counts


def test_every_hostile_row_is_counted_by_kind_and_left_due(engine: sa.Engine, cipher: DobCipher) -> None:
    """Each hostile value is counted under its kind, keeps its category, loses its future date (due) and records
    its kind; no page holds a value over max_value_bytes; a status 'active' row is not swept; a delta
    counts them again, as known rows."""
    hostile = _hostile_rows(cipher)
    good = [customer(cipher, "1990-07-01") for _ in range(60)]
    copy_customers(engine, good)
    _insert(engine, hostile)
    lowercase = {cid: ("", cipher.encrypt_text(cid, "1990-01-01")) for cid in (uuid.uuid4(), uuid.uuid4())}
    _insert(engine, lowercase, status="active")  # not ACTIVE: outside every mode's selection, never touched
    Recording.largest = 0
    full = _sweep(engine, cipher, "full")
    assert full.status == "SUCCESS", full.stopped_reason
    assert full.failed_by_type == _expected_counts(hostile)
    assert (full.failed, full.changed, full.conflicts) == (len(hostile), len(good), 0)
    assert Recording.largest <= MAX_VALUE_BYTES
    stored = _stored(engine)
    for cid, (kind, _) in hostile.items():
        assert stored[cid] == (SETTLED[0], None, kind), (kind, stored[cid])
    assert {stored[cid] for cid in lowercase} == {(*SETTLED, None)}
    assert _side_effects(engine) == (0, len(good))  # events for the good rows' first computation only
    delta = _sweep(engine, cipher, "delta")
    assert (delta.status, delta.scanned, delta.changed) == ("SUCCESS", len(hostile), 0)
    assert delta.failed_by_type == _expected_counts(hostile)
    assert _stored(engine) == stored  # known failures, still due: no write at all


def test_one_copied_ciphertext_among_good_rows_is_left_due(engine: sa.Engine, cipher: DobCipher) -> None:
    """A single row holding another row's ciphertext is decrypt_failure and made due (it held a future date),
    while the same rows under a wrong key write nothing at all and trip the breaker."""
    good = [customer(cipher, "1990-07-01") for _ in range(299)]
    result = evaluate(date(1990, 7, 1), RUN_DATE, DEFAULT_RULES)
    good = [(g[0], g[1], g[2], result.category, result.next_review_date) for g in good]
    copied = uuid.uuid4()
    copy_customers(engine, [*good, (copied, "ACTIVE", good[0][2], *SETTLED)])
    before = _stored(engine)
    wrong = _sweep(engine, DobCipher(os.urandom(32)), "full", SweepSettings(workers=2, window=2, page_size=50))
    assert wrong.status == "FAILURE" and (wrong.stopped_reason or "").startswith("circuit breaker")
    assert _stored(engine) == before and _side_effects(engine) == (0, 0)
    right = _sweep(engine, cipher, "full", SweepSettings(workers=2, window=2, page_size=1000))
    assert (right.status, right.failed_by_type["decrypt_failure"], right.changed) == ("SUCCESS", 1, 0)
    assert _stored(engine)[copied] == (SETTLED[0], None, "decrypt_failure")


class Injecting(CustomerStatusSweep):
    """Another service writes hostile values while the sweep runs: before the first page write, onto rows of
    this page (already read: conflicts) and of pages not read yet."""

    def __init__(self, cipher: DobCipher, engine: sa.Engine, values: dict[uuid.UUID, bytes | None]) -> None:
        super().__init__("full", cipher=cipher, run_date=RUN_DATE, rules=DEFAULT_RULES)
        self.engine, self.values = engine, values

    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        values, self.values = self.values, {}
        if values:
            with self.engine.begin() as other:
                for cid, blob in values.items():
                    other.exec_driver_sql("UPDATE customers SET encrypted_dob = %(blob)s WHERE id = %(id)s",
                                          {"blob": blob, "id": cid})
        return super().write_page(conn, changed)


def test_hostile_values_written_during_a_run_end_due_and_named(engine: sa.Engine, cipher: DobCipher) -> None:
    """Hostile values another connection writes during a full sweep are never overwritten with a result: the rows
    of the page in hand are conflicts, the later ones are read as they now are; all end due and named by a delta."""
    dob = "1990-07-01"
    result = evaluate(date.fromisoformat(dob), RUN_DATE, DEFAULT_RULES)
    rows = [customer(cipher, dob, category="YOUNG_ADULT", next_review=date(2020, 1, 1),
                     customer_id=uuid.UUID(int=i + 1)) for i in range(40)]
    copy_customers(engine, rows)
    kinds = {"missing_data": None, "empty": b"", "decrypt_failure": os.urandom(38), "oversized": b"\x02" * 5000}
    first_page = {rows[i][0]: blob for i, blob in enumerate(kinds.values())}
    later_page = {rows[30 + i][0]: blob for i, blob in enumerate(kinds.values())}
    definition = Injecting(cipher, engine, {**first_page, **later_page})
    full = _sweep(engine, cipher, "full", SweepSettings(workers=1, window=1, page_size=10), definition)
    assert full.status == "SUCCESS", full.stopped_reason
    assert full.conflicts == len(first_page)
    assert full.failed_by_type == {"missing_data": 2, "invalid_value": 0, "decrypt_failure": 2, "write_error": 0}
    stored = _stored(engine)
    for cid in first_page:
        assert stored[cid] == ("YOUNG_ADULT", None, None)  # the edit cleared the date; not written over
    for cid, kind in zip(later_page, ("missing_data", "missing_data", "decrypt_failure", "decrypt_failure"),
                         strict=True):
        assert stored[cid] == ("YOUNG_ADULT", None, kind)
    untouched = [r[0] for r in rows if r[0] not in first_page and r[0] not in later_page]
    assert all(stored[cid] == (result.category, result.next_review_date, None) for cid in untouched)
    delta = _sweep(engine, cipher, "delta")
    assert (delta.scanned, delta.failed, delta.changed) == (8, 8, 0)
    assert _side_effects(engine)[0] == len(untouched)  # YOUNG_ADULT → ADULT for the untouched rows only


def test_a_page_over_the_breaker_ratio_in_a_run_too_small_to_trip_leaves_its_rows_due(
    engine: sa.Engine, cipher: DobCipher
) -> None:
    """Half a page of copied ciphertexts, in a run that never reaches breaker_min_rows: no breaker, and every
    failed row is still made due (its writes wait for the drain, which knows the page does not trip)."""
    rows = [customer(cipher, "1990-07-01", customer_id=uuid.UUID(int=i + 1)) for i in range(20)]
    bad = [(uuid.UUID(int=i + 1), "ACTIVE", rows[10][2], *SETTLED) for i in range(5)]  # another row's ciphertext
    copy_customers(engine, bad + rows[5:])
    result = _sweep(engine, cipher, "full", SweepSettings(workers=2, window=2, page_size=10))
    assert (result.status, result.failed_by_type["decrypt_failure"], result.changed) == ("SUCCESS", 5, 15)
    stored = _stored(engine)
    assert all(stored[row[0]] == (SETTLED[0], None, "decrypt_failure") for row in bad)


def test_one_hostile_row_in_a_short_last_page_does_not_trip_the_breaker(engine: sa.Engine, cipher: DobCipher) -> None:
    """A copied ciphertext among the 4 rows of a run's last page, after breaker_min_rows rows, is one failed row,
    not "25% of a page failing": the run ends SUCCESS and the row is left due and named."""
    rows = [customer(cipher, "1990-07-01", customer_id=uuid.UUID(int=i + 1)) for i in range(104)]
    copied = uuid.UUID(int=104)  # the highest id: the last row of the last page (full reads in id order)
    rows[-1] = (copied, "ACTIVE", rows[0][2], *SETTLED)
    copy_customers(engine, rows)
    result = _sweep(engine, cipher, "full", SweepSettings(workers=1, window=1, page_size=100))
    assert result.status == "SUCCESS", result.stopped_reason
    assert (result.pages, result.failed_by_type["decrypt_failure"], result.changed) == (2, 1, 103)
    assert _stored(engine)[copied] == (SETTLED[0], None, "decrypt_failure")
