"""The retry policy a handler can steer: backoff with jitter and a cap, Retry-After, RetryAfter."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

import batch_assets
from batch_assets.errors import ConfigError
from batch_assets.queue.claims import Claim
from batch_assets.queue.handler import KwargsHandler
from batch_assets.queue.retry import RetryPolicy
from batch_assets.reference.payments.handler import classify_status, parse_retry_after

pytestmark = pytest.mark.unit


def test_backoff_doubles_is_capped_and_jitter_stays_within_its_fraction() -> None:
    """base * 2^(k-1) capped at max_s; with jitter 0.2 every delay is within ±20% and never above max_s; they differ."""
    plain = RetryPolicy(base_s=10, max_s=100, jitter=0)
    assert [plain.delay_s(k) for k in (1, 2, 3, 4, 5, 500)] == [10, 20, 40, 80, 100, 100]
    policy = RetryPolicy(base_s=10, max_s=100, jitter=0.2, random=random.Random(7).random)
    for attempt, nominal in ((1, 10), (2, 20), (3, 40)):
        delays = [policy.delay_s(attempt) for _ in range(200)]
        assert all(nominal * 0.8 <= d <= nominal * 1.2 for d in delays)
        assert max(delays) - min(delays) > nominal * 0.2  # spread, not one value
    assert all(policy.delay_s(6) <= 100 for _ in range(200))  # the cap holds after the jitter


def test_a_requested_delay_replaces_the_backoff_clamped_to_zero_and_max() -> None:
    """Retry-After / RetryAfter: used as asked (no jitter), clamped to 0..max_s; a non-finite request is ignored."""
    policy = RetryPolicy(base_s=10, max_s=100, jitter=0.5)
    assert policy.delay_s(1, requested=42) == 42
    assert policy.delay_s(3, requested=0) == 0
    assert policy.delay_s(1, requested=-5) == 0
    assert policy.delay_s(1, requested=10_000) == 100
    assert 5 <= policy.delay_s(1, requested=float("nan")) <= 15


@pytest.mark.parametrize(("attrs", "field"), [
    ({"base_s": 0}, "backoff.base_s"),
    ({"max_s": float("inf")}, "backoff.max_s"),
    ({"base_s": 10, "max_s": 5}, "backoff.max_s"),
    ({"jitter": 1.5}, "backoff.jitter"),
    ({"jitter": "0.1"}, "backoff.jitter"),
    ({"max_attempts": 0}, "max_attempts"),
])
def test_a_policy_that_cannot_work_names_its_field(attrs: dict[str, object], field: str) -> None:
    """Each bad value is a ConfigError naming the YAML field."""
    with pytest.raises(ConfigError) as info:
        RetryPolicy(**attrs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    """delay-seconds, an HTTP-date (future: the difference; past: 0); anything else is None."""
    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("120", now) == 120
    assert parse_retry_after(" 7 ", now) == 7
    assert parse_retry_after(format_datetime(now + timedelta(seconds=90), usegmt=True), now) == 90
    assert parse_retry_after(format_datetime(now - timedelta(hours=1), usegmt=True), now) == 0
    for bad in (None, "", "soon", "-5", "1.5", "９"):
        assert parse_retry_after(bad, now) is None


def test_429_and_503_carry_their_retry_after_other_answers_do_not() -> None:
    """The limits service's Retry-After sets the delay on 429 and 503 only; the verdicts stay as the payment queue
    (docs/guide/payment-queue.md) says."""
    assert classify_status(429, "30").delay_s == 30
    assert classify_status(503, "5").delay_s == 5
    assert classify_status(500, "30").delay_s is None
    assert classify_status(429, None).delay_s is None
    assert classify_status(422, "30").kind.name == "PERMANENT"
    assert "Retry-After 30s" in (classify_status(429, "30").error or "")


def test_a_plugin_raising_retry_after_is_a_transient_outcome_with_its_delay() -> None:
    """batch_assets.RetryAfter(seconds) from a team's function: RETRY after `seconds`; a bad number: the backoff."""

    def busy(*, recipient: str, attempts: int) -> None:
        raise batch_assets.RetryAfter(12.5, "quota exhausted")

    def nonsense(*, recipient: str, attempts: int) -> None:
        raise batch_assets.RetryAfter("later")  # type: ignore[arg-type]

    claim = Claim(id=uuid.uuid4(), attempts=1, token=uuid.uuid4(), values={"recipient": "a@example.org"})

    async def call(function: object) -> object:
        handler = KwargsHandler(function)  # type: ignore[arg-type]
        await handler.open()
        try:
            return await handler.handle_async(claim)
        finally:
            await handler.aclose()

    outcome = asyncio.run(call(busy))
    assert outcome.kind.name == "RETRY" and outcome.delay_s == 12.5  # type: ignore[attr-defined]
    assert "quota exhausted" in outcome.error  # type: ignore[attr-defined]
    assert asyncio.run(call(nonsense)).delay_s is None  # type: ignore[attr-defined]


def test_the_http_client_hands_back_the_final_answers_retry_after() -> None:
    """post_answer reads Retry-After from the final response (not from a 1xx before it); absent means None."""
    from batch_assets.reference.payments.http11 import PostClient

    answers = [
        b"HTTP/1.1 100 Continue\r\nRetry-After: 999\r\n\r\n"
        b"HTTP/1.1 429 Too Many\r\nRetry-After:  17 \r\nContent-Length: 2\r\n\r\nno",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    ]

    async def scenario() -> list[tuple[int, str | None]]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for answer in answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                await reader.readexactly(length)
                writer.write(answer)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        client = PostClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/", timeout_s=5, max_connections=1)
        try:
            got = []
            for _ in answers:
                answer = await client.post_answer(b"{}", {})
                got.append((answer.status, answer.retry_after))
            return got
        finally:
            await client.aclose()
            server.close()
            await server.wait_closed()

    assert asyncio.run(scenario()) == [(429, "17"), (200, None)]
