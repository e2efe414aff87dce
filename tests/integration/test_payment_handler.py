"""The HTTP limits handler against a real local HTTP server, end to end through the worker."""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import LimitsStub

from batch_assets.queue.handler import OutcomeKind
from batch_assets.queue.settings import QueueSettings
from batch_assets.reference.payments import queue
from batch_assets.reference.payments.handler import HttpLimitsHandler, classify_status
from batch_assets.reference.payments.worker import run_worker

pytestmark = pytest.mark.integration


@pytest.fixture
def limits() -> Iterator[LimitsStub]:
    """A scripted limits service (`respond`, `delay_s`) recording keys, bodies and concurrency."""
    with LimitsStub() as service:
        yield service


def _settings(**kw: object) -> QueueSettings:
    base = dict(max_attempts=3, backoff_base_s=0.001, backoff_max_s=0.001, http_timeout_s=2, poll_interval_s=0.05)
    base.update(kw)
    return QueueSettings(**base)


def _rows(engine: sa.Engine) -> list[sa.Row]:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT * FROM payments ORDER BY id")).all()


def _work_until_settled(engine: sa.Engine, settings: QueueSettings, handler: HttpLimitsHandler) -> dict[str, Any]:
    """Run the worker (making backed-off rows due between runs) until nothing is NEW or PROCESSING."""
    totals: dict[str, Any] = {"claimed": 0, "done": 0, "retried": 0, "failed": 0, "lost_claims": 0,
                              "retried_by_type": Counter(), "failed_by_type": Counter()}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE payments SET next_attempt_at = now() - interval '1 s' WHERE status = 'NEW'"))
            pending = conn.execute(sa.text("SELECT count(*) FROM payments WHERE status IN ('NEW', 'PROCESSING')"))
            if pending.scalar() == 0:
                return totals
        result = run_worker(engine, settings, handler=handler)
        for k in totals:
            totals[k] += getattr(result, k)
    raise AssertionError("payments did not settle within 60 s")


def test_classification_of_status_codes() -> None:
    """2xx done; 408, 429, 5xx retry; other 4xx permanent; 3xx retry (never drop a payment on a misconfiguration)."""
    kinds = {
        code: classify_status(code).kind for code in (200, 201, 204, 400, 401, 404, 408, 409, 422, 429, 500, 503, 302)
    }
    assert kinds == {
        200: OutcomeKind.DONE, 201: OutcomeKind.DONE, 204: OutcomeKind.DONE,
        400: OutcomeKind.PERMANENT, 401: OutcomeKind.PERMANENT, 404: OutcomeKind.PERMANENT,
        408: OutcomeKind.RETRY, 409: OutcomeKind.PERMANENT, 422: OutcomeKind.PERMANENT,
        429: OutcomeKind.RETRY, 500: OutcomeKind.RETRY, 503: OutcomeKind.RETRY, 302: OutcomeKind.RETRY,
    }  # fmt: skip


def test_2xx_marks_done_once_with_idempotency_key(engine: sa.Engine, limits: LimitsStub) -> None:
    """A 2xx answer marks each payment DONE after one call carrying Idempotency-Key = payment id and the JSON body."""
    queue.enqueue(engine, 5, seed=21)
    with HttpLimitsHandler(limits.url, timeout_s=2) as handler:
        result = run_worker(engine, _settings(), handler=handler)
    rows = _rows(engine)
    assert (result.claimed, result.done, result.retried, result.failed) == (5, 5, 0, 0)
    assert all(r.status == "DONE" and r.attempts == 1 and r.processed_at is not None for r in rows)
    assert sorted(limits.keys) == sorted(str(r.id) for r in rows)
    assert sorted(limits.bodies, key=lambda b: b["payment_id"]) == [
        {"payment_id": str(r.id), "amount_cents": r.amount_cents} for r in sorted(rows, key=lambda r: str(r.id))
    ]


@pytest.mark.parametrize("status", [400, 404, 422])
def test_4xx_is_failed_at_once(engine: sa.Engine, limits: LimitsStub, status: int) -> None:
    """A 4xx other than 408/429 fails the payment on its first attempt, with the status in last_error."""
    queue.enqueue(engine, 2, seed=22)
    limits.respond = lambda body: status
    with HttpLimitsHandler(limits.url, timeout_s=2) as handler:
        result = run_worker(engine, _settings(), handler=handler)
    assert (result.failed, result.retried, result.done) == (2, 0, 0)
    assert result.failed_by_type == {f"http_{status}": 2}
    assert all(r.status == "FAILED" and r.attempts == 1 and str(status) in r.last_error for r in _rows(engine))
    assert len(limits.keys) == 2


@pytest.mark.parametrize("status", [500, 503, 408, 429])
def test_retriable_status_retries_then_fails_at_max_attempts(
    engine: sa.Engine, limits: LimitsStub, status: int
) -> None:
    """5xx, 408 and 429 retry with backoff until max attempts, then FAILED with last_error; the same key each time."""
    queue.enqueue(engine, 1, seed=23)
    limits.respond = lambda body: status
    with HttpLimitsHandler(limits.url, timeout_s=2) as handler:
        totals = _work_until_settled(engine, _settings(max_attempts=3), handler)
    [row] = _rows(engine)
    assert (row.status, row.attempts) == ("FAILED", 3)
    assert f"HTTP {status}" in row.last_error
    assert (totals["retried"], totals["failed"]) == (2, 1)
    kind = f"http_{status}"  # each transient attempt counted under its kind, the last one as the row's failure
    assert (totals["retried_by_type"], totals["failed_by_type"]) == ({kind: 2}, {kind: 1})
    assert limits.keys == [str(row.id)] * 3


def test_retry_then_success_is_done(engine: sa.Engine, limits: LimitsStub) -> None:
    """A payment that gets 503 then 200 ends DONE on its second attempt."""
    queue.enqueue(engine, 1, seed=24)
    answers = iter([503, 200])
    limits.respond = lambda body: next(answers)
    with HttpLimitsHandler(limits.url, timeout_s=2) as handler:
        totals = _work_until_settled(engine, _settings(), handler)
    [row] = _rows(engine)
    assert (row.status, row.attempts, totals["done"], totals["retried"]) == ("DONE", 2, 1, 1)


def test_timeout_is_retried_then_failed(engine: sa.Engine, limits: LimitsStub) -> None:
    """A call slower than the handler timeout is a retry; at max attempts the payment is FAILED with 'timed out'."""
    queue.enqueue(engine, 1, seed=25)
    limits.delay_s = 5
    settings = _settings(max_attempts=2, http_timeout_s=0.2)
    with HttpLimitsHandler(limits.url, timeout_s=settings.http_timeout_s) as handler:
        started = time.monotonic()
        totals = _work_until_settled(engine, settings, handler)
        elapsed = time.monotonic() - started
    [row] = _rows(engine)
    assert (row.status, row.attempts) == ("FAILED", 2)
    assert "timed out" in row.last_error
    assert (totals["retried"], totals["failed"]) == (1, 1)
    assert elapsed < 4  # each call was cut at the timeout, not at the server's 5 s


def test_connection_refused_is_retried_then_failed(engine: sa.Engine) -> None:
    """A connection error is a retry; at max attempts the payment is FAILED; the error names no URL."""
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://user:secret@127.0.0.1:{port}/limits?token=hunter2"
    queue.enqueue(engine, 1, seed=26)
    with HttpLimitsHandler(url, timeout_s=1) as handler:
        totals = _work_until_settled(engine, _settings(max_attempts=2), handler)
    [row] = _rows(engine)
    assert (row.status, row.attempts, totals["failed"]) == ("FAILED", 2, 1)
    assert "connect" in row.last_error
    assert "secret" not in row.last_error and "hunter2" not in row.last_error and str(port) not in row.last_error


def test_concurrency_is_bounded(engine: sa.Engine, limits: LimitsStub) -> None:
    """The service never sees more than `concurrency` requests at once, and does see that many."""
    queue.enqueue(engine, 40, seed=27)
    limits.delay_s = 0.05
    settings = _settings(concurrency=4, batch_size=10)
    with HttpLimitsHandler(limits.url, timeout_s=2, max_connections=16) as handler:
        result = run_worker(engine, settings, handler=handler)
    assert result.done == 40
    assert limits.max_active == 4


def test_max_seconds_stops_the_worker_while_the_service_is_slow(engine: sa.Engine, limits: LimitsStub) -> None:
    """With a slow service, max_seconds ends the run; unfinished claims are released, nothing is stuck."""
    queue.enqueue(engine, 50, seed=28)
    limits.delay_s = 0.3
    settings = _settings(concurrency=2, batch_size=10)
    with HttpLimitsHandler(limits.url, timeout_s=2) as handler:
        started = time.monotonic()
        result = run_worker(engine, settings, handler=handler, max_seconds=0.5, drain=False)
        elapsed = time.monotonic() - started
    assert result.stopped_by == "max_seconds"
    assert elapsed < 3
    assert 0 < result.done < 50
    stats = queue.queue_stats(engine)
    assert stats["by_status"]["PROCESSING"] == 0
    assert stats["by_status"]["DONE"] == result.done
