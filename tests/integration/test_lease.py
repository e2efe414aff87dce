"""The durable lease (owner fencing, database time) and the heartbeat thread."""

from __future__ import annotations

import os
import re
import socket
import threading
import time

import pytest
import sqlalchemy as sa
from helpers import wait_for

from batch_assets.errors import LeaseLost
from batch_assets.locking import Heartbeat, Lease, lease_owner, make_owner, steal_lease

pytestmark = pytest.mark.integration


def _expires_in(engine: sa.Engine, name: str) -> float:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT extract(epoch FROM expires_at - now()) FROM ba_leases WHERE name = :n"), {"n": name}
        ).scalar_one()


def _blocked_on_lock(engine: sa.Engine) -> int:
    """How many other sessions of this database wait on a lock right now."""
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
        ).scalar_one()


def test_make_owner_names_run_host_pid_start_and_namespace() -> None:
    """The owner string is <run_id>@<host>:<pid>:s<start>:n<pid namespace>."""
    assert make_owner("abc-123").startswith(f"abc-123@{socket.gethostname()}:{os.getpid()}:s")
    assert re.fullmatch(r"r@[^:]+:\d+:s\d+:n\d+", make_owner("r"))


def test_acquire_is_exclusive_and_reentrant(engine: sa.Engine) -> None:
    """A live lease refuses another owner, and its own owner may acquire it again."""
    a = Lease(engine, "job", "A", 30)
    b = Lease(engine, "job", "B", 30)
    assert a.acquire()
    assert not b.acquire()
    assert a.acquire()
    assert lease_owner(engine, "job") == "A"


def test_heartbeat_renews_for_owner(engine: sa.Engine) -> None:
    """heartbeat() is True for the owner and pushes expires_at to now + ttl (database clock)."""
    a = Lease(engine, "job", "A", 2)
    assert a.acquire()
    assert _expires_in(engine, "job") <= 2
    a.ttl_s = 60
    assert a.heartbeat()
    assert _expires_in(engine, "job") > 50
    assert not Lease(engine, "job", "B", 60).heartbeat(), "another owner cannot renew it"


def test_heartbeat_false_after_steal_after_expiry(engine: sa.Engine) -> None:
    """Once the lease expired and another owner took it, the old owner's heartbeat and release are False."""
    a = Lease(engine, "job", "A", 1)
    b = Lease(engine, "job", "B", 30)
    assert a.acquire()
    wait_for(b.acquire, what="expired lease to be taken over")
    assert not a.heartbeat()
    assert not a.release()
    assert lease_owner(engine, "job") == "B"


def test_heartbeat_false_after_expiry_even_without_steal(engine: sa.Engine) -> None:
    """An expired lease is lost: the heartbeat does not revive it."""
    a = Lease(engine, "job", "A", 1)
    assert a.acquire()
    wait_for(lambda: lease_owner(engine, "job") is None, what="lease to expire")
    assert not a.heartbeat()


def test_release_is_owner_filtered(engine: sa.Engine) -> None:
    """Only the owner's release deletes the lease."""
    a = Lease(engine, "job", "A", 30)
    assert a.acquire()
    assert not Lease(engine, "job", "B", 30).release()
    assert lease_owner(engine, "job") == "A"
    assert a.release()
    assert lease_owner(engine, "job") is None


def test_fence_passes_for_owner_and_raises_after_steal(engine: sa.Engine) -> None:
    """fence() inside a transaction passes while the lease is ours and raises LeaseLost after a takeover."""
    a = Lease(engine, "job", "A", 30)
    assert a.acquire()
    with engine.begin() as conn:
        a.fence(conn)
    assert steal_lease(engine, "job", "B", 30) == "A"
    with pytest.raises(LeaseLost, match="'job'"), engine.begin() as conn:
        a.fence(conn)


def test_fence_raises_once_expired_within_an_old_transaction(engine: sa.Engine) -> None:
    """fence() uses the statement clock: a transaction begun before expiry still sees the lease as lost."""
    a = Lease(engine, "job", "A", 1)
    assert a.acquire()
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT now()"))  # now() is frozen at this point for the transaction
        wait_for(lambda: lease_owner(engine, "job") is None, what="lease to expire")
        with pytest.raises(LeaseLost):
            a.fence(conn)


def test_concurrent_steal_waits_for_fenced_commit(engine: sa.Engine) -> None:
    """A takeover blocks on the lease row until the page transaction that fenced it commits."""
    a = Lease(engine, "job", "A", 30)
    assert a.acquire()
    page_written = threading.Event()
    result: dict[str, object] = {}

    def steal() -> None:
        result["previous"] = steal_lease(engine, "job", "B", 30)
        result["page_committed_first"] = page_written.is_set()

    with engine.connect() as conn:
        tx = conn.begin()
        a.fence(conn)
        thief = threading.Thread(target=steal)
        thief.start()
        wait_for(lambda: _blocked_on_lock(engine) == 1, what="the takeover to wait on the lease row")
        assert thief.is_alive()
        assert lease_owner(engine, "job") == "A"
        page_written.set()
        tx.commit()
    thief.join(timeout=10)
    assert not thief.is_alive()
    assert result == {"previous": "A", "page_committed_first": True}
    assert lease_owner(engine, "job") == "B"
    assert not a.heartbeat()


def test_takeover_of_expired_lease_waits_for_fenced_commit(engine: sa.Engine) -> None:
    """A lease that expired during a fenced page transaction is taken over only after that page commits."""
    a = Lease(engine, "job", "A", 1)
    b = Lease(engine, "job", "B", 30)
    assert a.acquire()
    taken: list[bool] = []
    with engine.connect() as conn:
        tx = conn.begin()
        a.fence(conn)
        wait_for(lambda: lease_owner(engine, "job") is None, what="lease to expire")
        thief = threading.Thread(target=lambda: taken.append(b.acquire()))
        thief.start()
        wait_for(lambda: _blocked_on_lock(engine) == 1, what="the takeover to wait on the lease row")
        assert taken == []
        tx.commit()
    thief.join(timeout=10)
    assert taken == [True]
    assert lease_owner(engine, "job") == "B"


def test_heartbeat_not_blocked_by_open_page_transaction(engine: sa.Engine) -> None:
    """The owner's heartbeat succeeds while a page transaction holds the fence (FOR KEY SHARE)."""
    a = Lease(engine, "job", "A", 30)
    assert a.acquire()
    done = threading.Event()
    outcome: list[bool] = []

    def beat() -> None:
        outcome.append(a.heartbeat())
        done.set()

    with engine.connect() as conn, conn.begin():
        a.fence(conn)
        worker = threading.Thread(target=beat)
        worker.start()
        assert done.wait(10), "heartbeat blocked behind the fenced page transaction"
        assert outcome == [True]
        a.fence(conn)
    worker.join(timeout=10)


def test_release_waits_for_fenced_commit(engine: sa.Engine) -> None:
    """Deleting the lease (release) also waits for a page transaction that fenced it."""
    a = Lease(engine, "job", "A", 30)
    assert a.acquire()
    released: list[bool] = []
    with engine.connect() as conn:
        tx = conn.begin()
        a.fence(conn)
        worker = threading.Thread(target=lambda: released.append(a.release()))
        worker.start()
        wait_for(lambda: _blocked_on_lock(engine) == 1, what="release to wait on the lease row")
        assert released == []
        tx.commit()
    worker.join(timeout=10)
    assert released == [True]


# --- Heartbeat thread --------------------------------------------------------------------


def test_heartbeat_thread_sets_lost_when_lease_stolen(engine: sa.Engine) -> None:
    """The heartbeat thread renews the lease, then sets `lost` with a reason once another owner takes it."""
    a = Lease(engine, "job", "A", 2)
    assert a.acquire()
    with Heartbeat(0.1, [a.heartbeat]) as hb:
        wait_for(lambda: hb.beats_done >= 3, what="three renewals")
        assert not hb.lost.is_set()
        steal_lease(engine, "job", "B", 30)
        assert hb.lost.wait(10)
        assert hb.lost_reason == "Lease.heartbeat returned False"
        wait_for(lambda: not hb.running, what="the thread to stop after the loss")
    assert lease_owner(engine, "job") == "B"


def test_heartbeat_thread_reports_exception_and_calls_on_lost() -> None:
    """A beat that raises is a loss: reason recorded, `lost` set, on_lost called, thread stopped."""

    def broken() -> bool:
        raise ConnectionError("store gone")

    reasons: list[str] = []
    with Heartbeat(0.05, [lambda: True, broken], on_lost=reasons.append) as hb:
        assert hb.lost.wait(10)
        wait_for(lambda: not hb.running, what="the thread to stop")
    assert hb.lost_reason is not None
    assert "broken raised ConnectionError: store gone" in hb.lost_reason
    assert reasons == [hb.lost_reason]
    assert hb.beats_done == 0


def test_heartbeat_counts_rounds_and_stops_at_once() -> None:
    """Each round calls every beat once; stop() returns without waiting out the interval."""
    calls: list[str] = []
    first = threading.Event()

    def beat_a() -> bool:
        calls.append("a")
        first.set()
        return True

    def beat_b() -> bool:
        calls.append("b")
        return True

    hb = Heartbeat(0.05, [beat_a, beat_b]).start()
    assert first.wait(10)
    wait_for(lambda: hb.beats_done >= 2, what="two rounds")
    hb.stop()
    assert not hb.running
    assert calls[:4] == ["a", "b", "a", "b"]
    assert not hb.lost.is_set()

    slow = Heartbeat(3600, [beat_a]).start()
    started = time.monotonic()
    slow.stop()
    assert time.monotonic() - started < 2
    assert not slow.running
    assert slow.beats_done == 0
