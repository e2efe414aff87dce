"""What a queue worker calls for each claimed row: an `Outcome`, from a handler object or a plain function.

A handler never touches the database and never raises for an expected failure. The worker awaits
`handle_async` on its event loop, so up to `concurrency` calls are in flight without one OS thread
per call; a handler with only a synchronous `handle` runs on a bounded thread pool.

`KwargsHandler` turns a team's function into a handler (docs/guide/payment-queue.md, docs/reference/declarations.md):
it is called
with keyword arguments (by default the declared columns plus `attempts`); returning means DONE,
raising `batch_assets.PermanentFailure` means FAILED at once, `batch_assets.RetryAfter(seconds)` is transient
and tried again after `seconds`, any other exception is transient (backoff).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from batch_assets.errors import PermanentFailure, RetryAfter
from batch_assets.queue.claims import Claim, clip
from batch_assets.shutdown import DaemonThreadPool


class OutcomeKind(enum.Enum):
    DONE = "DONE"
    RETRY = "RETRY"
    PERMANENT = "PERMANENT"


@dataclass(frozen=True)
class Outcome:
    """What happened to one row: DONE, RETRY (transient) or PERMANENT, with a safe error text and type.

    `delay_s`: a RETRY the handler wants tried again after this many seconds (Retry-After, RetryAfter)
    instead of the queue's backoff; None = the backoff.
    """

    kind: OutcomeKind
    error: str | None = None
    error_type: str | None = None
    delay_s: float | None = None

    @classmethod
    def done(cls) -> Outcome:
        return _DONE  # immutable: one object for every DONE (a handler returns it once per row)

    @classmethod
    def retry(cls, error_type: str, error: str, delay_s: float | None = None) -> Outcome:
        return cls(OutcomeKind.RETRY, error, error_type, delay_s)

    @classmethod
    def permanent(cls, error_type: str, error: str) -> Outcome:
        return cls(OutcomeKind.PERMANENT, error, error_type)


_DONE = Outcome(OutcomeKind.DONE)


class Handler(Protocol):
    """What the worker calls. `handle_async` (preferred, `AsyncHandler`) or `handle` (run on a thread
    pool, `SyncHandler`); `open` / `aclose` (optional coroutines, `LoopResource`) run on the worker's
    event loop around each run."""

    def close(self) -> None: ...


# The worker tells these apart once per run (isinstance on a runtime-checkable protocol only looks
# for the methods), never per row.
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


def column_arguments(claim: Claim) -> dict[str, Any]:
    """The declared columns as read, plus `attempts` (docs/reference/declarations.md)."""
    return {**claim.values, "attempts": int(claim.attempts)}


class KwargsHandler:
    """A function called with keyword arguments (`arguments(claim)`) as a handler.

    An `async def` runs on the worker's event loop; a plain function runs on a pool of `concurrency` daemon
    threads. The exception's message becomes the row's `last_error` (the handler's own text, shown by `dlq list`): a
    handler must not put a value it may not show into it.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        concurrency: int = 8,
        name: str = "",
        arguments: Callable[[Claim], dict[str, Any]] = column_arguments,
    ) -> None:
        self.function = function
        self.name = name or getattr(function, "__qualname__", "handler")
        self.is_async = inspect.iscoroutinefunction(function)
        self.concurrency = max(int(concurrency), 1)
        self.arguments = arguments
        self._pool: DaemonThreadPool | None = None

    async def open(self) -> None:
        if not self.is_async:
            # Daemon threads: a call that never returns must not keep a stopped worker's process alive.
            self._pool = DaemonThreadPool(self.concurrency, "queue-handler")

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    async def handle_async(self, claim: Claim) -> Outcome:
        kwargs = self.arguments(claim)
        try:
            if self.is_async:
                await self.function(**kwargs)
            else:
                assert self._pool is not None, "open() first"
                future = self._pool.submit(self.function, **kwargs)
                try:
                    await asyncio.wrap_future(future)
                except asyncio.CancelledError:  # the call's timeout, or a stop's drain that ended: left to its thread
                    self._pool.abandon(future)
                    raise
        except PermanentFailure as exc:
            return Outcome.permanent("permanent_failure", describe(exc))
        except RetryAfter as exc:
            return Outcome.retry("retry_after", describe(exc), exc.seconds)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 — transient by contract (SystemExit too); the text is the handler's own
            return Outcome.retry(f"handler_{type(exc).__name__}", describe(exc))
        return Outcome.done()

    def close(self) -> None:
        return None


def describe(exc: BaseException) -> str:
    """`Type: message`, one line clipped to ERROR_MAX_BYTES (a handler may raise any size of text)."""
    text = clip(exc)
    return clip(f"{type(exc).__name__}: {text}") if text else type(exc).__name__
