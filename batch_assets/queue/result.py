"""The counters of one queue worker run and its JSON summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from batch_assets.queue.breaker import CLOSED


@dataclass
class QueueResult:
    """Counters of one worker run."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0  # terminal: FAILED written by this run
    lost_claims: int = 0  # fenced writes that matched 0 rows (another worker owns the row now)
    released: int = 0  # claimed but never called (stop, open breaker): given back, attempt undone
    failed_by_type: Counter[str] = field(default_factory=Counter)
    # The transient failures this run wrote back (retried), by kind: handler_<ExceptionType>, timeout,
    # retry_after, ... A row that fails every attempt shows here until its last one counts it in failed_by_type.
    retried_by_type: Counter[str] = field(default_factory=Counter)
    duration_s: float = 0.0
    dlq_size: int | None = None
    stopped_by: str = ""  # drained | stop | max_seconds | error
    status: str = "SUCCESS"
    breaker: str = CLOSED
    breaker_opened: int = 0  # times the breaker opened in this run
    batch_size: int = 0  # the claim batch at the end of the run
    round_trips: int = 0
    notifications: int = 0
    woken_by: Counter[str] = field(default_factory=Counter)  # notify | timer | poll
    # Rows claimed right after each kind of wake-up: start, notify, timer, poll, reconnect, busy (following the work).
    claimed_after: Counter[str] = field(default_factory=Counter)
    reconnects: int = 0  # connections (claim/flush or LISTEN) re-established after a transient failure

    @property
    def per_s(self) -> float:
        """Payments settled (DONE or FAILED) per second of the run."""
        return (self.done + self.failed) / self.duration_s if self.duration_s > 0 else 0.0

    def to_summary(self, run_id: str) -> dict[str, Any]:
        """The JSON summary: scanned = claimed, changed = done, unchanged = retried, plus extras."""
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
            "retried_by_type": dict(sorted(self.retried_by_type.items())),
            "lost_claims": self.lost_claims,
            "released": self.released,
            "dlq_size": self.dlq_size,
            "stopped_by": self.stopped_by,
            "per_s": round(self.per_s, 1),
            "breaker": self.breaker,
            "breaker_opened": self.breaker_opened,
            "batch_size": self.batch_size,
            "round_trips": self.round_trips,
            "reconnects": self.reconnects,
        }

