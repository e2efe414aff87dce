"""The retry policy a handler can steer, end to end through the worker on a real PostgreSQL:
the limits service's Retry-After on 429/503, `batch_assets.RetryAfter(seconds)` from a team's function,
and the jittered backoff otherwise."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import LimitsStub, wait_for

import batch_assets
from batch_assets.queue.handler import Handler, KwargsHandler
from batch_assets.queue.settings import QueueSettings
from batch_assets.reference.payments import queue
from batch_assets.reference.payments.handler import HttpLimitsHandler, payment_arguments
from batch_assets.reference.payments.worker import run_worker

pytestmark = pytest.mark.integration

# Without the requested delay a retry would wait 10 minutes: a retry within seconds can only be the request.
SETTINGS = QueueSettings(max_attempts=3, backoff_base_s=600, backoff_max_s=3600, poll_interval_s=0.2,
                               http_timeout_s=5)


def _rows(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT id, status, attempts, last_error FROM payments")).all()


def _resident(engine: sa.Engine, handler: Handler, done: int) -> None:
    """A resident worker until `done` payments are DONE (a row due in a second is waited for, not drained)."""
    stop = threading.Event()
    worker = threading.Thread(target=run_worker, args=(engine, SETTINGS),
                              kwargs={"handler": handler, "stop": stop, "drain": False}, daemon=True)
    worker.start()
    try:
        wait_for(lambda: sum(r.status == "DONE" for r in _rows(engine)) == done, timeout=30, what=f"{done} DONE")
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive()


def test_retry_after_of_a_429_or_503_sets_the_next_attempt(engine: sa.Engine) -> None:
    """First answer 429 / 503 with Retry-After: 1, then 200: each payment is called again about 1 s later (not
    after the 600 s backoff), DONE on attempt 2; last_error said why it waited."""
    first_status = {}
    lock = threading.Lock()

    def respond(body: dict[str, Any]) -> int:
        with lock:
            if body["payment_id"] in first_status:
                return 200
            first_status[body["payment_id"]] = 429 if len(first_status) % 2 else 503
            return first_status[body["payment_id"]]

    queue.enqueue(engine, 4, seed=191)
    with LimitsStub(keep_alive=True, respond=respond, headers=lambda body: {"Retry-After": "1"}) as stub:
        _resident(engine, HttpLimitsHandler(stub.url, SETTINGS.http_timeout_s), done=4)
        calls: dict[str, list[float]] = defaultdict(list)
        for key, at in zip(stub.keys, stub.times, strict=True):
            calls[key].append(at)
    assert set(first_status.values()) == {429, 503}
    for times in calls.values():
        assert len(times) == 2 and 0.8 <= times[1] - times[0] <= 5, times
    assert {(r.status, r.attempts) for r in _rows(engine)} == {("DONE", 2)}


def test_a_handler_raising_retry_after_is_called_again_after_that_delay(engine: sa.Engine) -> None:
    """A team's function raising batch_assets.RetryAfter(1) on the first attempt: called again ~1 s later, DONE."""
    seen: dict[str, list[float]] = defaultdict(list)

    def limited(*, payment_id: str, amount_cents: int, attempts: int) -> None:
        seen[payment_id].append(time.monotonic())
        if attempts == 1:
            raise batch_assets.RetryAfter(1, "quota exhausted")

    queue.enqueue(engine, 3, seed=192)
    _resident(engine, KwargsHandler(limited, arguments=payment_arguments), done=3)
    assert len(seen) == 3
    for times in seen.values():
        assert len(times) == 2 and 0.8 <= times[1] - times[0] <= 5, times


def test_without_a_request_the_backoff_is_jittered(engine: sa.Engine) -> None:
    """20 payments failing at once with a 100 s base and jitter 0.2: next_attempt_at spread over 80..120 s."""
    settings = QueueSettings(max_attempts=3, backoff_base_s=100, backoff_max_s=1000, backoff_jitter=0.2,
                                   breaker_failures=100)  # a failing handler, not an outage: the breaker stays closed

    def failing(*, payment_id: str, amount_cents: int, attempts: int) -> None:
        raise RuntimeError("service down")

    queue.enqueue(engine, 20, seed=193)
    run_worker(engine, settings, handler=KwargsHandler(failing, arguments=payment_arguments))
    with engine.connect() as conn:
        waits = conn.execute(sa.text(
            "SELECT extract(epoch FROM next_attempt_at - now()) FROM payments WHERE status = 'NEW'"
        )).scalars().all()
    assert len(waits) == 20
    assert all(75 <= w <= 120 for w in waits), waits
    assert max(waits) - min(waits) > 10  # spread, not one value
