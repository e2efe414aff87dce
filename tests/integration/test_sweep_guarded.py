"""The sweep under a real job guard: fenced writes, one-statement preambles, a stolen lease."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
import sqlalchemy as sa
from customer_rows import captured_statements, copy_customers, count, random_customers, writes

from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import LockNotAcquired
from batch_assets.locking.guard import job_guard, steal_lease
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.job import run_customer_status_sweep

pytestmark = pytest.mark.integration

RUN_DATE = date(2025, 6, 1)
SETTINGS = SweepSettings(workers=1, window=1, page_size=50, heartbeat_s=1, lease_ttl_s=30, lock_ttl_s=30)


def _due(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM customers WHERE next_review_date IS NULL").scalar_one()


def test_guarded_page_fences_in_the_timeouts_statement(engine: sa.Engine, cipher: DobCipher) -> None:
    """A guarded first-computation page costs one read, one preamble (timeouts + fence) and one write."""
    copy_customers(engine, random_customers(cipher, 40))  # one short page: no second read
    with job_guard(engine, job_key="customer_status", run_id="r1", settings=SETTINGS) as guard:
        with captured_statements(engine) as statements:
            result = run_customer_status_sweep(engine, cipher, mode="full", run_date=RUN_DATE, settings=SETTINGS,
                                               run_id="r1", guard=guard)
    assert result.status == "SUCCESS" and result.changed == 40 and result.pages == 1
    bookkeeping = ("ba_job_locks", "UPDATE ba_leases", "ba_rules", "ba_checkpoints")
    page = [s for s, _ in statements if not any(b in s for b in bookkeeping)]
    preambles = [s for s in page if "set_config('statement_timeout'" in s]
    assert len(preambles) == 1 and "FOR KEY SHARE" in preambles[0]
    assert [s for s in writes(statements) if "set_config" not in s] == [page[-1]]
    assert len(page) == 3, page


def test_stolen_lease_commits_nothing_more(engine: sa.Engine, cipher: DobCipher) -> None:
    """Once another owner takes the lease mid-run, the old run stops and no further page commits."""
    copy_customers(engine, random_customers(cipher, 1_000))
    seen: dict[str, Any] = {}

    def steal_after_two_pages(snapshot: dict[str, Any]) -> None:
        if snapshot["pages"] == 2 and "stolen_at" not in seen:
            steal_lease(engine, "customer_status", "thief@elsewhere:1", 60)
            seen["stolen_at"] = _due(engine)
            seen["outbox"] = count(engine, "outbox_events")

    with job_guard(engine, job_key="customer_status", run_id="r2", settings=SETTINGS) as guard:
        result = run_customer_status_sweep(engine, cipher, mode="full", run_date=RUN_DATE, settings=SETTINGS,
                                           run_id="r2", guard=guard, progress=steal_after_two_pages)
    assert result.status == "FAILURE" and result.stopped_reason == "lease lost"
    assert _due(engine) == seen["stolen_at"] > 0
    assert count(engine, "outbox_events") == seen["outbox"]
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT owner FROM ba_leases").scalar_one() == "thief@elsewhere:1"


def test_second_guard_is_refused_before_reading(engine: sa.Engine, cipher: DobCipher) -> None:
    """While one run holds the job lock, a second run of any mode is refused before reading a row."""
    copy_customers(engine, random_customers(cipher, 10))
    with job_guard(engine, job_key="customer_status", run_id="first", settings=SETTINGS):
        with captured_statements(engine) as statements, pytest.raises(LockNotAcquired):
            with job_guard(engine, job_key="customer_status", run_id="second", settings=SETTINGS):
                pytest.fail("the second guard must not be entered")
    assert not any("FROM customers" in s for s, _ in statements)
