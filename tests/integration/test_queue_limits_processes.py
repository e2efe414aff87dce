"""The queue's limits and liveness with real worker processes: each worker is a process of its own
session against a local limits service that records when each call arrived and how many were in flight;
every process is killed by its own group in a `finally`.

- rate_limit_per_s across 3 workers: over any 1 s window the calls stay within 10% of the limit;
- max_in_flight across 3 workers: never more calls in flight than the cap, and the cap is reached;
- kill -9 of one of two workers mid-call: its claims are done by the other within the lease plus a margin
  (a correctness bound, not a speed figure), and not taken while it lived, though its calls outlasted the lease;
- a call slower than the lease is never taken over while its worker lives.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import LimitsStub, WorkerProcess, wait_for

from batch_assets.bench.payments_rate import window_counts
from batch_assets.reference.payments import queue

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.alone]


def _listening(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'batch_assets_listener' AND query LIKE 'LISTEN%'"
        )).scalar_one())


def _statuses(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT status, count(*) FROM payments GROUP BY status")).all())


@contextmanager
def _workers(n: int, db_url: str, stub: LimitsStub, knobs: dict[str, Any], tmp_path: Path,
             engine: sa.Engine, *, already: int = 0) -> Iterator[list[WorkerProcess]]:
    """`n` more resident workers (besides `already` running), each in its own session, all LISTENing before the
    test goes on; killed by their group at the end."""
    workers: list[WorkerProcess] = []
    try:
        for _ in range(n):
            workers.append(WorkerProcess(db_url, stub.url, knobs, tmp_path))
        wait_for(lambda: _listening(engine) >= already + n, timeout=60, what=f"{already + n} workers listening")
        yield workers
    finally:
        for worker in workers:
            worker.kill_group()


def test_three_workers_keep_together_to_one_rate_limit(db_url: str, engine: sa.Engine, tmp_path: Path) -> None:
    """3 worker processes at rate_limit_per_s 25 (each could call hundreds a second): every 1 s window of the
    limits service's calls holds 25 ± 10%, all three workers call, and every payment is DONE once."""
    rate, total = 25.0, 200
    knobs = {"concurrency": 4, "batch_size": 4, "rate_limit_per_s": rate, "poll_interval_s": 0.5}
    with LimitsStub(keep_alive=True) as stub:
        with _workers(3, db_url, stub, knobs, tmp_path, engine) as workers:
            queue.enqueue(engine, total, seed=181)
            wait_for(lambda: _statuses(engine).get("DONE") == total, timeout=60, what="every payment DONE")
            summaries = [worker.stop() for worker in workers]
        times = list(stub.times)
    counts = window_counts(times)
    assert len(counts) > 100
    assert rate * 0.9 <= min(counts) and max(counts) <= rate * 1.1, (min(counts), max(counts))
    assert all(s["changed"] > 0 for s in summaries), summaries  # the limit was shared, not held by one worker
    assert sum(s["changed"] for s in summaries) == total and len(times) == total


def test_three_workers_keep_together_to_max_in_flight(db_url: str, engine: sa.Engine, tmp_path: Path) -> None:
    """3 worker processes of concurrency 4 with max_in_flight 3 against a service taking 0.3 s a call: at most 3
    calls are ever in flight at the service (12 without the cap), the cap is reached, and all are DONE once."""
    knobs = {"concurrency": 4, "batch_size": 4, "max_in_flight": 3, "poll_interval_s": 0.5}
    with LimitsStub(keep_alive=True, delay_s=0.3) as stub:
        with _workers(3, db_url, stub, knobs, tmp_path, engine) as workers:
            queue.enqueue(engine, 30, seed=182)
            wait_for(lambda: _statuses(engine).get("DONE") == 30, timeout=60, what="every payment DONE")
            summaries = [worker.stop() for worker in workers]
        seen, posts = list(stub.active_seen), dict(stub.posts)
    assert max(seen) == 3, seen
    assert sum(s["changed"] for s in summaries) == 30 and set(posts.values()) == {1}


def test_a_killed_workers_claims_are_done_elsewhere_within_the_lease(
    db_url: str, engine: sa.Engine, tmp_path: Path
) -> None:
    """Lease 3 s. Worker A holds 4 calls that outlast the lease (not taken over while it lives: one POST each);
    kill -9 of A: worker B has them DONE within lease + 3 s (correctness bound), each called a second time."""
    lease = 3.0
    knobs = {"concurrency": 4, "batch_size": 4, "claim_lease_s": lease, "http_timeout_s": 60, "poll_interval_s": 0.5}
    with LimitsStub(keep_alive=True, delay_s=120) as stub:
        with _workers(1, db_url, stub, knobs, tmp_path, engine) as (first,):
            queue.enqueue(engine, 4, seed=183)
            wait_for(lambda: stub.active == 4, timeout=30, what="worker A's 4 calls in flight")
            with _workers(1, db_url, stub, knobs, tmp_path, engine, already=1) as (second,):
                time.sleep(lease * 1.5)  # the scenario: calls in flight for longer than the lease, A alive
                assert set(stub.posts.values()) == {1} and _statuses(engine) == {"PROCESSING": 4}
                stub.delay_s = 0  # B's calls answer at once; A's stay blocked (A is gone by then)
                killed_at = time.monotonic()
                first.kill_group()  # SIGKILL to A's process group: no drain, no give-back
                wait_for(lambda: _statuses(engine).get("DONE") == 4, timeout=lease + 30, interval=0.02,
                         what="A's claims DONE by B")
                taken_over_s = time.monotonic() - killed_at
                summary = second.stop()
    assert taken_over_s <= lease + 3.0, taken_over_s
    assert summary["changed"] == 4 and set(stub.posts.values()) == {2}


def test_a_call_slower_than_the_lease_is_not_taken_while_its_worker_lives(
    db_url: str, engine: sa.Engine, tmp_path: Path
) -> None:
    """Lease 1.5 s, calls of 5 s, two idle workers watching: every payment is called once and DONE, no claim lost."""
    knobs = {"concurrency": 2, "batch_size": 2, "claim_lease_s": 1.5, "http_timeout_s": 30, "poll_interval_s": 0.2}
    with LimitsStub(keep_alive=True, delay_s=5) as stub:
        with _workers(2, db_url, stub, knobs, tmp_path, engine) as workers:
            queue.enqueue(engine, 3, seed=184)
            wait_for(lambda: _statuses(engine).get("DONE") == 3, timeout=60, what="every payment DONE")
            summaries = [worker.stop() for worker in workers]
        posts = dict(stub.posts)
    assert set(posts.values()) == {1}, posts
    assert sum(s["lost_claims"] for s in summaries) == 0 and sum(s["changed"] for s in summaries) == 3
