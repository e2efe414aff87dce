"""Payment handlers: the HTTP limits check of CONTRACT §7, plug-in handlers, and a simulation for demos.

A handler turns one claimed payment into an `Outcome`; it never touches the database and
never raises for an expected failure. The worker awaits `handle_async` on its event loop, so
up to `concurrency` calls are in flight without one OS thread per call; a handler with only a
synchronous `handle` runs on a bounded thread pool. Error texts carry the kind and status
only: never the URL (it may hold credentials), request or response bodies.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import importlib
import inspect
import json
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from batch_assets.domains.payments.errors import PermanentFailure
from batch_assets.domains.payments.http11 import HttpError, PostClient
from batch_assets.domains.payments.queue import Claim, clip
from batch_assets.errors import ConfigError

PAYMENT_HANDLER_VAR = "BATCH_ASSETS_PAYMENT_HANDLER"
"""`module:function` of a user's own handler (CONTRACT §7); unset = the default handler."""


class OutcomeKind(enum.Enum):
    DONE = "DONE"
    RETRY = "RETRY"
    PERMANENT = "PERMANENT"


@dataclass(frozen=True)
class Outcome:
    """What happened to one payment: DONE, RETRY (transient) or PERMANENT, with a safe error text and type."""

    kind: OutcomeKind
    error: str | None = None
    error_type: str | None = None

    @classmethod
    def done(cls) -> Outcome:
        return cls(OutcomeKind.DONE)

    @classmethod
    def retry(cls, error_type: str, error: str) -> Outcome:
        return cls(OutcomeKind.RETRY, error, error_type)

    @classmethod
    def permanent(cls, error_type: str, error: str) -> Outcome:
        return cls(OutcomeKind.PERMANENT, error, error_type)


class Handler(Protocol):
    """What the worker calls. `handle_async` (preferred, `AsyncHandler`) or `handle` (run on a thread
    pool, `SyncHandler`); `open` / `aclose` (optional coroutines, `LoopResource`) run on the worker's
    event loop around each run."""

    def close(self) -> None: ...


# The worker tells these apart once per run (isinstance on a runtime-checkable protocol only looks
# for the methods), never per payment.
@runtime_checkable
class AsyncHandler(Protocol):
    async def handle_async(self, claim: Claim) -> Outcome: ...


@runtime_checkable
class SyncHandler(Protocol):
    def handle(self, claim: Claim) -> Outcome: ...


@runtime_checkable
class LoopResource(Protocol):
    async def open(self) -> None: ...

    async def aclose(self) -> None: ...


def classify_status(status_code: int) -> Outcome:
    """2xx → DONE; 408, 429 and 5xx → RETRY; any other 4xx → PERMANENT; anything else → RETRY."""
    error = f"limits service answered HTTP {status_code}"
    if 200 <= status_code < 300:
        return Outcome.done()
    if status_code in (408, 429) or 500 <= status_code < 600:
        return Outcome.retry(f"http_{status_code}", error)
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
        body = json.dumps({"payment_id": str(claim.id), "amount_cents": int(claim.amount_cents)}).encode()
        try:
            status = await self._client.post(body, {"Idempotency-Key": str(claim.id)})
        except HttpError as exc:
            if exc.kind == "timeout":
                return Outcome.retry("timeout", f"limits call timed out after {self.timeout_s:g}s")
            return Outcome.retry(exc.kind, str(exc))
        return classify_status(status)

    def close(self) -> None:
        return None

    def __enter__(self) -> HttpLimitsHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PluginHandler:
    """A user's function `f(*, payment_id, amount_cents, attempts)` as a handler (CONTRACT §7).

    Returning means DONE; `batch_assets.PermanentFailure` means FAILED at once; any other
    exception is transient (retry with backoff). An `async def` runs on the worker's event
    loop; a plain function runs on a thread pool of `concurrency` threads. `payment_id` is the
    id as text, as in the HTTP body.
    """

    def __init__(self, function: Callable[..., Any], *, concurrency: int = 8, name: str = "") -> None:
        self.function = function
        self.name = name or getattr(function, "__qualname__", "handler")
        self.is_async = inspect.iscoroutinefunction(function)
        self.concurrency = max(int(concurrency), 1)
        self._pool: ThreadPoolExecutor | None = None

    async def open(self) -> None:
        if not self.is_async:
            self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="payment-handler")

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    async def handle_async(self, claim: Claim) -> Outcome:
        kwargs = {"payment_id": str(claim.id), "amount_cents": int(claim.amount_cents), "attempts": int(claim.attempts)}
        try:
            if self.is_async:
                await self.function(**kwargs)
            else:
                call = lambda: self.function(**kwargs)  # noqa: E731
                await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except PermanentFailure as exc:
            return Outcome.permanent("permanent_failure", _describe(exc))
        except Exception as exc:  # transient by contract; the text is the handler's own
            return Outcome.retry(f"handler_{type(exc).__name__}", _describe(exc))
        return Outcome.done()

    def close(self) -> None:
        return None


def _describe(exc: BaseException) -> str:
    """`Type: message`, one line clipped to queue.ERROR_MAX_BYTES (a handler may raise any size of text)."""
    text = clip(exc)
    return clip(f"{type(exc).__name__}: {text}") if text else type(exc).__name__


def load_plugin(spec: str, *, concurrency: int = 8) -> PluginHandler:
    """`module:function` → PluginHandler; anything not importable or not callable is a ConfigError (exit 2)."""
    module_name, sep, attr = spec.strip().partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"must be module:function, got {spec!r}", field=PAYMENT_HANDLER_VAR)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module itself failed while importing
        raise ConfigError(f"cannot import {module_name!r} ({type(exc).__name__})", field=PAYMENT_HANDLER_VAR) from None
    function: Any = module
    for part in attr.split("."):
        function = getattr(function, part, None)
        if function is None:
            raise ConfigError(f"{module_name!r} has no {attr!r}", field=PAYMENT_HANDLER_VAR)
    if not callable(function):
        raise ConfigError(f"{spec!r} is not callable", field=PAYMENT_HANDLER_VAR)
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
    limits URL is set, else the SimulatedHandler (CONTRACT §7)."""
    if plugin:
        return load_plugin(plugin, concurrency=concurrency)
    if limits_url:
        return HttpLimitsHandler(limits_url, timeout_s, max_connections=max(concurrency, 1))
    return SimulatedHandler(seed=seed)
