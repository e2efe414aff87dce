"""Payment handlers: the HTTP limits check of CONTRACT §7 and a deterministic simulation for demos.

A handler turns one claimed payment into an `Outcome`; it never touches the database and
never raises for an expected failure. Error texts carry the kind and status only — never
the URL (it may hold credentials), request or response bodies.
"""

from __future__ import annotations

import enum
import hashlib
import math
import time
from dataclasses import dataclass
from typing import Protocol

import httpx

from batch_assets.domains.payments.queue import Claim
from batch_assets.errors import ConfigError


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
    def handle(self, claim: Claim) -> Outcome: ...

    def close(self) -> None: ...


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
    """POSTs {"payment_id", "amount_cents"} with `Idempotency-Key: <payment id>` and an explicit timeout."""

    def __init__(self, url: str, timeout_s: float, *, max_connections: int = 32) -> None:
        if not url or not url.startswith(("http://", "https://")):
            raise ConfigError("must be an http(s) URL", field="BATCH_ASSETS_LIMITS_URL")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ConfigError(f"must be > 0, got {timeout_s!r}", field="http_timeout_s")
        self.url = url
        self.timeout_s = float(timeout_s)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        # httpx.Client is safe to share between threads; its pool is sized for the worker's concurrency.
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s), limits=limits, follow_redirects=False)

    def handle(self, claim: Claim) -> Outcome:
        """One POST for `claim`; the Idempotency-Key makes a repeated call (lost claim, retry) safe."""
        payload = {"payment_id": str(claim.id), "amount_cents": int(claim.amount_cents)}
        try:
            response = self._client.post(self.url, json=payload, headers={"Idempotency-Key": str(claim.id)})
        except httpx.TimeoutException as exc:
            return Outcome.retry("timeout", f"limits call timed out after {self.timeout_s:g}s ({type(exc).__name__})")
        except httpx.ConnectError as exc:
            return Outcome.retry("connection_error", f"cannot connect to limits service ({type(exc).__name__})")
        except httpx.TransportError as exc:
            return Outcome.retry("transport_error", f"limits call failed ({type(exc).__name__})")
        return classify_status(response.status_code)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpLimitsHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
        if self._fraction(claim.id, "permanent") < self.permanent_rate:
            return Outcome.permanent("simulated_rejection", "simulated limits service rejected the payment")
        if self._fraction(claim.id, claim.attempts) < self.failure_rate:
            return Outcome.retry("simulated_unavailable", "simulated limits service unavailable")
        return Outcome.done()

    def close(self) -> None:
        return None


def default_handler(limits_url: str | None, timeout_s: float, *, concurrency: int = 8, seed: int = 0) -> Handler:
    """HttpLimitsHandler when a limits URL is set, else the SimulatedHandler (CONTRACT §7)."""
    if limits_url:
        return HttpLimitsHandler(limits_url, timeout_s, max_connections=max(concurrency, 1))
    return SimulatedHandler(seed=seed)
