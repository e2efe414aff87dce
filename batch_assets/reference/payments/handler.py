"""Payment handlers: the HTTP limits check (docs/guide/payment-queue.md), plug-in handlers, and a simulation for demos.

A handler turns one claimed payment into an `Outcome`; it never touches the database and
never raises for an expected failure. The worker awaits `handle_async` on its event loop, so
up to `concurrency` calls are in flight without one OS thread per call; a handler with only a
synchronous `handle` runs on a bounded thread pool. Error texts carry the kind and status
only: never the URL (it may hold credentials), request or response bodies.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from batch_assets import Claim, ConfigError, Handler, KwargsHandler, Outcome, load_function
from batch_assets.reference.payments.http11 import HttpError, PostClient

PAYMENT_HANDLER_VAR = "BATCH_ASSETS_PAYMENT_HANDLER"
"""`module:function` of a user's own handler (docs/guide/payment-queue.md); unset = the default handler."""


RETRY_AFTER_STATUSES = (429, 503)
"""The answers whose `Retry-After` header sets the delay of the retry (RFC 9110 §10.2.3)."""


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a `Retry-After` value asks to wait: delay-seconds or an HTTP-date; None when absent or unreadable.

    An HTTP-date in the past means now (0). The queue's retry policy clamps the result to its `max_s`.
    """
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(int(text[:12]))  # up to 12 digits: any sane delay, no huge int from a hostile header
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; an obsolete form without a zone is taken as such
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def classify_status(status_code: int, retry_after: str | None = None) -> Outcome:
    """2xx → DONE; 408, 429 and 5xx → RETRY (after Retry-After on 429 and 503); any other 4xx → PERMANENT;
    anything else → RETRY."""
    error = f"limits service answered HTTP {status_code}"
    if 200 <= status_code < 300:
        return Outcome.done()
    if status_code in (408, 429) or 500 <= status_code < 600:
        delay_s = parse_retry_after(retry_after) if status_code in RETRY_AFTER_STATUSES else None
        if delay_s is not None:
            error = f"{error}, Retry-After {delay_s:g}s"
        return Outcome.retry(f"http_{status_code}", error, delay_s)
    if 400 <= status_code < 500:
        return Outcome.permanent(f"http_{status_code}", error)
    # 1xx/3xx: a misconfigured endpoint, not a verdict on the payment — retry, never drop money.
    return Outcome.retry(f"http_{status_code}", error)


class HttpLimitsHandler:
    """POSTs {"payment_id", "amount_cents"} with `Idempotency-Key: <payment id>` and an explicit timeout.

    Asynchronous: `open` creates the keep-alive client (`http11.PostClient`) on the worker's
    event loop and `aclose` closes it, so one handler object can serve several runs. At most
    `max_connections` calls are on the wire at once.
    """

    def __init__(self, url: str, timeout_s: float, *, max_connections: int = 32) -> None:
        if not url or not url.startswith(("http://", "https://")):
            raise ConfigError("must be an http(s) URL", field="BATCH_ASSETS_LIMITS_URL")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ConfigError(f"must be > 0, got {timeout_s!r}", field="http_timeout_s")
        self.url = url
        self.timeout_s = float(timeout_s)
        self.max_connections = max(int(max_connections), 1)
        self._client: PostClient | None = None

    async def open(self) -> None:
        self._client = PostClient(self.url, timeout_s=self.timeout_s, max_connections=self.max_connections)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def handle_async(self, claim: Claim) -> Outcome:
        """One POST for `claim`; the Idempotency-Key makes a repeated call (lost claim, retry) safe."""
        if self._client is None:
            raise RuntimeError("HttpLimitsHandler.open() was not awaited")
        body = json.dumps({"payment_id": str(claim.id), "amount_cents": int(claim.values["amount_cents"])}).encode()
        try:
            answer = await self._client.post_answer(body, {"Idempotency-Key": str(claim.id)})
        except HttpError as exc:
            if exc.kind == "timeout":
                return Outcome.retry("timeout", f"limits call timed out after {self.timeout_s:g}s")
            return Outcome.retry(exc.kind, str(exc))
        return classify_status(answer.status, answer.retry_after)

    def close(self) -> None:
        return None

    def __enter__(self) -> HttpLimitsHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def payment_arguments(claim: Claim) -> dict[str, Any]:
    """The keyword arguments of a payment plug-in: `payment_id` (the id as text, as in the HTTP body),
    `amount_cents` and `attempts` (docs/guide/payment-queue.md)."""
    return {"payment_id": str(claim.id), "amount_cents": int(claim.values["amount_cents"]),
            "attempts": int(claim.attempts)}


class PluginHandler(KwargsHandler):
    """A user's function `f(*, payment_id, amount_cents, attempts)` as a handler (docs/guide/payment-queue.md).

    Returning means DONE; `batch_assets.PermanentFailure` means FAILED at once;
    `batch_assets.RetryAfter(seconds)` is transient, tried again after `seconds`; any other
    exception is transient (retry with backoff). An `async def` runs on the worker's event
    loop; a plain function runs on a thread pool of `concurrency` threads.
    """

    def __init__(self, function: Callable[..., Any], *, concurrency: int = 8, name: str = "") -> None:
        super().__init__(function, concurrency=concurrency, name=name, arguments=payment_arguments)


def load_plugin(spec: str, *, concurrency: int = 8) -> PluginHandler:
    """`module:function` → PluginHandler; anything not importable or not callable is a ConfigError (exit 2)."""
    function = load_function(spec, field=PAYMENT_HANDLER_VAR)
    return PluginHandler(function, concurrency=concurrency, name=spec.strip())


def plugin_spec_from_environment() -> str | None:
    """The BATCH_ASSETS_PAYMENT_HANDLER value, read when called (never at import), or None."""
    return os.environ.get(PAYMENT_HANDLER_VAR, "").strip() or None


class SimulatedHandler:
    """Deterministic stand-in used when BATCH_ASSETS_LIMITS_URL is unset (demo).

    Per payment, a hash of (seed, id) decides a permanent rejection (`permanent_rate`); per
    attempt, a hash of (seed, id, attempt) decides a transient failure (`failure_rate`), so a
    retried payment usually succeeds later. The same seed gives the same outcomes.
    """

    def __init__(
        self, seed: int = 0, failure_rate: float = 0.1, permanent_rate: float = 0.02, latency_s: float = 0.0
    ) -> None:
        for name, rate in (("failure_rate", failure_rate), ("permanent_rate", permanent_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ConfigError(f"must be within [0, 1], got {rate!r}", field=name)
        if latency_s < 0:
            raise ConfigError(f"must be >= 0, got {latency_s!r}", field="latency_s")
        self.seed = seed
        self.failure_rate = failure_rate
        self.permanent_rate = permanent_rate
        self.latency_s = latency_s

    def _fraction(self, *parts: object) -> float:
        digest = hashlib.blake2b(":".join(str(p) for p in (self.seed, *parts)).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64

    def handle(self, claim: Claim) -> Outcome:
        """DONE, RETRY or PERMANENT as a pure function of (seed, payment id, attempt)."""
        if self.latency_s:
            time.sleep(self.latency_s)  # simulated network latency, not synchronisation
        return self._decide(claim)

    async def handle_async(self, claim: Claim) -> Outcome:
        """`handle` without a thread: the simulated latency is an asyncio sleep."""
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return self._decide(claim)

    def _decide(self, claim: Claim) -> Outcome:
        if self._fraction(claim.id, "permanent") < self.permanent_rate:
            return Outcome.permanent("simulated_rejection", "simulated limits service rejected the payment")
        if self._fraction(claim.id, claim.attempts) < self.failure_rate:
            return Outcome.retry("simulated_unavailable", "simulated limits service unavailable")
        return Outcome.done()

    def close(self) -> None:
        return None


def default_handler(
    limits_url: str | None, timeout_s: float, *, concurrency: int = 8, seed: int = 0, plugin: str | None = None
) -> Handler:
    """The plug-in when `plugin` (BATCH_ASSETS_PAYMENT_HANDLER) is set, else HttpLimitsHandler when a
    limits URL is set, else the SimulatedHandler (docs/guide/payment-queue.md)."""
    if plugin:
        return load_plugin(plugin, concurrency=concurrency)
    if limits_url:
        return HttpLimitsHandler(limits_url, timeout_s, max_connections=max(concurrency, 1))
    return SimulatedHandler(seed=seed)
