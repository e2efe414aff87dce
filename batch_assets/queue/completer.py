"""The completer: results wait in a buffer and are written by one fenced `UPDATE … unnest` per flush.

A result waits at most `flush_delay_s` for company; a full buffer (`max_batch_size`) or a stop
flushes at once. The claim loop sends the flush in its pipelined round trip (`take`), and hands the
rows written back (`tally`); a flush whose answer was lost goes back to the front (`put_back`) and is
written again on the next connection (fenced by the claim token: a write that did commit matches
nothing the second time, counted as a lost claim).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from batch_assets.queue.claims import Result, clip
from batch_assets.queue.liveness import Holdings
from batch_assets.queue.result import QueueResult
from batch_assets.queue.signals import Signals

Pending = tuple[Result, str | None]
"""A result and the error type it is counted under when it lands FAILED."""


class Completer:
    def __init__(self, *, max_rows: int, delay_s: float, signals: Signals, result: QueueResult,
                 clock: Callable[[], float], holdings: Holdings | None = None) -> None:
        self.max_rows = max_rows
        self.holdings = holdings  # claims renewed until written (liveness.py)
        self.delay_s = delay_s
        self.signals = signals
        self.result = result
        self.clock = clock
        self.results: list[Pending] = []
        self.first_result_at = 0.0

    def __bool__(self) -> bool:
        return bool(self.results)

    def add(self, result: Result, error_type: str | None) -> None:
        if result.error is not None:
            # Clipped before it waits in the buffer: a handler's huge error text must not pile up
            # max_batch_size times in memory (the buffer is bounded in bytes as well as rows).
            result = dataclasses.replace(result, error=clip(result.error))
        if not self.results:
            self.first_result_at = self.clock()
        self.results.append((result, error_type))
        if len(self.results) == 1 or len(self.results) >= self.max_rows:
            self.signals.kick.set()

    def due(self, now: float, *, halting: bool) -> bool:
        """Whether the buffer is to be written now: a stop, a full buffer, or its first result waited long enough."""
        return bool(self.results) and (
            halting or len(self.results) >= self.max_rows or now >= self.first_result_at + self.delay_s
        )

    def wait_s(self, now: float) -> float | None:
        """Seconds until the buffer is due by its delay (None when empty)."""
        return self.first_result_at + self.delay_s - now if self.results else None

    def take(self) -> list[Pending]:
        """The next flush: at most max_rows results, oldest first."""
        sent, self.results = self.results[: self.max_rows], self.results[self.max_rows:]
        if self.results:
            self.first_result_at = self.clock()
        return sent

    def put_back(self, sent: list[Pending]) -> None:
        """A flush whose outcome is unknown: written again first thing."""
        if sent:
            self.results[:0] = sent
            self.first_result_at = 0.0  # overdue

    def tally(self, sent: list[Pending], written: Iterable[Any]) -> None:
        """Count the rows a flush wrote (1-based positions in `sent`); the others lost their claim."""
        if self.holdings is not None:
            self.holdings.drop(res.claim for res, _ in sent)  # written, or no longer ours: no more renewal
        result = self.result
        matched = 0
        for ordinal, in written:
            matched += 1
            res, error_type = sent[ordinal - 1]
            if res.status == "DONE":
                result.done += 1
            elif res.status == "FAILED":
                result.failed += 1
                result.failed_by_type[error_type or "unknown"] += 1
            elif res.undo:
                result.released += 1
            else:
                result.retried += 1
                result.retried_by_type[error_type or "unknown"] += 1
        result.lost_claims += len(sent) - matched
