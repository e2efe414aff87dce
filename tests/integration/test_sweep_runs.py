"""Whole customer-status runs: breaker, configuration errors, idempotence, config-change, resume, stop, lease."""

from __future__ import annotations

import os
import threading
import uuid
from datetime import date
from typing import Any

import pytest
import sqlalchemy as sa
from customer_rows import captured_statements, copy_customers, count, customer, random_customers, writes

from batch_assets.db.timeouts import SET_LOCAL_TIMEOUTS
from batch_assets.engine.definition import CursorRange
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import ConfigError, LeaseLost
from batch_assets.locking.checkpoint import CheckpointStore
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.job import run_customer_status_sweep
from batch_assets.reference.customer_status.rules import DEFAULT_RULES, Rules
from batch_assets.reference.customer_status.rules_store import current_rules, previous_rules, set_rules

pytestmark = pytest.mark.integration

RUN_DATE = date(2025, 6, 1)
FINGERPRINT = f"{DEFAULT_RULES.fingerprint}:{RUN_DATE}"


def _sweep(engine: sa.Engine, cipher: DobCipher, mode: str = "full", **kwargs: Any):
    settings = kwargs.pop("settings", {"workers": 2, "window": 2, "page_size": 50})
    return run_customer_status_sweep(engine, cipher, mode=mode, run_date=RUN_DATE, settings=settings,
                                     run_id="run-1", **kwargs)


def _snapshot(engine: sa.Engine) -> list[tuple]:
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT id, age_category, next_review_date, updated_at FROM customers ORDER BY id").all()


def _sorted_ids(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return [str(r[0]) for r in conn.exec_driver_sql("SELECT id FROM customers ORDER BY id")]


def test_wrong_key_trips_the_breaker_with_nothing_written(engine: sa.Engine, cipher: DobCipher) -> None:
    """Every row failing to decrypt is systemic: the run stops as FAILURE early, writes nothing, keeps no cursor."""
    copy_customers(engine, random_customers(cipher, 1000))
    before = _snapshot(engine)
    store = CheckpointStore(engine)
    wrong = DobCipher(os.urandom(32))
    result = _sweep(engine, wrong, checkpoints=store)
    assert result.status == "FAILURE"
    assert result.stopped_reason and result.stopped_reason.startswith("circuit breaker")
    assert result.scanned < 1000 and result.failed_by_type["decrypt_failure"] == result.scanned
    assert (result.changed, result.audit_events) == (0, 0)
    assert _snapshot(engine) == before and count(engine, "outbox_events") == 0
    assert store.load("customer_status", "full", "all", FINGERPRINT) is None


def test_data_failures_never_trip_the_breaker(engine: sa.Engine, cipher: DobCipher) -> None:
    """A page made entirely of missing or malformed data is counted, and the run still succeeds."""
    copy_customers(engine, [customer(cipher, None) for _ in range(150)]
                   + [customer(cipher, "19900101xx") for _ in range(150)])
    result = _sweep(engine, cipher)
    assert result.status == "SUCCESS"
    assert result.failed_by_type["missing_data"] == 150 and result.failed_by_type["invalid_value"] == 150


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"settings": {"page_size": 1001}}, "page_size"),
        ({"settings": {"workers": 20, "pool_size": 10}}, "pool_size"),
        ({"settings": {"page_timeout_s": -3}}, "page_timeout_s"),
        ({"mode": "weekly"}, "mode"),
        ({"cursor_range": CursorRange.parse("00000000-0000-0000-0000-000000000000",
                                            "7fffffff-ffff-ffff-ffff-ffffffffffff"), "mode": "delta"},
         "cursor_range"),
    ],
)
def test_bad_configuration_is_config_error_before_any_statement(
    engine: sa.Engine, cipher: DobCipher, kwargs: dict, field: str
) -> None:
    """Invalid settings, mode or range raise ConfigError naming the field, before any read or write."""
    copy_customers(engine, [customer(cipher, "1990-01-01")])
    with captured_statements(engine) as statements, pytest.raises(ConfigError) as info:
        _sweep(engine, cipher, **kwargs)
    assert info.value.field == field
    assert statements == []


def test_second_run_writes_nothing(engine: sa.Engine, cipher: DobCipher) -> None:
    """Re-running a finished sweep is a no-op: no writes, no triggers, no events."""
    copy_customers(engine, random_customers(cipher, 400))
    first = _sweep(engine, cipher, settings={"workers": 3, "window": 3, "page_size": 37})
    assert (first.status, first.scanned, first.changed, first.audit_events) == ("SUCCESS", 400, 400, 400)
    before = _snapshot(engine)
    with captured_statements(engine) as statements:
        second = _sweep(engine, cipher, settings={"workers": 3, "window": 3, "page_size": 37})
    assert (second.scanned, second.changed, second.unchanged, second.audit_events) == (400, 0, 400, 0)
    assert writes(statements) == []
    assert _snapshot(engine) == before and count(engine, "outbox_events") == 400
    delta = _sweep(engine, cipher, mode="delta")
    assert (delta.scanned, delta.changed) == (0, 0)


def test_config_change_decrypts_fewer_rows_and_matches_a_full_sweep(engine: sa.Engine, cipher: DobCipher) -> None:
    """After a threshold change, config-change decrypts only rows it may affect, and leaves nothing for full to fix."""
    copy_customers(engine, random_customers(cipher, 600))
    assert _sweep(engine, cipher).changed == 600
    assert set_rules(engine, Rules.parse("MINOR=0,YOUNG_ADULT=21,ADULT=26,SENIOR=65")) == 1
    assert set_rules(engine, Rules.parse("MINOR=0,YOUNG_ADULT=21,ADULT=26,SENIOR=65")) == 1  # same fingerprint
    with engine.connect() as conn:
        assert current_rules(conn)[1].rules[1].min_age == 21
        assert previous_rules(conn) == DEFAULT_RULES
    change = _sweep(engine, cipher, mode="config-change")
    assert change.status == "SUCCESS" and change.scanned == 600
    assert 0 < change.decrypted < 600 // 3
    assert change.changed > 0 and change.triggers > 0
    check = _sweep(engine, cipher, mode="full")
    assert (check.decrypted, check.changed) == (600, 0)


def test_two_rule_changes_without_a_sweep_evaluate_every_row(engine: sa.Engine, cipher: DobCipher) -> None:
    """After A -> B -> C with no sweep between, rows may still carry A's dates: config-change evaluates them all."""
    copy_customers(engine, random_customers(cipher, 600))
    assert _sweep(engine, cipher).changed == 600  # settled under the defaults (A)
    set_rules(engine, Rules.parse("MINOR=0,YOUNG_ADULT=18,ADULT=30,SENIOR=65"))  # B: only ADULT's start moves
    set_rules(engine, Rules.parse("MINOR=0,YOUNG_ADULT=21,ADULT=30,SENIOR=65"))  # C
    change = _sweep(engine, cipher, mode="config-change")
    assert change.status == "SUCCESS" and change.decrypted == 600
    check = _sweep(engine, cipher, mode="full")
    assert check.changed == 0  # config-change already left every row right under C


def test_resume_from_a_checkpoint(engine: sa.Engine, cipher: DobCipher) -> None:
    """A saved low watermark is resumed: rows at or before it are not read again, the rest are finished."""
    copy_customers(engine, random_customers(cipher, 300))
    ids = _sorted_ids(engine)
    store = CheckpointStore(engine)
    store.save("customer_status", "full", "all", cursor=ids[99], fingerprint=FINGERPRINT, run_id="earlier",
               run_date=RUN_DATE, counters={})
    result = _sweep(engine, cipher, checkpoints=store)
    assert (result.status, result.resumed_from, result.scanned, result.changed) == ("SUCCESS", ids[99], 200, 200)
    with engine.connect() as conn:
        pending = conn.exec_driver_sql("SELECT count(*) FROM customers WHERE age_category IS NULL").scalar_one()
    assert pending == 100
    assert store.load("customer_status", "full", "all", FINGERPRINT) is None  # completed


class RecordingStore:
    """An in-memory checkpoint store recording every saved cursor."""

    def __init__(self) -> None:
        self.saved: list[Any] = []
        self.completed = False

    def load(self, sweep: str, mode: str, range_key: str, fingerprint: str | None) -> None:
        return None

    def save(self, sweep: str, mode: str, range_key: str, **kwargs: Any) -> None:
        self.saved.append(kwargs["cursor"])

    def complete(self, sweep: str, mode: str, range_key: str) -> None:
        self.completed = True


def test_low_watermark_advances_in_key_order_with_many_workers(engine: sa.Engine, cipher: DobCipher) -> None:
    """With several workers only the front page's cursor is saved: strictly increasing, ending at the last id."""
    copy_customers(engine, random_customers(cipher, 500))
    store = RecordingStore()
    result = _sweep(engine, cipher, checkpoints=store,
                    settings={"workers": 4, "window": 4, "page_size": 20, "checkpoint_every_s": 1e-9})
    assert result.status == "SUCCESS" and result.pages == 25 and store.completed
    assert store.saved == sorted(store.saved) and len(store.saved) == 25
    assert store.saved[-1] == _sorted_ids(engine)[-1] == result.last_cursor


def test_stop_event_drains_and_leaves_a_resumable_checkpoint(engine: sa.Engine, cipher: DobCipher) -> None:
    """A stop stops taking pages, finishes those in flight, checkpoints, and a second run completes the rest."""
    copy_customers(engine, random_customers(cipher, 600))
    store = CheckpointStore(engine)
    stop = threading.Event()

    def progress(counters: dict[str, Any]) -> None:
        if counters["pages"] >= 2:
            stop.set()

    first = _sweep(engine, cipher, checkpoints=store, stop=stop, progress=progress)
    assert first.status == "FAILURE" and first.stopped_reason == "stop requested"
    assert 2 <= first.pages < 12 and first.changed == first.scanned
    checkpoint = store.load("customer_status", "full", "all", FINGERPRINT)
    assert checkpoint is not None and checkpoint.cursor == first.last_cursor
    second = _sweep(engine, cipher, checkpoints=store)
    assert second.status == "SUCCESS" and second.resumed_from == first.last_cursor
    assert first.changed + second.changed == 600
    assert count(engine, "outbox_events") == 600


class FakeGuard:
    """A guard whose lease is lost after `beats` fences."""

    owner = "run-1@test:1"

    def __init__(self, beats: int) -> None:
        self.beats = beats
        self.fenced = 0

    def fence(self, conn: sa.Connection, timeouts: dict[str, str] | None = None) -> None:
        if timeouts is not None:
            conn.execute(SET_LOCAL_TIMEOUTS, timeouts)
        self.fenced += 1
        if self.fenced > self.beats:
            raise LeaseLost("lease taken over")

    def alive(self) -> bool:
        return self.fenced < self.beats


def test_lost_lease_stops_the_run(engine: sa.Engine, cipher: DobCipher) -> None:
    """Once the lease is lost no further page is written and the run fails with 'lease lost'."""
    copy_customers(engine, random_customers(cipher, 500))
    guard = FakeGuard(beats=2)
    result = _sweep(engine, cipher, guard=guard, settings={"workers": 1, "window": 1, "page_size": 50})
    assert result.status == "FAILURE" and result.stopped_reason == "lease lost"
    assert result.changed == 100 and count(engine, "outbox_events") == 100


def test_cursor_ranges_partition_the_key_space(engine: sa.Engine, cipher: DobCipher) -> None:
    """Two full runs over [0…, 7f…] and [80…, f…] together cover every row exactly once."""
    copy_customers(engine, random_customers(cipher, 300))
    low = CursorRange.parse("00000000-0000-0000-0000-000000000000", "7fffffff-ffff-ffff-ffff-ffffffffffff")
    high = CursorRange.parse("80000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff")
    a = _sweep(engine, cipher, cursor_range=low)
    b = _sweep(engine, cipher, cursor_range=high)
    assert a.scanned + b.scanned == 300 and a.scanned > 0 and b.scanned > 0
    assert count(engine, "outbox_events") == 300


def test_summary_has_the_contract_keys(engine: sa.Engine, cipher: DobCipher) -> None:
    """to_summary() carries every the command line (docs/reference/cli.md) key for a sweep."""
    copy_customers(engine, random_customers(cipher, 10))
    summary = _sweep(engine, cipher, settings=SweepSettings(workers=1)).to_summary()
    for key in ("status", "run_id", "scanned", "changed", "unchanged", "failed", "failed_by_type", "duration_s",
                "mode", "run_date", "pages", "decrypted", "triggers", "audit_events", "resumed_from"):
        assert key in summary
    assert summary["status"] == "SUCCESS" and summary["run_date"] == "2025-06-01" and summary["changed"] == 10


def test_known_bad_rows_do_not_trip_the_breaker_on_later_runs(engine: sa.Engine, cipher: DobCipher) -> None:
    """Rows that failed decrypt in a healthy run are known bad: the delta over just them succeeds, writing nothing."""
    good = list(random_customers(cipher, 600))
    bad = [(uuid.uuid4(), "ACTIVE", cipher.encrypt_text(uuid.uuid4(), "1990-01-01"), None, None) for _ in range(30)]
    copy_customers(engine, good + bad)
    settings = {"workers": 1, "window": 1, "page_size": 1000, "breaker_min_rows": 10}
    first = _sweep(engine, cipher, "full", settings=settings)
    assert first.status == "SUCCESS" and first.failed_by_type["decrypt_failure"] == 30
    with engine.connect() as conn:
        marked = conn.exec_driver_sql(
            "SELECT count(*) FROM customers WHERE review_failure = 'decrypt_failure' AND next_review_date IS NULL"
        ).scalar_one()
    assert marked == 30
    before = _snapshot(engine)
    delta = _sweep(engine, cipher, "delta", settings=settings)
    assert delta.status == "SUCCESS", delta.stopped_reason
    assert (delta.scanned, delta.failed, delta.changed) == (30, 30, 0)
    assert _snapshot(engine) == before
    wrong = DobCipher(os.urandom(32))
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE customers SET next_review_date = NULL")
    tripped = _sweep(engine, wrong, "delta", settings=settings)
    assert tripped.status == "FAILURE" and "circuit breaker" in tripped.stopped_reason


def test_adaptive_page_size_shrinks_slow_pages_within_the_bound(engine: sa.Engine, cipher: DobCipher) -> None:
    """With adaptive pages on, pages slower than a quarter of the page timeout halve, never above page_size."""
    copy_customers(engine, random_customers(cipher, 1_500))
    first = _sweep(engine, cipher, settings={"workers": 1, "window": 1, "page_size": 400})
    assert first.status == "SUCCESS" and first.pages == 4
    sizes: list[int] = []
    with captured_statements(engine) as statements:
        # Steady state: pages only read (no write transaction, so the tiny timeout never fires), and
        # every page takes longer than page_timeout_s / 4, so the page size halves down to its floor.
        steady = _sweep(engine, cipher, settings={"workers": 1, "window": 1, "page_size": 400,
                                                  "page_timeout_s": 0.001, "row_timeout_s": 0.001,
                                                  "adaptive_page_size": True})
    sizes = [p["limit"] for s, p in statements if "FROM customers" in s and isinstance(p, dict) and "limit" in p]
    assert steady.status == "SUCCESS" and steady.scanned == 1_500 and steady.changed == 0
    assert sizes[0] == 400 and max(sizes) <= 400 and min(sizes) == 50
    assert steady.pages > first.pages


def test_checkpoints_are_throttled_but_a_stop_saves_the_exact_low_watermark(
    engine: sa.Engine, cipher: DobCipher
) -> None:
    """Saves happen at most once per checkpoint_every_s; a stopped run still records its last drained page."""
    copy_customers(engine, random_customers(cipher, 500))
    store = RecordingStore()
    stop = threading.Event()

    def stop_after_ten(snapshot: dict[str, Any]) -> None:
        if snapshot["pages"] == 10:
            stop.set()

    result = _sweep(engine, cipher, checkpoints=store, stop=stop, progress=stop_after_ten,
                    settings={"workers": 1, "window": 1, "page_size": 20, "checkpoint_every_s": 3600})
    assert result.status == "FAILURE" and result.stopped_reason == "stop requested" and not store.completed
    assert len(store.saved) == 2  # the first drained page, then the exact low watermark at the stop
    assert store.saved[-1] == result.last_cursor == _sorted_ids(engine)[result.pages * 20 - 1]


class Interrupted(BaseException):
    """Stands for Dagster's DagsterExecutionInterruptedError (a BaseException, not an Exception)."""


def test_interrupt_drains_in_flight_pages_and_records_the_low_watermark(engine: sa.Engine, cipher: DobCipher) -> None:
    """A BaseException in the middle of a run drains the window, saves the exact low watermark, then propagates."""
    copy_customers(engine, random_customers(cipher, 600))
    store = RecordingStore()

    def interrupt_after_five(snapshot: dict[str, Any]) -> None:
        if snapshot["pages"] == 5:
            raise Interrupted

    with pytest.raises(Interrupted):
        _sweep(engine, cipher, checkpoints=store, progress=interrupt_after_five,
               settings={"workers": 2, "window": 3, "page_size": 20, "checkpoint_every_s": 3600})
    assert not store.completed
    with engine.connect() as conn:
        done = conn.exec_driver_sql("SELECT count(*) FROM customers WHERE next_review_date IS NOT NULL").scalar_one()
    ids = _sorted_ids(engine)
    # Every row up to the recorded low watermark is written; pages in flight were drained, not abandoned.
    assert store.saved[-1] == ids[done - 1]
    assert done >= 5 * 20 and done % 20 == 0
