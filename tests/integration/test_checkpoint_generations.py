"""Checkpoint generations and verified cursors: a resumed run never re-reads a finished range, whatever the
timing; after a finished run the next starts fresh; a corrupt checkpoint starts its range over."""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from datetime import date, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from customer_rows import copy_customers, random_customers

from batch_assets.engine.definition import CursorRange
from batch_assets.engine.result import SweepResult
from batch_assets.engine.runner import FINISHED
from batch_assets.locking.checkpoint import CheckpointStore
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.dagster import split_key_space
from batch_assets.reference.customer_status.job import run_customer_status_sweep
from batch_assets.reference.customer_status.rules import DEFAULT_RULES

pytestmark = pytest.mark.integration

RUN_DATE = date(2025, 6, 1)
FINGERPRINT = f"{DEFAULT_RULES.fingerprint}:{RUN_DATE}"
RANGES = split_key_space(4)
KEYS = [r.key for r in RANGES]
SETTINGS = {"workers": 2, "window": 2, "page_size": 25, "checkpoint_every_s": 1e-9}


def _sweep(engine: sa.Engine, cipher: DobCipher, store: CheckpointStore, cursor_range: CursorRange | None,
           mode: str = "full", run_date: date = RUN_DATE, **kwargs: Any) -> SweepResult:
    return run_customer_status_sweep(engine, cipher, mode=mode, run_date=run_date, settings=SETTINGS,
                                     run_id="run-x", checkpoints=store, cursor_range=cursor_range, **kwargs)


def _begin(store: CheckpointStore, keys: list[str] = KEYS, fingerprint: str = FINGERPRINT) -> CheckpointStore:
    generation = store.begin("customer_status", "full", keys, fingerprint=fingerprint, run_id="run-x",
                             run_date=RUN_DATE)
    return store.in_generation(generation.id)


IN_RANGE = sa.text("SELECT count(*) FROM customers WHERE id BETWEEN :lo AND :hi")
UNCOMPUTED_IN_RANGE = sa.text("SELECT count(*) FROM customers WHERE id BETWEEN :lo AND :hi AND age_category IS NULL")
# :lo, :hi — the cursor range's inclusive bounds


def _in_range(engine: sa.Engine, cursor_range: CursorRange, *, uncomputed: bool = False) -> int:
    with engine.connect() as conn:
        return conn.execute(UNCOMPUTED_IN_RANGE if uncomputed else IN_RANGE,
                            {"lo": cursor_range.lo, "hi": cursor_range.hi}).scalar_one()


def _uncomputed(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM customers WHERE age_category IS NULL").scalar_one()


def _stop_after(pages: int) -> tuple[threading.Event, Any]:
    stop = threading.Event()

    def progress(snapshot: dict[str, Any]) -> None:
        if snapshot["pages"] >= pages:
            stop.set()

    return stop, progress


@pytest.fixture
def seeded(engine: sa.Engine, cipher: DobCipher) -> int:
    copy_customers(engine, random_customers(cipher, 800))
    return 800


def test_a_resumed_generation_skips_the_finished_range_and_resumes_the_others(
    engine: sa.Engine, cipher: DobCipher, seeded: int
) -> None:
    """Range 1 finished, range 2 stopped half-way, 3 and 4 never started: the next run reads 0 rows of range 1,
    range 2 after its checkpoint and 3 and 4 whole; every row is computed exactly once."""
    store = CheckpointStore(engine)
    first = _begin(store)
    assert _sweep(engine, cipher, first, RANGES[0]).status == "SUCCESS"
    stop, progress = _stop_after(2)
    stopped = _sweep(engine, cipher, first, RANGES[1], stop=stop, progress=progress)
    assert stopped.status == "FAILURE" and 0 < stopped.scanned < _in_range(engine, RANGES[1])

    generation = store.begin("customer_status", "full", KEYS, fingerprint=FINGERPRINT, run_id="run-y",
                             run_date=RUN_DATE)
    assert generation.resumed and generation.finished == (KEYS[0],)
    second = store.in_generation(generation.id)
    results = [_sweep(engine, cipher, second, r) for r in RANGES]
    assert [r.status for r in results] == ["SUCCESS"] * 4
    assert (results[0].scanned, results[0].pages, results[0].resumed_from) == (0, 0, FINISHED)
    assert results[1].resumed_from == stopped.last_cursor
    assert results[1].scanned <= _in_range(engine, RANGES[1]) - stopped.scanned + 2 * 25  # + pages in flight
    assert [r.scanned for r in results[2:]] == [_in_range(engine, r) for r in RANGES[2:]]
    assert [r.resumed_from for r in results[2:]] == [None, None]
    assert _uncomputed(engine) == 0


def test_a_range_that_finished_before_the_others_started_is_not_read_again(
    engine: sa.Engine, cipher: DobCipher, seeded: int
) -> None:
    """Only range 1 ran (the others have no checkpoint yet): the resuming run still skips it."""
    store = CheckpointStore(engine)
    assert _sweep(engine, cipher, _begin(store), RANGES[0]).status == "SUCCESS"
    second = _begin(store)
    results = [_sweep(engine, cipher, second, r) for r in RANGES]
    assert results[0].scanned == 0 and results[0].resumed_from == FINISHED
    assert sum(r.scanned for r in results) == seeded - _in_range(engine, RANGES[0])
    assert _uncomputed(engine) == 0


def test_ranges_finishing_concurrently_do_not_restart_a_range_that_starts_late(
    engine: sa.Engine, cipher: DobCipher, seeded: int
) -> None:
    """In a resumed run, ranges 2-4 finish concurrently before range 1's op starts: range 1 (finished in the
    interrupted run) is still skipped, since the plan decided for the whole generation."""
    store = CheckpointStore(engine)
    assert _sweep(engine, cipher, _begin(store), RANGES[0]).status == "SUCCESS"
    second = _begin(store)
    results: dict[int, SweepResult] = {}

    def sweep(index: int) -> None:
        results[index] = _sweep(engine, cipher, second, RANGES[index])

    threads = [threading.Thread(target=sweep, args=(i,)) for i in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(results) == [1, 2, 3] and all(r.status == "SUCCESS" for r in results.values())
    assert {c.status for c in store.list("customer_status")} == {"DONE"}
    late = _sweep(engine, cipher, second, RANGES[0])
    assert (late.status, late.scanned, late.resumed_from) == ("SUCCESS", 0, FINISHED)


def test_a_finished_generation_starts_over(engine: sa.Engine, cipher: DobCipher, seeded: int) -> None:
    """After every range finished, the next run's plan starts a new generation and reads every row again."""
    store = CheckpointStore(engine)
    first = _begin(store)
    assert sum(_sweep(engine, cipher, first, r).scanned for r in RANGES) == seeded
    generation = store.begin("customer_status", "full", KEYS, fingerprint=FINGERPRINT, run_id="run-z",
                             run_date=RUN_DATE)
    assert not generation.resumed
    again = store.in_generation(generation.id)
    results = [_sweep(engine, cipher, again, r) for r in RANGES]
    assert sum(r.scanned for r in results) == seeded and all(r.resumed_from is None for r in results)


@pytest.mark.parametrize(
    ("keys", "fingerprint", "why"),
    [
        ([r.key for r in split_key_space(2)], FINGERPRINT, "are not the 2 planned"),
        (KEYS, f"{DEFAULT_RULES.fingerprint}:{RUN_DATE + timedelta(days=1)}", "belongs to fingerprint"),
    ],
)
def test_other_ranges_or_fingerprint_start_over_with_a_warning(
    engine: sa.Engine, cipher: DobCipher, seeded: int, caplog: pytest.LogCaptureFixture,
    keys: list[str], fingerprint: str, why: str,
) -> None:
    """An unfinished generation planned with other ranges (--ranges changed) or another fingerprint (rules or
    run date) is not resumed: a new generation of PLANNED ranges, and a warning saying why."""
    store = CheckpointStore(engine)
    stop, progress = _stop_after(2)
    assert _sweep(engine, cipher, _begin(store), RANGES[0], stop=stop, progress=progress).status == "FAILURE"
    with caplog.at_level(logging.WARNING, logger="batch_assets.locking.checkpoint"):
        generation = store.begin("customer_status", "full", keys, fingerprint=fingerprint, run_id="run-y",
                                 run_date=RUN_DATE)
    assert not generation.resumed
    assert any(why in r.getMessage() and "starting over" in r.getMessage() for r in caplog.records)
    rows = store.list("customer_status")
    assert sorted(c.range_key for c in rows) == sorted(keys)
    assert {(c.status, c.cursor, c.generation) for c in rows} == {("PLANNED", None, generation.id)}


def test_a_delta_is_one_range_of_its_own_generation(engine: sa.Engine, cipher: DobCipher, seeded: int) -> None:
    """A delta registers its one range 'all'; a full generation of the same sweep is left as it is."""
    store = CheckpointStore(engine)
    stop, progress = _stop_after(2)
    assert _sweep(engine, cipher, _begin(store), RANGES[0], stop=stop, progress=progress).status == "FAILURE"
    due = _uncomputed(engine)
    delta = store.begin("customer_status", "delta", ["all"], fingerprint=FINGERPRINT, run_id="run-d",
                        run_date=RUN_DATE)
    result = _sweep(engine, cipher, store.in_generation(delta.id), None, mode="delta")
    assert result.status == "SUCCESS" and result.scanned == due > 0 and _uncomputed(engine) == 0
    assert store.begin("customer_status", "full", KEYS, fingerprint=FINGERPRINT, run_id="run-f",
                       run_date=RUN_DATE).resumed


def test_checkpoints_saved_without_a_plan_resume_their_unfinished_ranges_only(
    engine: sa.Engine, cipher: DobCipher, seeded: int
) -> None:
    """Checkpoints of runs without a plan (the engine on its own, or before generations existed): the plan resumes
    the unfinished ones, but reads a DONE one again, since it may be an earlier run's."""
    store = CheckpointStore(engine)
    assert _sweep(engine, cipher, store, RANGES[0]).status == "SUCCESS"
    stop, progress = _stop_after(2)
    stopped = _sweep(engine, cipher, store, RANGES[1], stop=stop, progress=progress)
    for r in RANGES[2:]:
        store.save("customer_status", "full", r.key, cursor=None, fingerprint=FINGERPRINT, run_id="run-x",
                   run_date=RUN_DATE, counters={})
    assert {c.generation for c in store.list("customer_status")} == {None}
    planned = _begin(store)
    results = [_sweep(engine, cipher, planned, r) for r in RANGES]
    assert results[0].scanned == _in_range(engine, RANGES[0]) and results[0].resumed_from is None
    assert results[1].resumed_from == stopped.last_cursor
    assert _uncomputed(engine) == 0


# --- corrupt checkpoints (written by another connection) -----------------------------------------

BEYOND = str(uuid.UUID(int=RANGES[1].hi.int + 1))  # the first key of range 3: past range 2's end
BEFORE = str(uuid.UUID(int=RANGES[1].lo.int - 1))  # the last key of range 1


def _corrupt(engine: sa.Engine, mode: str, range_key: str, cursor: Any, fingerprint: str = FINGERPRINT) -> None:
    """Write a RUNNING checkpoint with `cursor` (JSON) through a connection of its own."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO ba_checkpoints (sweep, mode, range_key, cursor, rules_fingerprint, status) "
            "VALUES ('customer_status', :mode, :key, CAST(:cursor AS jsonb), :fp, 'RUNNING') "
            "ON CONFLICT (sweep, mode, range_key) DO UPDATE SET cursor = EXCLUDED.cursor, status = 'RUNNING', "
            "rules_fingerprint = EXCLUDED.rules_fingerprint"
        ), {"mode": mode, "key": range_key, "cursor": json.dumps(cursor), "fp": fingerprint})


@pytest.mark.parametrize(
    "cursor",
    ["not-a-uuid", 12345, {"after": "x"}, ["2025-01-01", str(uuid.uuid4())], BEYOND, BEFORE],
    ids=["garbage", "number", "object", "delta-shaped", "past-the-end", "before-the-start"],
)
def test_a_corrupt_full_checkpoint_starts_its_range_over(
    engine: sa.Engine, cipher: DobCipher, seeded: int, caplog: pytest.LogCaptureFixture, cursor: Any
) -> None:
    """A full checkpoint that is not an id inside its range is not resumed: the range is read from its start,
    with a warning, and ends SUCCESS with every row of it computed."""
    _corrupt(engine, "full", RANGES[1].key, cursor)
    with caplog.at_level(logging.WARNING, logger="batch_assets.sweep"):
        result = _sweep(engine, cipher, CheckpointStore(engine), RANGES[1])
    assert result.status == "SUCCESS" and result.resumed_from is None
    assert result.scanned == _in_range(engine, RANGES[1]) > 0
    assert _in_range(engine, RANGES[1], uncomputed=True) == 0
    assert any("starting the range over" in r.getMessage() for r in caplog.records)
    assert _sweep(engine, cipher, CheckpointStore(engine), RANGES[1]).changed == 0  # every row is right


ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@pytest.mark.parametrize(
    "after",
    ["2025-13-45", "1 June", "20250101", 20250101, None, "2031-01-01"],
    ids=["impossible-date", "text", "compact-date", "number", "null", "after-the-run-date"],
)
def test_a_corrupt_delta_checkpoint_starts_over_without_printing_its_date(
    engine: sa.Engine, cipher: DobCipher, seeded: int, caplog: pytest.LogCaptureFixture, after: Any
) -> None:
    """A delta checkpoint whose first element is not an ISO date on or before the run date (or '-infinity')
    starts the delta over with a warning that shows no date; every due row is computed."""
    _corrupt(engine, "delta", "all", [after, str(uuid.uuid4())])
    with caplog.at_level(logging.WARNING, logger="batch_assets.sweep"):
        result = _sweep(engine, cipher, CheckpointStore(engine), None, mode="delta")
    assert result.status == "SUCCESS" and result.scanned == seeded and _uncomputed(engine) == 0
    warnings = [r.getMessage() for r in caplog.records if "starting the range over" in r.getMessage()]
    assert len(warnings) == 1 and not ISO_DATE.search(warnings[0].replace(str(RUN_DATE), ""))
    assert _sweep(engine, cipher, CheckpointStore(engine), None).changed == 0  # a full sweep finds every row right


def test_a_valid_delta_checkpoint_is_resumed_and_shown_by_id_only(
    engine: sa.Engine, cipher: DobCipher, seeded: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A delta resumed after [next_review_date, id] reports and logs only the id, never the date; its
    summary's last_cursor likewise."""
    assert _sweep(engine, cipher, CheckpointStore(engine), None, mode="delta").status == "SUCCESS"
    later = date(2040, 6, 1)  # many rows are due again by then
    with engine.connect() as conn:
        due = conn.execute(sa.text(
            "SELECT next_review_date, id FROM customers WHERE next_review_date <= :d ORDER BY next_review_date, id"
        ), {"d": later}).all()
        dates = {d.isoformat() for d, in conn.exec_driver_sql(
            "SELECT DISTINCT next_review_date FROM customers WHERE next_review_date IS NOT NULL")}
    assert len(due) > 100
    cursor = [due[49][0].isoformat(), str(due[49][1])]
    dates -= {RUN_DATE.isoformat(), later.isoformat()}  # run dates are printed on purpose
    store = CheckpointStore(engine)
    _corrupt(engine, "delta", "all", cursor, f"{DEFAULT_RULES.fingerprint}:{later}")  # a real, valid position

    class Interrupted(BaseException):
        pass

    def interrupt(snapshot: dict[str, Any]) -> None:
        if snapshot["pages"] == 2:
            raise Interrupted

    with caplog.at_level(logging.INFO, logger="batch_assets.sweep"), pytest.raises(Interrupted):
        _sweep(engine, cipher, store, None, mode="delta", run_date=later, progress=interrupt)
    resumed = _sweep(engine, cipher, store, None, mode="delta", run_date=later)
    assert resumed.status == "SUCCESS" and resumed.resumed_from == {"after_id": resumed.resumed_from["after_id"]}
    assert uuid.UUID(resumed.resumed_from["after_id"])
    text = "\n".join(r.getMessage() for r in caplog.records) + json.dumps(resumed.to_summary())
    assert "low watermark" in text and "resumed_from={'after_id'" in text
    leaked = sorted(d for d in dates if d in text)
    assert not leaked, f"next_review_date values appear in logs or the summary: {leaked[:3]}"
