"""What a sweep plugs into the engine: queries, compute and a write plan.

Adding a sweep means adding one module with a `SweepDefinition` subclass; the
runner (paging, concurrency, transactions, fallback, breaker, checkpoints)
stays the same. Rows are whatever narrow tuple the definition's queries return.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol

import sqlalchemy as sa

from batch_assets.db.engine import is_transient
from batch_assets.engine.result import WRITE_ERROR
from batch_assets.engine.settings import MAX_PAGE_SIZE
from batch_assets.errors import ConfigError

Row = Any
Cursor = Any
"""A JSON-able position in the key order (the low watermark that is checkpointed)."""

UUID_MIN = uuid.UUID("00000000-0000-0000-0000-000000000000")
UUID_MAX = uuid.UUID("ffffffff-ffff-ffff-ffff-ffffffffffff")


@dataclass(frozen=True)
class CursorRange:
    """An inclusive UUID key range [lo, hi]; always bound (the whole space is lo=0…0, hi=f…f)."""

    lo: uuid.UUID = UUID_MIN
    hi: uuid.UUID = UUID_MAX

    def __post_init__(self) -> None:
        if self.lo > self.hi:
            raise ConfigError("lo must not be greater than hi", field="cursor_range")

    @classmethod
    def parse(cls, lo: str | uuid.UUID, hi: str | uuid.UUID) -> CursorRange:
        try:
            return cls(uuid.UUID(str(lo)), uuid.UUID(str(hi)))
        except ValueError:
            raise ConfigError("bounds must be UUIDs", field="cursor_range") from None

    @property
    def is_full(self) -> bool:
        return self.lo == UUID_MIN and self.hi == UUID_MAX

    @property
    def key(self) -> str:
        """The checkpoint's range_key: 'all' for the whole key space, else 'lo..hi'."""
        return "all" if self.is_full else f"{self.lo}..{self.hi}"


FULL_RANGE = CursorRange()


@dataclass(frozen=True)
class RunContext:
    """Fixed once per run and passed everywhere (the run date is never re-read from the clock)."""

    run_id: str
    mode: str
    run_date: date
    fingerprint: str | None = None
    """What the checkpoint must match to be resumed (e.g. the rules' fingerprint)."""


class RowOutcome:
    """The computed result of one row.

    `change` is the definition's own write payload (None when nothing is to be
    written); `failure` is a failure kind or None. A failed row may still carry a
    `change` when the definition must keep it due (e.g. clear a future date, record
    the kind); the runner holds such writes back while the page may trip the breaker.
    """

    __slots__ = ("change", "failure", "decrypted", "known")

    def __init__(
        self,
        change: Any = None,
        failure: str | None = None,
        decrypted: int = 0,
        known: bool = False,
    ) -> None:
        self.change = change
        self.failure = failure
        self.decrypted = decrypted
        self.known = known
        """The row failed the same way on its previous evaluation: counted, but not as systemic."""


UNCHANGED = RowOutcome()
"""The shared outcome of a row that needs no write (no decrypt happened)."""


class WriteCounts:
    """What a committed write did; `extra` holds the definition's own counters (summed into the result).

    `conflicts`: rows of the write that were not applied because they no longer held what was read
    (another writer changed them since the read; CONTRACT §3). They are left as the other writer left
    them (due), counted apart from `rows`, never as unchanged. `triggers`: side-effect rows written by
    the same statement (e.g. review triggers conditioned on the same check).
    """

    __slots__ = ("rows", "audit_events", "extra", "conflicts", "triggers")

    def __init__(self, rows: int = 0, audit_events: int = 0, extra: dict[str, int] | None = None,
                 conflicts: int = 0, triggers: int = 0) -> None:
        self.rows = rows
        self.audit_events = audit_events
        self.extra = extra
        self.conflicts = conflicts
        self.triggers = triggers


class WritePlan(ABC):
    """How a sweep writes; the runner owns the transactions around these calls."""

    @abstractmethod
    def write_side_effects(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> int:
        """Write side effects that must survive a failed page (review triggers), idempotently.

        Called in a short transaction of its own, BEFORE the page write, so a
        failure after it leaves the difference visible and the next run redoes
        it. Returns how many were newly written; issues no statement when there
        is nothing to write.
        """

    @abstractmethod
    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        """The page's data, its bookkeeping stamp and its outbox events, in bulk, inside the page transaction.

        A row is written only if every column read still holds the value read (CONTRACT §3); the
        others are counted in `conflicts`. `rows` counts rows written whose outcome is a success
        (not a failure kept due).
        """

    def needs_side_effects(self, changed: Sequence[RowOutcome]) -> bool:
        """Whether `write_side_effects` has anything to write (else its transaction is skipped)."""
        return True

    def write_row(self, conn: sa.Connection, outcome: RowOutcome) -> WriteCounts:
        """One row of the per-row fallback, inside its own short transaction."""
        return self.write_page(conn, (outcome,))

    def write_retryable(self, exc: BaseException) -> bool:
        """Whether a write transaction that failed with `exc` is run again as it is, on a fresh connection.

        If not, a failed page write falls back to one transaction per row, and a failed row write fails
        the row (`write_failure_kind`). Default: every transient failure (connection, server, timeout).
        """
        return is_transient(exc)

    def write_failure_kind(self, exc: BaseException) -> str:
        """The failure kind counted for a row whose own write failed with `exc`."""
        return WRITE_ERROR

    records_write_failures: bool = False
    """True when `record_write_failure` writes something (else no transaction is opened for it)."""

    def record_write_failure(self, conn: sa.Connection, outcome: RowOutcome, exc: BaseException) -> Any:
        """Record a row's failed write, in a short transaction of its own after the failed one rolled back.

        Only called when `records_write_failures`. Its return value goes to `failure_recorded` once the
        transaction committed. If it fails for its own reason, the row simply keeps its stored state.
        """
        return None

    def failure_recorded(self, outcome: RowOutcome, recorded: Any) -> None:
        """Called after `record_write_failure`'s transaction committed, with what it returned."""
        return None


class SweepDefinition(WritePlan):
    """A sweep: which rows (per mode), how to compute one, how to write the changes."""

    name: str = "sweep"
    modes: tuple[str, ...] = ("delta", "full")
    ranged_modes: tuple[str, ...] = ("full",)
    """Modes that may be restricted to a CursorRange other than the whole key space."""
    uses_pre_check: bool = False
    max_page_size: int = MAX_PAGE_SIZE
    """Upper bound of settings.page_size for this sweep (how many keys one write statement may carry)."""

    @classmethod
    def check_page_size(cls, page_size: int) -> None:
        """ConfigError naming page_size when it exceeds what this sweep's write statement may carry."""
        if page_size > cls.max_page_size:
            raise ConfigError(f"must be at most {cls.max_page_size} for this sweep, got {page_size}",
                              field="page_size")
    failed_writes_stay_due: bool = False
    """True when a row whose write failed is still selected by the next run of this mode (e.g. a delta:
    the row keeps its due date). When False (a full sweep reads every row once), a page with such a row
    never moves the low watermark and the run ends FAILURE, resumable, so the row is not left behind."""

    def __init__(self, mode: str) -> None:
        if mode not in self.modes:
            raise ConfigError(f"must be one of {', '.join(self.modes)}, got {mode!r}", field="mode")
        self.mode = mode

    # Reading ---------------------------------------------------------------

    @abstractmethod
    def first_page_sql(self) -> sa.TextClause:
        """The mode's first-page statement (no cursor): a named `sa.text` of the definition's sql.py."""

    @abstractmethod
    def after_page_sql(self) -> sa.TextClause:
        """The mode's after-cursor statement: a separate statement, never `(:c IS NULL OR ...)`."""

    @abstractmethod
    def page_params(self, cursor: Cursor | None, limit: int, cursor_range: CursorRange) -> dict[str, Any]:
        """Bound parameters of the first (cursor None) or after-cursor statement."""

    @abstractmethod
    def cursor_of(self, row: Row) -> Cursor:
        """The JSON-able keyset position of a row."""

    def read_page(self, conn: sa.Connection, cursor: Cursor | None, limit: int, cursor_range: CursorRange) -> list:
        sql = self.first_page_sql() if cursor is None else self.after_page_sql()
        params = self.page_params(cursor, limit, cursor_range)
        result = conn.execute(sql, params)
        try:
            # Plain driver tuples (not sa.Row): the hot path's row type, ~25% cheaper per row to load.
            return list(result.cursor.fetchall())
        finally:
            result.close()

    # Computing (outside any transaction) -----------------------------------

    def pre_check(self, row: Row) -> bool:
        """Cheap test on the narrow row: True = the row needs the full evaluation."""
        return True

    @abstractmethod
    def compute(self, row: Row) -> RowOutcome:
        """Evaluate one row; never raises for bad data (returns a failure kind instead)."""

    def describe(self, row: Row) -> str:
        """How a row is named in DEBUG logs (an id, never a sensitive value)."""
        return str(self.cursor_of(row))

    # Checkpointed cursors ----------------------------------------------------

    def valid_cursor(self, cursor: Cursor, cursor_range: CursorRange) -> bool:
        """Whether a checkpointed cursor is a position this sweep can resume from inside `cursor_range`.

        A checkpoint is a row other connections can edit: one that is not a key of this sweep's shape,
        or lies past the range's end, is not resumed (the range starts over). Never raises.
        Default: any cursor."""
        return cursor is not None

    def display_cursor(self, cursor: Cursor | None) -> Any:
        """The form of a cursor shown to people (logs, Dagster metadata, run history, the CLI's JSON).

        It must show nothing sensitive (CONTRACT §5: no date derived from a date of birth); the checkpoint
        table keeps the real cursor. Default: the cursor itself."""
        return cursor

    def check_range(self, cursor_range: CursorRange) -> None:
        if not cursor_range.is_full and self.mode not in self.ranged_modes:
            raise ConfigError(f"mode {self.mode!r} runs over the whole key space only", field="cursor_range")


class CheckpointLike(Protocol):
    @property
    def cursor(self) -> Any: ...

    @property
    def finished(self) -> bool:
        """The range finished within the planned run's generation: it is not read again."""


class CheckpointStoreLike(Protocol):
    """What the runner needs of `batch_assets.locking.checkpoint.CheckpointStore`."""

    def load(self, sweep: str, mode: str, range_key: str, fingerprint: str | None) -> CheckpointLike | None: ...

    def save(self, sweep: str, mode: str, range_key: str, *, cursor: Any, fingerprint: str | None, run_id: str,
             run_date: date, counters: dict[str, Any]) -> None: ...

    def complete(self, sweep: str, mode: str, range_key: str) -> None: ...


class RunGuardLike(Protocol):
    """What the runner needs of `batch_assets.locking.guard.RunGuard`."""

    owner: str

    def fence(self, conn: sa.Connection, timeouts: Mapping[str, str] | None = None) -> None:
        """Raise LeaseLost unless still the owner; also SET LOCAL `timeouts` in the same round trip."""

    def alive(self) -> bool: ...
