"""Lease renewals never wait behind page writes, a late renewal never shortens the lease, and a run whose
renewals fall behind stops before its lease lapses (docs/DESIGN.md, "Lease renewal")."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import sqlalchemy as sa
from customer_rows import copy_customers, random_customers
from helpers import REPO, GuardCfg, kill_session, wait_for

from batch_assets.db.engine import create_engine
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import LeaseLost
from batch_assets.locking import Heartbeat, Lease, PostgresJobLock, job_guard
from batch_assets.locking.run_guard import acquire_run_lock
from batch_assets.reference.customer_status.crypto import DobCipher

pytestmark = pytest.mark.integration

JOB = "customer_status"
T = TypeVar("T")

# One range of a run in a process of its own, as a range op runs it: join the run's lock and lease
# (joined_guard), sweep, print the result. argv: database URL, key text, owner, settings (JSON).
RANGE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from datetime import date
    from batch_assets.reference.customer_status.crypto import DobCipher, decode_key
    from batch_assets.db.engine import create_engine
    from batch_assets.reference.customer_status.job import run_customer_status_sweep
    from batch_assets.engine.settings import SweepSettings
    from batch_assets.locking.lock import PostgresJobLock
    from batch_assets.locking.run_guard import joined_guard

    url, key, owner, knobs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    settings = SweepSettings(**knobs)
    engine = create_engine(url, pool_size=settings.pool_size)
    with joined_guard(engine, PostgresJobLock(engine), job_key="customer_status", owner=owner,
                      settings=settings) as guard:
        print("joined", flush=True)
        result = run_customer_status_sweep(engine, DobCipher(decode_key(key)), mode="full",
                                           run_date=date(2025, 6, 1), settings=settings, run_id="range-2",
                                           guard=guard)
    print(json.dumps(result.to_summary()), flush=True)
    """
)


def _expires_in(engine: sa.Engine) -> float:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM ba_leases WHERE name = :n"),
            {"n": JOB},
        ).scalar_one()


def _in_thread(work: Callable[[], T]) -> tuple[threading.Thread, list[T]]:
    """Start `work` in a daemon thread; its result lands in the list once it returned."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    return thread, out


def test_range_joins_and_sweeps_while_another_ranges_page_holds_the_fence(
    engine: sa.Engine, db_url: str, cipher: DobCipher, key_text: str, tmp_path: Path
) -> None:
    """A range process joins the run's lease and sweeps to the end while another range's page transaction holds
    the fence: joining takes no lock a page holds (the old upsert waited for every page of the other ranges)."""
    copy_customers(engine, random_customers(cipher, 300))
    settings = SweepSettings(workers=1, window=1, page_size=100, heartbeat_s=1, lease_ttl_s=30, lock_ttl_s=30)
    owner = f"run-{uuid.uuid4().hex[:8]}@{uuid.uuid4().hex[:6]}:run"
    acquire_run_lock(engine, PostgresJobLock(engine), job_key=JOB, owner=owner, settings=settings)
    out_path, err_path = tmp_path / "range.out", tmp_path / "range.err"
    with engine.connect() as page, out_path.open("w") as out, err_path.open("w") as err:
        tx = page.begin()
        Lease(engine, JOB, owner, settings.lease_ttl_s).fence(page)  # another range's page, in flight
        proc = subprocess.Popen(
            [sys.executable, "-c", RANGE_SCRIPT, db_url, key_text, owner, settings.model_dump_json()],
            stdout=out, stderr=err, cwd=REPO, start_new_session=True,
        )
        try:
            wait_for(lambda: proc.poll() is not None, timeout=90, interval=0.2,
                     what="the range to join and finish while the other range's page is open")
        finally:
            kill_session(proc)
            tx.rollback()
    lines = out_path.read_text().splitlines()
    assert proc.returncode == 0 and lines[0] == "joined", err_path.read_text()[-3000:]
    summary = json.loads(lines[-1])
    assert summary["status"] == "SUCCESS" and summary["changed"] == 300, summary


def test_refused_acquire_of_a_live_lease_does_not_wait_for_its_pages(engine: sa.Engine) -> None:
    """Another run's acquire of a live lease returns False at once while the owner's page fences it: it locks
    nothing, so it can neither wait for the owner's pages nor hold the owner's renewals up behind it."""
    assert Lease(engine, JOB, "A", 30).acquire()
    with engine.connect() as page, page.begin():
        Lease(engine, JOB, "A", 30).fence(page)
        thread, refused = _in_thread(Lease(engine, JOB, "B", 30).acquire)
        thread.join(timeout=30)
        assert refused == [False], "the refused acquire waited for the owner's page transaction"
        renewed = Lease(engine, JOB, "A", 30).heartbeat()
    assert renewed


def test_a_late_renewal_never_shortens_the_lease(engine: sa.Engine) -> None:
    """A renewal or rejoin that computes a nearer expiry (a sibling range renewed meanwhile) leaves the later one."""
    assert Lease(engine, JOB, "A", 600).acquire()
    assert Lease(engine, JOB, "A", 5).heartbeat()
    assert Lease(engine, JOB, "A", 5).acquire()
    assert _expires_in(engine) > 500


def test_a_renewal_that_cannot_get_its_row_is_retried_and_the_run_stops_before_the_lapse(
    engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """While a session holds the lease row FOR UPDATE, each renewal gives up at its lock_timeout and is retried,
    and the run stops being alive once the grace passed, while the lease is still live: its next fence raises
    LeaseLost instead of writing on a lease about to lapse (without a timeout the renewal would wait silently)."""
    cfg = GuardCfg(heartbeat_s=2, lease_ttl_s=14, lock_ttl_s=14)  # grace 10 s, the lease 4 s beyond it
    with caplog.at_level(logging.WARNING, logger="batch_assets.locking.heartbeat"):
        with job_guard(engine, job_key=JOB, run_id="run-1", settings=cfg) as guard:
            with engine.connect() as stuck:
                tx = stuck.begin()
                stuck.execute(sa.text("SELECT 1 FROM ba_leases WHERE name = :n FOR UPDATE"), {"n": JOB})
                try:
                    wait_for(lambda: not guard.alive(), timeout=60, interval=0.1,
                             what="the run to notice its renewals fell behind")
                    left = _expires_in(engine)
                finally:
                    tx.rollback()
            assert left > 0, "the run noticed only after its lease lapsed"
            assert guard.lost_reason is not None
            with pytest.raises(LeaseLost), engine.begin() as conn:
                guard.fence(conn)
    retries = [r.getMessage() for r in caplog.records if "heartbeat failed" in r.getMessage()]
    # Cancelled by its lock_timeout (or, on a starved machine, its statement_timeout), never left waiting.
    assert retries and all("canceling statement due to" in m for m in retries), retries


def test_a_renewal_that_hangs_makes_the_heartbeat_overdue_while_it_waits() -> None:
    """A renewal that does not return at all (a server cut off mid-statement) still makes the heartbeat overdue once
    the grace passed since the last successful round: the run does not wait for the renewal to tell it."""
    release = threading.Event()
    calls: list[int] = []

    def hangs() -> bool:
        calls.append(1)
        release.wait(60)
        return True

    heartbeat = Heartbeat(0.05, [hangs], grace_s=0.5).start()
    try:
        wait_for(lambda: calls and heartbeat.overdue, timeout=30, what="the heartbeat to be overdue")
        assert not heartbeat.lost.is_set() and len(calls) == 1, "the renewal is still in flight"
    finally:
        release.set()
        heartbeat.stop(timeout=30)


def test_connections_end_idle_transactions_and_keep_alive(db_url: str) -> None:
    """The product's connections carry idle_in_transaction_session_timeout, and ask for server-side and libpq TCP
    keepalives (both apply to TCP connections; a Unix socket has none)."""
    engine = create_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            idle = conn.execute(sa.text("SELECT current_setting('idle_in_transaction_session_timeout')")).scalar_one()
            params = conn.connection.driver_connection.info.get_parameters()
    finally:
        engine.dispose()
    assert idle == "2min"
    assert "-c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 -c tcp_keepalives_count=3" in params["options"]
    assert (params["keepalives_idle"], params["keepalives_interval"], params["keepalives_count"]) == ("30", "10", "3")


def test_queue_worker_connections_end_idle_transactions_and_keep_alive(db_url: str) -> None:
    """The queue worker's own psycopg connections (claim/flush, LISTEN, the rate-limit side connection) carry the same
    idle-in-transaction timeout and keepalives as the pooled ones, the claim connection its WORKER_OPTIONS on top, and
    `options` given in the database URL are kept. (They used to pass `options=WORKER_OPTIONS` beside a bare conninfo,
    which dropped the URL's options and every one of these settings: a worker whose host vanished held its claim
    transaction's locks until the kernel's two-hour keepalive.)"""
    import asyncio

    from batch_assets.queue.connection import Link
    from batch_assets.queue.result import QueueResult
    from batch_assets.queue.settings import QueueSettings
    from batch_assets.queue.side import SideConnection

    url = sa.make_url(db_url).update_query_dict({"options": "-c work_mem=7777kB"})
    engine = create_engine(url.render_as_string(hide_password=False), pool_size=1)
    settings_sql = ("SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('work_mem'), "
                    "current_setting('synchronous_commit')")

    async def observe() -> list[tuple]:
        link = Link(engine, QueueSettings(), threading.Event(), QueueResult(), label="test")
        claims, listener = await link.connect(), await link.listener()
        side = SideConnection(link.conninfo)
        try:
            seen = []
            for conn in (claims, listener):
                row = await (await conn.execute(settings_sql)).fetchone()
                seen.append((*row, conn.info.get_parameters()))
            [row] = await side.fetch_once(settings_sql)
            seen.append((*row, (await side._connection()).info.get_parameters()))
            return seen
        finally:
            await claims.close()
            await listener.close()
            await side.aclose()

    try:
        claims, listener, side = asyncio.run(observe())
    finally:
        engine.dispose()
    for idle, work_mem, _commit, params in (claims, listener, side):
        assert (idle, work_mem) == ("2min", "7777kB")
        assert "-c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 -c tcp_keepalives_count=3" in params["options"]
        keepalives = (params["keepalives_idle"], params["keepalives_interval"], params["keepalives_count"])
        assert keepalives == ("30", "10", "3")
    assert claims[2] == "off"  # WORKER_OPTIONS, on the claim/flush connection only
    assert listener[2] == side[2] == "on"
