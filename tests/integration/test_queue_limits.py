"""The queue's shared limits on a real PostgreSQL, piece by piece: the rate limit's slots and the
in-flight semaphore with its leases. Several limiters with connections of their own stand for several
workers; test_queue_limits_processes.py runs real worker processes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from batch_assets.errors import ConfigError
from batch_assets.queue.limits.inflight import InFlightLimiter
from batch_assets.queue.limits.ratelimit import RateLimiter
from batch_assets.queue.side import SideConnection

pytestmark = pytest.mark.integration

T = TypeVar("T")


def _conninfo(db_url: str) -> str:
    return sa.engine.make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _with_sides(db_url: str, n: int, body: Callable[[list[SideConnection]], Awaitable[T]]) -> T:
    sides = [SideConnection(_conninfo(db_url)) for _ in range(n)]
    try:
        return await body(sides)
    finally:
        for side in sides:
            await side.aclose()


def _max_in_window(times: list[float], window: float = 1.0) -> int:
    times = sorted(times)
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


@pytest.mark.alone
def test_three_limiters_share_one_rate_and_none_gets_a_burst(db_url: str) -> None:
    """3 limiters (own connections) x 4 lanes at 40/s for 3 s: every 1 s window holds 40 ± 10%, and no two
    slots are closer than 1/rate minus the event loop's slack."""
    rate, seconds = 40.0, 3.0

    async def scenario(sides: list[SideConnection]) -> tuple[list[float], list[RateLimiter]]:
        limiters = [RateLimiter(side, "payments", rate, lanes=4) for side in sides]
        loop = asyncio.get_running_loop()
        times: list[float] = []
        end = loop.time() + seconds

        async def lane(limiter: RateLimiter) -> None:
            while loop.time() < end:
                await limiter.acquire()
                times.append(loop.time())

        await asyncio.gather(*(lane(limiter) for limiter in limiters for _ in range(4)))
        return times, limiters

    times, limiters = asyncio.run(_with_sides(db_url, 3, scenario))
    times.sort()
    counts = [sum(1 for t in times if start <= t < start + 1.0) for start in times if start + 1.0 <= times[-1]]
    # No window over the limit (the limiter's promise: no burst), and the shared rate achieved over the run.
    # A window may dip below the rate only when this one process (12 lanes on one event loop) is starved of
    # CPU, which the limiter cannot help: a dip is bounded loosely here; the 3-process test
    # (test_queue_limits_processes) holds every 1 s window to ±10% with real workers.
    assert counts and max(counts) <= rate * 1.1, (min(counts), max(counts))
    assert min(counts) >= rate * 0.7, (min(counts), max(counts))
    achieved = (len(times) - 1) / (times[-1] - times[0])
    assert rate * 0.9 <= achieved <= rate * 1.1, achieved
    assert _max_in_window(times) <= rate * 1.1
    assert all(limiter.stats.granted > 0 for limiter in limiters)  # each "worker" got its share
    statements = sum(limiter.stats.statements for limiter in limiters)
    assert statements <= len(times) / 2  # slots come in runs, not one statement per call


def test_a_rate_that_cannot_work_names_its_field(db_url: str) -> None:
    """0, negative, infinite or absurd rates are ConfigErrors naming rate_limit_per_s."""
    side = SideConnection(_conninfo(db_url))
    for bad in (0, -1, float("inf"), 1e9, True):
        with pytest.raises(ConfigError) as info:
            RateLimiter(side, "payments", bad)  # type: ignore[arg-type]
        assert info.value.field == "rate_limit_per_s"


def test_in_flight_slots_cap_calls_across_limiters(db_url: str) -> None:
    """3 limiters x 5 lanes sharing max_in_flight 4: never more than 4 "calls" at once, and the cap is reached."""

    async def scenario(sides: list[SideConnection]) -> tuple[int, int, list[InFlightLimiter]]:
        limiters = [InFlightLimiter(side, "payments", 4, lease_s=30) for side in sides]
        active = peak = done = 0

        async def lane(limiter: InFlightLimiter) -> None:
            nonlocal active, peak, done
            for _ in range(6):
                slot = await limiter.acquire()
                active += 1
                peak = max(peak, active)
                await asyncio.sleep(0.03)  # the call
                active -= 1
                done += 1
                limiter.release(slot)

        await asyncio.gather(*(lane(limiter) for limiter in limiters for _ in range(5)))
        for limiter in limiters:
            await limiter.aclose()
        return peak, done, limiters

    peak, done, limiters = asyncio.run(_with_sides(db_url, 3, scenario))
    assert done == 3 * 5 * 6
    assert peak == 4
    assert all(limiter.stats.taken > 0 for limiter in limiters)  # no limiter kept the slots to itself


def test_a_dead_holders_slots_come_back_after_their_lease(db_url: str, engine: sa.Engine) -> None:
    """A limiter that took every slot and vanished (no release, no renewal) blocks the others only until the
    lease passes; a live holder that renews keeps its slots."""

    async def scenario(sides: list[SideConnection]) -> tuple[float, list[int]]:
        dead = InFlightLimiter(sides[0], "payments", 2, lease_s=1.0)
        live = InFlightLimiter(sides[1], "payments", 2, lease_s=1.0)
        other = InFlightLimiter(sides[2], "payments", 3, lease_s=1.0)  # a third slot for the live one
        await dead.acquire()
        await dead.acquire()
        loop = asyncio.get_running_loop()
        started = loop.time()
        slot = await live.acquire()  # waits for the dead holder's lease
        waited = loop.time() - started
        for _ in range(4):  # 2 s: twice the lease, renewed twice a lease
            await asyncio.sleep(0.5)
            await live.renew()
        held_by_live = list(live.held)
        assert await asyncio.wait_for(other.acquire(), 5) not in held_by_live
        live.release(slot)
        await live.aclose()
        return waited, held_by_live

    waited, held = asyncio.run(_with_sides(db_url, 3, scenario))
    assert 0.5 <= waited <= 3.0, waited  # about the lease (1 s), not at once and not forever
    assert len(held) == 1


def test_a_stop_gives_back_the_rows_waiting_for_a_rate_slot_at_once(engine: sa.Engine) -> None:
    """At 1 call/s with 4 lanes waiting, SIGTERM-like stop: the worker ends in seconds (not after the 30 s drain
    timeout), the rows never called are NEW again with their attempt undone, and nothing stays PROCESSING."""
    import threading
    import time

    from helpers import wait_for

    from batch_assets.queue.handler import Outcome
    from batch_assets.queue.settings import QueueSettings
    from batch_assets.reference.payments.queue import enqueue
    from batch_assets.reference.payments.worker import run_worker

    calls: list[float] = []

    class Stamp:
        async def handle_async(self, claim: object) -> Outcome:
            calls.append(time.monotonic())
            return Outcome.done()

        def close(self) -> None:
            return None

    enqueue(engine, 8, seed=17)
    settings = QueueSettings(concurrency=4, batch_size=4, rate_limit_per_s=1, poll_interval_s=0.2)
    stop = threading.Event()
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.append(run_worker(engine, settings, handler=Stamp(), stop=stop,
                                                                       drain=False)), daemon=True)
    worker.start()
    try:
        wait_for(lambda: len(calls) >= 2, timeout=30, what="two calls at 1/s")
    finally:
        stopped_at = time.monotonic()
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive() and time.monotonic() - stopped_at < 10
    [result] = outcome
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT status, attempts FROM payments")).all()
    done = [r for r in rows if r.status == "DONE"]
    assert len(done) == len(calls) == result.done
    assert all(r.status in ("DONE", "NEW") for r in rows)
    assert all(r.attempts == 0 for r in rows if r.status == "NEW")  # given back: the attempt undone
    # The lanes waiting at the gate (slots up to 4 s ahead) are not called after the stop; at most one slot may
    # fall in the moment before the worker sees it.
    assert sum(t > stopped_at for t in calls) <= 1, [round(t - stopped_at, 2) for t in calls]
    assert result.released >= 4


def test_a_gate_that_cannot_work_stops_the_worker_and_gives_every_row_back(engine: sa.Engine) -> None:
    """The limits' function gone (a database not migrated to 0007): the worker ends with that error instead of
    calling, and every claimed row is NEW again with its attempt undone; no call was made."""
    import psycopg

    from batch_assets.queue.handler import Outcome
    from batch_assets.queue.settings import QueueSettings
    from batch_assets.reference.payments.queue import enqueue
    from batch_assets.reference.payments.worker import run_worker

    calls: list[object] = []

    class Count:
        async def handle_async(self, claim: object) -> Outcome:
            calls.append(claim)
            return Outcome.done()

        def close(self) -> None:
            return None

    enqueue(engine, 6, seed=18)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP FUNCTION ba_rate_take"))
    settings = QueueSettings(concurrency=3, batch_size=3, rate_limit_per_s=50)
    with pytest.raises(psycopg.errors.UndefinedFunction):
        run_worker(engine, settings, handler=Count())
    assert calls == []
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT status, attempts FROM payments")).all()
    assert {(r.status, r.attempts) for r in rows} == {("NEW", 0)}


def test_a_claim_takes_a_rate_slot_for_each_row_it_claims(db_url: str, engine: sa.Engine) -> None:
    """While the limit does not bind (the last run of slots started now), the claim of a rate-limited queue
    reserves its rows' call slots in its own statement, so such a limit costs no statement of the limiter's:
    one slot per row claimed (at most a tenth of a second of the rate), due now; the slot is then taken
    without waiting; a claim of nothing takes no slot."""
    import psycopg

    from batch_assets.queue.claims import new_token
    from batch_assets.reference.payments import queue
    from batch_assets.reference.payments.store import PAYMENTS

    queue.enqueue(engine, 30, seed=71)
    before: list[Any] = []

    async def scenario(sides: list[SideConnection]) -> tuple[list[int], int, bool, int, int]:
        limiter = RateLimiter(sides[0], "payments", 100_000.0, lanes=4)  # at most 10,000 slots per claim
        await limiter.acquire()  # one statement of its own: a run that starts now
        limiter.slots.clear()
        async with await psycopg.AsyncConnection.connect(_conninfo(db_url), autocommit=True) as conn:
            cur = await conn.execute(NEXT_SLOT)
            before.extend(await cur.fetchall())
            cur = await PAYMENTS.send_claim(conn, 50, 30, new_token(), limiter.claim_slots())
            rows = await cur.fetchall()
            limiter.granted(rows[0][-2], rows[0][-1])
            taken_now = limiter.take_now()
            cur = await PAYMENTS.send_claim(conn, 50, 30, new_token(), limiter.claim_slots())
            nothing = len(await cur.fetchall())
        return [int(r[-2]) for r in rows], len(rows), taken_now, nothing, limiter.stats.statements

    granted, claimed, taken_now, nothing, statements = asyncio.run(_with_sides(db_url, 1, scenario))
    assert claimed == 30 and set(granted) == {30}  # every row carries the run's size: one slot per row
    assert taken_now  # the first slot is due now: no wait, no statement
    assert nothing == 0 and statements == 1  # the claims took their slots without a statement of their own
    [(next_before, _)] = before
    with engine.connect() as conn:
        next_after, claimed_at = conn.execute(sa.text(NEXT_SLOT)).one()
    # The claim moved the next free slot past exactly 30 slots, from the free slot or its own now if later.
    assert (next_after - max(next_before, claimed_at)).total_seconds() == pytest.approx(30 / 100_000.0, abs=1e-6)


NEXT_SLOT = "SELECT next_slot, updated_at FROM ba_queue_rate WHERE queue = 'payments'"
