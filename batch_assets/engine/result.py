"""Run counters and the sweep's result (JSON summary keys)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import date
from typing import Any

SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
SKIPPED = "SKIPPED"

MISSING_DATA = "missing_data"
INVALID_VALUE = "invalid_value"
DECRYPT_FAILURE = "decrypt_failure"
WRITE_ERROR = "write_error"

FAILURE_KINDS = (MISSING_DATA, INVALID_VALUE, DECRYPT_FAILURE, WRITE_ERROR)
DATA_FAILURES = frozenset({MISSING_DATA, INVALID_VALUE})
"""Expected, per-row and never fatal; every other kind is systemic and feeds the breaker."""


class Counters:
    """Thread-safe run counters; merged once per page, never per row from several threads."""

    __slots__ = ("_lock", "scanned", "changed", "unchanged", "failed", "failed_by_type", "pages", "decrypted",
                 "triggers", "audit_events", "conflicts", "extra", "retries")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.scanned = 0
        self.changed = 0
        self.unchanged = 0
        self.failed = 0
        self.failed_by_type = dict.fromkeys(FAILURE_KINDS, 0)
        self.pages = 0
        self.decrypted = 0
        self.triggers = 0
        self.audit_events = 0
        self.conflicts = 0
        self.extra: dict[str, int] = {}
        self.retries = 0

    def add_retry(self) -> None:
        """One read or write transaction failed for a transient reason and is being retried."""
        with self._lock:
            self.retries += 1

    def merge(self, page: PageCounts, *, page_done: bool = True) -> None:
        """Add a drained page's counts (`page_done=False`: writes that belong to no page of their own)."""
        with self._lock:
            self.scanned += page.scanned
            self.changed += page.changed
            self.unchanged += page.unchanged
            self.failed += page.failed
            for kind, count in page.failed_by_type.items():
                self.failed_by_type[kind] = self.failed_by_type.get(kind, 0) + count
            self.pages += 1 if page_done else 0
            self.decrypted += page.decrypted
            self.triggers += page.triggers
            self.audit_events += page.audit_events
            self.conflicts += page.conflicts
            if page.extra:
                for name, count in page.extra.items():
                    self.extra[name] = self.extra.get(name, 0) + count

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "scanned": self.scanned,
                "changed": self.changed,
                "unchanged": self.unchanged,
                "failed": self.failed,
                "failed_by_type": dict(self.failed_by_type),
                "pages": self.pages,
                "decrypted": self.decrypted,
                "triggers": self.triggers,
                "audit_events": self.audit_events,
                "conflicts": self.conflicts,
                "extra": dict(self.extra),
                "retries": self.retries,
            }


class PageCounts:
    """What one page did; only committed writes are counted as changed."""

    __slots__ = ("scanned", "changed", "unchanged", "failed", "failed_by_type", "decrypted", "triggers",
                 "audit_events", "conflicts", "systemic", "systemic_by_type", "unwritten", "extra", "deferred")

    def __init__(self) -> None:
        self.scanned = 0
        self.changed = 0
        self.unchanged = 0
        self.failed = 0
        self.failed_by_type: dict[str, int] = {}
        self.decrypted = 0
        self.triggers = 0
        self.audit_events = 0
        self.conflicts = 0
        """Rows whose write was not applied because they no longer held what was read (left due)."""
        self.systemic = 0
        self.systemic_by_type: dict[str, int] | None = None
        """The systemic failures by kind (None: none), summing to `systemic`: what the run's warnings count."""
        self.unwritten = 0
        """Rows whose write failed for their own reason (the row keeps its stored state)."""
        self.extra: dict[str, int] | None = None
        """The definition's own counters of committed writes (`WriteCounts.extra`)."""
        self.deferred: list[Any] | None = None
        """The writes of failed rows (RowOutcomes) held back because the page may trip the breaker; written
        once the run is judged not to trip it, never otherwise (a wrong key writes nothing)."""

    def add_extra(self, extra: dict[str, int] | None) -> None:
        if not extra:
            return
        if self.extra is None:
            self.extra = {}
        for name, count in extra.items():
            self.extra[name] = self.extra.get(name, 0) + count

    def fail(self, kind: str, count: int = 1, *, systemic: bool | None = None) -> None:
        self.failed += count
        self.failed_by_type[kind] = self.failed_by_type.get(kind, 0) + count
        if systemic if systemic is not None else kind not in DATA_FAILURES:
            self.systemic += count
            if self.systemic_by_type is None:
                self.systemic_by_type = {}
            self.systemic_by_type[kind] = self.systemic_by_type.get(kind, 0) + count


@dataclass
class SweepResult:
    status: str
    run_id: str
    mode: str
    run_date: date
    scanned: int = 0
    changed: int = 0
    unchanged: int = 0
    failed: int = 0
    failed_by_type: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_KINDS, 0))
    pages: int = 0
    decrypted: int = 0
    triggers: int = 0
    audit_events: int = 0
    conflicts: int = 0
    """Rows another writer changed between this run's read and its write: not written, left due."""
    resumed_from: Any = None
    """Where the range resumed, in the definition's display form (`display_cursor`; "finished" for a range
    that finished earlier in the run's checkpoint generation), or None. Never the raw checkpoint cursor."""
    duration_s: float = 0.0
    stopped_reason: str | None = None
    last_cursor: Any = None
    """The low watermark reached, in the definition's display form (the checkpoint keeps the real cursor)."""
    extra: dict[str, int] = field(default_factory=dict)
    """The definition's own counters (`WriteCounts.extra`), e.g. rows deleted with the changed ones."""
    retries: int = 0
    """Read or write transactions retried after a transient failure."""
    gave_up_on: BaseException | None = None
    """The transient error that outlasted its retries (the run then ended FAILURE), if any."""
    gave_up_after: int = 0
    """How many attempts that transaction made."""

    @property
    def ok(self) -> bool:
        return self.status == SUCCESS

    def to_summary(self) -> dict[str, Any]:
        """The JSON summary (docs/reference/formats.md), plus stopped_reason and last_cursor."""
        return {
            "status": self.status,
            "run_id": self.run_id,
            "mode": self.mode,
            "run_date": self.run_date.isoformat(),
            "scanned": self.scanned,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "failed": self.failed,
            "failed_by_type": dict(self.failed_by_type),
            "pages": self.pages,
            "decrypted": self.decrypted,
            "triggers": self.triggers,
            "audit_events": self.audit_events,
            "conflicts": self.conflicts,
            "resumed_from": self.resumed_from,
            "duration_s": round(self.duration_s, 3),
            "stopped_reason": self.stopped_reason,
            "last_cursor": self.last_cursor,
        }
