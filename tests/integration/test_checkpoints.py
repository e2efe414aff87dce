"""CheckpointStore: resumable only for the same sweep, mode, range and rules fingerprint."""

from __future__ import annotations

import logging
from datetime import date

import pytest
import sqlalchemy as sa

from batch_assets.locking import CheckpointStore

pytestmark = pytest.mark.integration

LOGGER = "batch_assets.locking.checkpoint"
CURSOR = ["2031-04-01", "7f1c2a3e-0000-4000-8000-000000000001"]


@pytest.fixture
def store(engine: sa.Engine) -> CheckpointStore:
    return CheckpointStore(engine)


def _save(store: CheckpointStore, mode: str = "delta", range_key: str = "all", **kw: object) -> None:
    args: dict[str, object] = {
        "cursor": CURSOR,
        "fingerprint": "fp-1",
        "run_id": "run-1",
        "run_date": date(2031, 4, 1),
        "counters": {"scanned": 2000, "changed": 17, "failed_by_type": {"missing_data": 1}},
    }
    args.update(kw)
    store.save("customer_status", mode, range_key, **args)  # type: ignore[arg-type]


def test_save_load_roundtrip(store: CheckpointStore) -> None:
    """A saved checkpoint loads back with its cursor, fingerprint, run, run date and counters."""
    assert store.load("customer_status", "delta", "all", "fp-1") is None
    _save(store)
    cp = store.load("customer_status", "delta", "all", "fp-1")
    assert cp is not None
    assert (cp.sweep, cp.mode, cp.range_key) == ("customer_status", "delta", "all")
    assert cp.cursor == CURSOR
    assert cp.fingerprint == "fp-1"
    assert cp.run_id == "run-1"
    assert cp.run_date == date(2031, 4, 1)
    assert cp.counters == {"scanned": 2000, "changed": 17, "failed_by_type": {"missing_data": 1}}
    assert cp.status == "RUNNING"
    assert cp.updated_at.tzinfo is not None


def test_save_overwrites_previous_cursor(store: CheckpointStore) -> None:
    """A later save of the same sweep, mode and range replaces the cursor (upsert)."""
    _save(store, cursor="00000000-0000-0000-0000-000000000010", run_date="2031-04-01")
    _save(store, cursor="00000000-0000-0000-0000-000000000020", counters={"scanned": 4000})
    cp = store.load("customer_status", "delta", "all", "fp-1")
    assert cp is not None
    assert cp.cursor == "00000000-0000-0000-0000-000000000020"
    assert cp.counters == {"scanned": 4000}
    assert len(store.list("customer_status")) == 1


def test_fingerprint_mismatch_starts_over(store: CheckpointStore, caplog: pytest.LogCaptureFixture) -> None:
    """A checkpoint saved under other rules is not resumed, and a warning names its fingerprint."""
    _save(store, mode="config-change", fingerprint="fp-old")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.load("customer_status", "config-change", "all", "fp-new") is None
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("belongs to fingerprint fp-old" in m and "starting over" in m for m in messages)


def test_mode_mismatch_starts_over(store: CheckpointStore, caplog: pytest.LogCaptureFixture) -> None:
    """A checkpoint of another mode is not resumed, and a warning names its mode."""
    _save(store, mode="full")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.load("customer_status", "delta", "all", "fp-1") is None
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("belongs to mode full" in m and "starting over" in m for m in messages)
    assert store.load("customer_status", "full", "all", "fp-1") is not None, "the full run can still resume"


def test_other_sweep_or_range_is_not_loaded(store: CheckpointStore) -> None:
    """Checkpoints are per sweep and per range."""
    _save(store, mode="full", range_key="00-7f")
    assert store.load("customer_status", "full", "80-ff", "fp-1") is None
    assert store.load("subscription_expiry", "full", "00-7f", "fp-1") is None
    assert store.load("customer_status", "full", "00-7f", "fp-1") is not None


def test_complete_means_next_run_starts_fresh(store: CheckpointStore) -> None:
    """After complete() load returns None; the row stays visible as DONE until the next save."""
    _save(store)
    store.complete("customer_status", "delta", "all")
    assert store.load("customer_status", "delta", "all", "fp-1") is None
    [cp] = store.list("customer_status")
    assert cp.status == "DONE"
    _save(store, cursor=None, run_id="run-2")
    again = store.load("customer_status", "delta", "all", "fp-1")
    assert again is not None
    assert (again.status, again.run_id, again.cursor) == ("RUNNING", "run-2", None)


def test_list_orders_by_mode_and_range(store: CheckpointStore) -> None:
    """list() returns every checkpoint of the sweep, by mode then range."""
    _save(store, mode="full", range_key="80-ff")
    _save(store, mode="full", range_key="00-7f")
    _save(store, mode="delta")
    store.save("other", "delta", "all", cursor=1, fingerprint=None, run_id=None, run_date=None, counters={})
    assert [(c.mode, c.range_key) for c in store.list("customer_status")] == [
        ("delta", "all"),
        ("full", "00-7f"),
        ("full", "80-ff"),
    ]
    [other] = store.list("other")
    assert (other.cursor, other.fingerprint, other.run_date) == (1, None, None)
