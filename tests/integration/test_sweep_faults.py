"""Sweeps whose database connections die, refuse to come back, or time out in the middle of a run.

The promise under test: a run never ends SUCCESS with rows in scope left uncomputed, and the low
watermark never passes a page whose write failed for a transient reason (connection, server, timeout).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import date
from typing import Any

import pytest
import sqlalchemy as sa
from customer_rows import copy_customers, random_customers
from sqlalchemy.engine import make_url

from batch_assets.locking.checkpoint import CheckpointStore
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.job import run_customer_status_sweep
from batch_assets.reference.customer_status.rules import DEFAULT_RULES

pytestmark = pytest.mark.integration

RUN_DATE = date(2025, 6, 1)
FINGERPRINT = f"{DEFAULT_RULES.fingerprint}:{RUN_DATE}"
ROWS = 3000

# :db. Every other session of the test database (the sweep's reader, workers, heartbeat).
TERMINATE_SQL = sa.text(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()"
)


def _sweep(engine: sa.Engine, cipher: DobCipher, **kwargs: Any):
    settings = {"workers": 2, "window": 2, "page_size": 50, "retry_backoff_s": 0.05, **kwargs.pop("settings", {})}
    return run_customer_status_sweep(engine, cipher, mode="full", run_date=RUN_DATE, settings=settings,
                                     run_id=f"run-{uuid.uuid4().hex[:8]}", **kwargs)


def _uncomputed(engine: sa.Engine) -> list[uuid.UUID]:
    with engine.connect() as conn:
        return list(conn.exec_driver_sql(
            "SELECT id FROM customers WHERE status = 'ACTIVE' AND (age_category IS NULL OR next_review_date IS NULL)"
            " ORDER BY id").scalars())


def _db_name(engine: sa.Engine) -> str:
    return str(make_url(engine.url).database)


@pytest.fixture
def admin(admin_engine: sa.Engine) -> sa.Engine:
    return admin_engine


@pytest.fixture
def seeded(engine: sa.Engine, cipher: DobCipher) -> sa.Engine:
    copy_customers(engine, random_customers(cipher, ROWS))
    return engine


def test_connections_killed_mid_sweep_the_run_retries_and_computes_every_row(
    seeded: sa.Engine, cipher: DobCipher, admin: sa.Engine
) -> None:
    """pg_terminate_backend of every connection after a few pages: the run reconnects and ends SUCCESS complete."""
    killed: list[int] = []

    def kill_after_five_pages(snapshot: dict[str, Any]) -> None:
        if snapshot["pages"] == 5 and not killed:
            with admin.connect() as conn:
                killed.append(conn.execute(TERMINATE_SQL, {"db": _db_name(seeded)}).scalar_one())

    result = _sweep(seeded, cipher, checkpoints=CheckpointStore(seeded), progress=kill_after_five_pages)
    assert killed and killed[0] >= 1, "the fault was not injected"
    assert result.status == "SUCCESS", result.stopped_reason
    assert result.scanned == ROWS and result.changed == ROWS and result.failed == 0
    assert _uncomputed(seeded) == []


@pytest.fixture
def refusing(seeded: sa.Engine, admin: sa.Engine) -> Iterator[tuple[sa.Engine, threading.Event]]:
    """Set the event to make the test database refuse every new connection and drop the open ones."""
    refuse = threading.Event()
    db = _db_name(seeded)
    try:
        yield seeded, refuse
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')


def _refuse_now(admin: sa.Engine, db: str) -> None:
    with admin.connect() as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
        conn.execute(TERMINATE_SQL, {"db": db})


def test_database_gone_for_good_ends_failure_with_the_watermark_below_every_unwritten_row(
    refusing: tuple[sa.Engine, threading.Event], cipher: DobCipher, admin: sa.Engine
) -> None:
    """A database that stays away outlasts the retries: FAILURE, resumable, and a resume computes every row."""
    engine, _ = refusing
    db = _db_name(engine)
    store = CheckpointStore(engine)
    injected: list[bool] = []

    def refuse_after_eight_pages(snapshot: dict[str, Any]) -> None:
        if snapshot["pages"] == 8 and not injected:
            _refuse_now(admin, db)
            injected.append(True)

    first = _sweep(engine, cipher, checkpoints=store, progress=refuse_after_eight_pages,
                   settings={"transient_retries": 2, "checkpoint_every_s": 1e-9})
    assert injected, "the fault was not injected"
    assert first.status == "FAILURE"
    assert first.stopped_reason and "not done" in first.stopped_reason or "read failed" in first.stopped_reason
    with admin.connect() as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
    engine.dispose()
    missing = _uncomputed(engine)
    assert missing, "the fault left nothing to do: not a test of the watermark"
    checkpoint = store.load("customer_status", "full", "all", FINGERPRINT)
    if checkpoint is not None:
        # The low watermark: every row at or before it is computed.
        assert uuid.UUID(str(checkpoint.cursor)) < missing[0]
    second = _sweep(engine, cipher, checkpoints=store)
    assert second.status == "SUCCESS", second.stopped_reason
    assert _uncomputed(engine) == []


def test_a_row_locked_past_the_lock_timeout_stops_the_run_before_its_page(
    seeded: sa.Engine, cipher: DobCipher
) -> None:
    """A lock timeout is transient, not the row's fault: the page is not done, the run ends FAILURE resumable."""
    with seeded.connect() as conn:
        ids = list(conn.exec_driver_sql("SELECT id FROM customers ORDER BY id").scalars())
    locked_id = ids[len(ids) // 2]
    store = CheckpointStore(seeded)
    blocker = seeded.connect()
    try:
        blocker.begin()
        blocker.exec_driver_sql("SELECT 1 FROM customers WHERE id = %(id)s FOR UPDATE", {"id": locked_id})
        first = _sweep(seeded, cipher, checkpoints=store,
                       settings={"lock_timeout_s": 0.2, "row_timeout_s": 1, "transient_retries": 1,
                                 "checkpoint_every_s": 1e-9})
    finally:
        blocker.rollback()
        blocker.close()
    assert first.status == "FAILURE", "a row whose write timed out was counted done"
    assert "lock timeout" in (first.stopped_reason or "").lower() or "LockNotAvailable" in (first.stopped_reason or "")
    assert locked_id in _uncomputed(seeded)
    checkpoint = store.load("customer_status", "full", "all", FINGERPRINT)
    assert checkpoint is None or uuid.UUID(str(checkpoint.cursor)) < locked_id
    second = _sweep(seeded, cipher, checkpoints=store)
    assert second.status == "SUCCESS" and second.resumed_from == (checkpoint.cursor if checkpoint else None)
    assert _uncomputed(seeded) == []
