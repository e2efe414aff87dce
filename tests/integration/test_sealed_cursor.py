"""The customer-status delta's checkpoint: its cursor ([next_review_date, id], a date derived from the date of birth)
is kept sealed, so no date can be read from ba_checkpoints; the next run opens it and resumes. A cursor in clear (as
the previous release saved it) is resumed once; one that cannot be opened starts the range over."""

from __future__ import annotations

import json
import re
import threading
from datetime import date, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from customer_rows import copy_customers, customer

from batch_assets.locking.checkpoint import CheckpointStore
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.job import run_customer_status_sweep

pytestmark = pytest.mark.integration

RUN_DATE = date(2025, 6, 1)
ROWS = 400
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _due_customers(cipher: DobCipher) -> list[tuple]:
    """Customers due on distinct past dates (the delta's cursor then holds a real date), born in 1990."""
    return [customer(cipher, "1990-07-01", category="YOUNG_ADULT", next_review=date(2020, 1, 1) + timedelta(days=i))
            for i in range(ROWS)]


def _delta(engine: sa.Engine, cipher: DobCipher, store: CheckpointStore, stop: threading.Event | None = None,
           progress: Any = None) -> Any:
    return run_customer_status_sweep(engine, cipher, mode="delta", run_date=RUN_DATE, run_id="run-1",
                                     settings={"workers": 1, "window": 1, "page_size": 50, "checkpoint_every_s": 1e-9},
                                     checkpoints=store, stop=stop or threading.Event(), progress=progress)


def _stored_cursor(engine: sa.Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT cursor FROM ba_checkpoints WHERE mode = 'delta'")).scalar_one()


def _interrupted(engine: sa.Engine, cipher: DobCipher, store: CheckpointStore) -> Any:
    stop = threading.Event()

    def progress(counters: dict[str, Any]) -> None:
        if counters["pages"] >= 2:
            stop.set()

    first = _delta(engine, cipher, store, stop, progress)
    assert first.status == "FAILURE" and first.stopped_reason == "stop requested"
    assert 100 <= first.scanned < ROWS
    return first


def test_the_delta_checkpoint_holds_no_date_and_the_next_run_resumes(engine: sa.Engine, cipher: DobCipher) -> None:
    copy_customers(engine, _due_customers(cipher))
    store = CheckpointStore(engine)
    first = _interrupted(engine, cipher, store)
    stored = _stored_cursor(engine)
    text = json.dumps(stored)
    assert not DATE_RE.search(text), f"a date is readable from the checkpoint: {text}"
    assert first.last_cursor["after_id"] not in text, "the cursor is sealed whole"
    second = _delta(engine, cipher, store)
    assert second.status == "SUCCESS" and second.resumed_from == first.last_cursor
    assert first.scanned + second.scanned == ROWS, "resumed after the low watermark: no row read twice"


def test_a_clear_cursor_of_the_previous_release_resumes_and_an_unreadable_one_starts_over(
    engine: sa.Engine, cipher: DobCipher
) -> None:
    rows = _due_customers(cipher)
    copy_customers(engine, rows)
    store = CheckpointStore(engine)
    first = _interrupted(engine, cipher, store)
    due_on = {str(row[0]): row[4] for row in rows}
    last = first.last_cursor["after_id"]
    clear = [due_on[last].isoformat(), last]  # what the previous release saved: [next_review_date read, id]
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE ba_checkpoints SET cursor = CAST(:c AS jsonb) WHERE mode = 'delta'"),
                     {"c": json.dumps(clear)})
    resumed = _delta(engine, cipher, store)
    assert resumed.status == "SUCCESS" and resumed.resumed_from == first.last_cursor
    assert first.scanned + resumed.scanned == ROWS

    with engine.begin() as conn:  # due again, and a checkpoint sealed under another key
        conn.execute(sa.text("UPDATE customers SET next_review_date = DATE '2020-01-01'"))
    second = _interrupted(engine, cipher, store)
    assert second.scanned < ROWS
    other = DobCipher(b"\x01" * 32)
    other_store = CheckpointStore(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE ba_checkpoints SET cursor = CAST(:c AS jsonb) WHERE mode = 'delta'"),
                     {"c": json.dumps(_stored_cursor_sealed_by(other))})
    over = _delta(engine, cipher, other_store)
    assert over.status == "SUCCESS" and over.resumed_from is None, "an unreadable cursor starts the range over"


def _stored_cursor_sealed_by(cipher: DobCipher) -> Any:
    from batch_assets.reference.customer_status.sweep import DeltaReader

    return DeltaReader(RUN_DATE, 1024, cipher).seal_cursor(["2020-01-01", "00000000-0000-0000-0000-000000000001"])
