"""The payment worker: claim in batches, process outside any transaction on a bounded pool.

The main thread claims and tallies; pool threads call the handler and write the fenced
result, each in its own short transaction. At most `max(batch_size, concurrency)` rows are
claimed by this worker at any time, and at most `concurrency` handler calls are in flight.
On stop (event, max_seconds or a write error) no new claim is made, claims not yet started
are released (NEW again, attempt undone), and calls already started finish.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from batch_assets.db.engine import translate_errors
from batch_assets.domains.payments import queue
from batch_assets.domains.payments.handler import Handler, Outcome, OutcomeKind
from batch_assets.domains.payments.queue import Claim, QueueSettings

# What one processed claim came to, tallied by the main thread.
_DONE, _RETRIED, _FAILED, _LOST, _RELEASED = "done", "retried", "failed", "lost", "released"
_PROGRESS_EVERY_S = 1.0


@dataclass
class QueueResult:
    """Counters of one worker run."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0  # terminal: FAILED written by this run
    lost_claims: int = 0  # fenced writes that matched 0 rows (another worker owns the row now)
    released: int = 0  # claimed but never started before the stop; given back
    failed_by_type: Counter[str] = field(default_factory=Counter)
    duration_s: float = 0.0
    dlq_size: int | None = None
    stopped_by: str = ""  # drained | stop | max_seconds | error
    status: str = "SUCCESS"

    def to_summary(self, run_id: str) -> dict[str, Any]:
        """The CONTRACT §2 summary: scanned = claimed, changed = done, unchanged = retried, plus extras."""
        return {
            "status": self.status,
            "run_id": run_id,
            "scanned": self.claimed,
            "changed": self.done,
            "unchanged": self.retried,
            "failed": self.failed,
            "failed_by_type": dict(sorted(self.failed_by_type.items())),
            "duration_s": round(self.duration_s, 3),
            "retried": self.retried,
            "lost_claims": self.lost_claims,
            "released": self.released,
            "dlq_size": self.dlq_size,
            "stopped_by": self.stopped_by,
        }


def run_worker(
    engine: sa.Engine,
    settings: QueueSettings,
    *,
    handler: Handler,
    stop: threading.Event | None = None,
    max_seconds: float | None = None,
    drain: bool = True,
    progress: Callable[[QueueResult], None] | None = None,
) -> QueueResult:
    """Process due payments until `stop` is set, `max_seconds` pass, or (drain=True) nothing is due.

    A write that fails (e.g. the database went away) stops the run; the first such error is
    raised once the calls in flight have settled. Calls already started when the run stops
    finish (each bounded by the handler's timeout), so the run may last up to one call longer
    than `max_seconds`. Connection-level database errors surface as `DatabaseUnavailable`.
    """
    with translate_errors(engine):
        return _run_worker(engine, settings, handler, stop, max_seconds, drain, progress)


def _run_worker(
    engine: sa.Engine,
    settings: QueueSettings,
    handler: Handler,
    stop: threading.Event | None,
    max_seconds: float | None,
    drain: bool,
    progress: Callable[[QueueResult], None] | None,
) -> QueueResult:
    started = time.monotonic()
    deadline = None if max_seconds is None else started + max_seconds
    stop = stop or threading.Event()
    halt = threading.Event()  # set when the run stops: tasks not yet started give their claim back
    result = QueueResult()
    errors: list[BaseException] = []
    in_flight: dict[Future[tuple[str, str | None]], Claim] = {}
    limit = max(settings.batch_size, settings.concurrency)
    next_claim_at = 0.0
    last_progress = started

    def process(claim: Claim) -> tuple[str, str | None]:
        if halt.is_set():
            return (_RELEASED if queue.release(engine, claim) else _LOST), None
        outcome = _call(handler, claim, settings)
        if outcome.kind is OutcomeKind.DONE:
            return (_DONE if queue.complete(engine, claim) else _LOST), None
        permanent = outcome.kind is OutcomeKind.PERMANENT
        written = queue.retry_or_fail(engine, claim, outcome.error or "", settings, permanent)
        if written is None:
            return _LOST, None
        return (_FAILED, outcome.error_type or "unknown") if written == "FAILED" else (_RETRIED, None)

    def tally(done: set[Future[tuple[str, str | None]]]) -> None:
        for fut in done:
            in_flight.pop(fut)
            try:
                what, error_type = fut.result()
            except Exception as exc:  # a write failed: stop claiming, re-raised below
                errors.append(exc)
                continue
            if what == _DONE:
                result.done += 1
            elif what == _RETRIED:
                result.retried += 1
            elif what == _FAILED:
                result.failed += 1
                result.failed_by_type[error_type or "unknown"] += 1
            elif what == _LOST:
                result.lost_claims += 1
            else:
                result.released += 1

    def stop_reason() -> str | None:
        if errors:
            return "error"
        if stop.is_set():
            return "stop"
        if deadline is not None and time.monotonic() >= deadline:
            return "max_seconds"
        return None

    def bounded(timeout: float) -> float:
        return timeout if deadline is None else max(0.0, min(timeout, deadline - time.monotonic()))

    pool = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="payment-worker")
    try:
        while (reason := stop_reason()) is None:
            room = limit - len(in_flight)
            # Refill once the backlog fell to the pool size, so the pool never idles while
            # claimed rows never wait long for a thread (their lease is running).
            if (
                room > 0
                and len(in_flight) <= settings.concurrency
                and (not in_flight or time.monotonic() >= next_claim_at)
            ):
                wanted = min(settings.batch_size, room)
                claims = queue.claim(engine, wanted, settings.claim_lease_s)
                result.claimed += len(claims)
                for claim in claims:
                    in_flight[pool.submit(process, claim)] = claim
                # A short batch means the queue is (nearly) empty: poll it again only after a pause.
                next_claim_at = 0.0 if len(claims) == wanted else time.monotonic() + settings.poll_interval_s
                if not in_flight:
                    if drain:
                        reason = "drained"
                        break
                    stop.wait(bounded(settings.poll_interval_s))
                    continue
            pause = settings.poll_interval_s
            if next_claim_at and len(in_flight) <= settings.concurrency:
                pause = min(pause, max(0.0, next_claim_at - time.monotonic()))
            finished, _ = wait(list(in_flight), timeout=bounded(pause), return_when=FIRST_COMPLETED)
            tally(finished)
            if progress is not None and time.monotonic() - last_progress >= _PROGRESS_EVERY_S:
                last_progress = time.monotonic()
                result.duration_s = last_progress - started
                progress(result)
        result.stopped_by = reason
    finally:
        halt.set()
        for fut, claim in list(in_flight.items()):
            if fut.cancel():  # never started: give the claim back
                in_flight.pop(fut)
                try:
                    result.released += 1 if queue.release(engine, claim) else 0
                except Exception as exc:  # the lease will bring the row back anyway
                    errors.append(exc)
        tally(set(wait(list(in_flight)).done))
        pool.shutdown(wait=True)
    result.duration_s = time.monotonic() - started
    if errors:
        result.status = "FAILURE"
        raise errors[0]
    result.dlq_size = queue.dlq_size(engine)
    if progress is not None:
        progress(result)
    return result


def _call(handler: Handler, claim: Claim, settings: QueueSettings) -> Outcome:
    if claim.attempts > settings.max_attempts:
        # Only reachable through lapsed leases (a worker died mid-call): stop calling for it.
        return Outcome.permanent(
            "max_attempts_exceeded", f"claim lapsed repeatedly; attempt {claim.attempts} > max {settings.max_attempts}"
        )
    try:
        return handler.handle(claim)
    except Exception as exc:  # a handler bug must not strand the row until its lease lapses
        return Outcome.retry("handler_error", f"handler raised {type(exc).__name__}")
