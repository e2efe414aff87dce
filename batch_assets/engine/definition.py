"""The engine's plug-in API: what a sweep must say and the optional hooks it may give.

A sweep is a `Sweep`: a `Reader` (keyset pages; `SqlReader` for two statements and their
parameters), `compute(row)` and `write_page`. Everything else has a default: `write_row`
(a page of one), `describe_error`, `call_timeout_s`, `pre_check`, `side_effects` and
`write_failures` (retry, name, record).
The runner (paging, concurrency, transactions, fallback, breaker, checkpoints) stays the
same. Rows are whatever narrow tuple the reader returns. docs/DESIGN.md shows the seams.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol

import sqlalchemy as sa

from batch_assets.db.engine import is_transient
from batch_assets.engine.ranges import FULL_RANGE, UUID_MAX, UUID_MIN, CursorRange  # noqa: F401 (re-exported)
from batch_assets.engine.result import WRITE_ERROR
from batch_assets.engine.settings import MAX_PAGE_SIZE
from batch_assets.errors import ConfigError, error_text

Row = Any
Cursor = Any
"""A JSON-able position in the key order (the low watermark that is checkpointed)."""


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
    (another writer changed them since the read; docs/reference/tables.md). They are left as the other writer left
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


RowHook = Callable[[Row], bool]
"""A cheap test on the narrow row (the pre-check): False = the row is unchanged and is not computed."""
SideEffects = Callable[[sa.Connection, Sequence[RowOutcome]], int]
"""Side effects that must survive a failed page, written idempotently in a short transaction of their own
BEFORE the page write (so a failure after it leaves the difference visible and the next run redoes it);
returns how many were newly written."""


def check_page_size(page_size: int, maximum: int) -> None:
    """ConfigError naming page_size when it exceeds what a sweep's statements may carry (`Reader.max_page_size`)."""
    if page_size > maximum:
        raise ConfigError(f"must be at most {maximum} for this sweep, got {page_size}", field="page_size")


class Reader(ABC):
    """Which rows a sweep reads, in which key order, one keyset page at a time (outside any transaction).

    Required: `read_page` (or the three statements of `SqlReader`) and `cursor_of`. The rest has defaults.
    """

    ranged: bool = False
    """True when the reader honours a CursorRange other than the whole key space (e.g. a full sweep)."""
    failed_writes_stay_due: bool = False
    """True when a row whose write failed is selected again by the next run with this reader (e.g. a delta:
    the row keeps its due date). When False (a full sweep reads every row once), a page with such a row never
    moves the low watermark and the run ends FAILURE, resumable, so the row is not left behind."""
    max_page_size: int = MAX_PAGE_SIZE
    """Upper bound of settings.page_size for this sweep (how many keys one write statement may carry)."""

    @abstractmethod
    def read_page(self, conn: sa.Connection, cursor: Cursor | None, limit: int, cursor_range: CursorRange) -> list:
        """At most `limit` rows after `cursor` (None: from the range's start), in key order."""

    @abstractmethod
    def cursor_of(self, row: Row) -> Cursor:
        """The JSON-able keyset position of a row."""

    def valid_cursor(self, cursor: Cursor, cursor_range: CursorRange) -> bool:
        """Whether a checkpointed cursor is a position this reader can resume from inside `cursor_range`.

        A checkpoint is a row other connections can edit: one that is not a key of this reader's shape, or
        lies past the range's end, is not resumed (the range starts over). Never raises. Default: any cursor."""
        return cursor is not None

    def display_cursor(self, cursor: Cursor | None) -> Any:
        """The form of a cursor shown to people (logs, Dagster metadata, run history, the CLI's JSON).

        It must show nothing sensitive (no date derived from a date of birth); the checkpoint table keeps the
        cursor in its stored form (`seal_cursor`). Default: the cursor itself."""
        return cursor

    def seal_cursor(self, cursor: Cursor) -> Any:
        """The JSON-able form a cursor is saved in: a cursor that holds a value nobody may read in the checkpoint table
        (a date derived from a date of birth) is encrypted here. Default: the cursor itself."""
        return cursor

    def open_cursor(self, stored: Any) -> Cursor | None:
        """A saved cursor back from `seal_cursor`'s form; None when it cannot be read (the range starts over, as for a
        cursor `valid_cursor` refuses). Never raises. Default: the stored value itself."""
        return stored


class SqlReader(Reader):
    """A reader written as two named `sa.text` statements of the sweep's sql.py and their parameters."""

    @abstractmethod
    def first_page_sql(self) -> sa.TextClause:
        """The first-page statement (no cursor)."""

    @abstractmethod
    def after_page_sql(self) -> sa.TextClause:
        """The after-cursor statement: a separate statement, never `(:c IS NULL OR ...)`."""

    @abstractmethod
    def page_params(self, cursor: Cursor | None, limit: int, cursor_range: CursorRange) -> dict[str, Any]:
        """Bound parameters of the first (cursor None) or after-cursor statement."""

    def read_page(self, conn: sa.Connection, cursor: Cursor | None, limit: int, cursor_range: CursorRange) -> list:
        sql = self.first_page_sql() if cursor is None else self.after_page_sql()
        result = conn.execute(sql, self.page_params(cursor, limit, cursor_range))
        try:
            # Plain driver tuples (not sa.Row): the hot path's row type, ~25% cheaper per row to load.
            return list(result.cursor.fetchall())
        finally:
            result.close()


class WriteFailures:
    """How a sweep's failed writes are treated. The default: a transient failure (connection, server,
    timeout) is retried as it is, a row's own failure is counted as `write_error`, nothing is recorded."""

    def retryable(self, exc: BaseException) -> bool:
        """Whether a write transaction that failed with `exc` is run again as it is, on a fresh connection.

        If not, a failed page write falls back to one transaction per row, and a failed row write fails the
        row (`kind`)."""
        return is_transient(exc)

    def kind(self, exc: BaseException) -> str:
        """The failure kind counted for a row whose own write failed with `exc`."""
        return WRITE_ERROR

    record: Callable[[sa.Connection, RowOutcome, BaseException], Callable[[], None] | None] | None = None
    """Optional: record a row's failed write, in a short transaction of its own after the failed one rolled
    back (None: no transaction is opened). It may return what to do once that transaction committed. If it
    fails for its own reason, the row simply keeps its stored state."""


DEFAULT_WRITE_FAILURES = WriteFailures()


class Sweep(ABC):
    """A sweep plugged into the engine (`engine.runner.run_sweep`): which rows, how one is computed, how the
    changes are written. The runner owns paging, concurrency, transactions, fallback, breaker and checkpoints.

    What a sweep must say (4): `name`, `reader`, `compute`, `write_page`.
    Optional, with defaults: `write_row`, `describe_error`, `call_timeout_s`, and the hooks `pre_check`,
    `side_effects` and `write_failures`; a hook left None costs nothing (the runner never calls it nor opens a
    transaction for it).
    A sweep instance is built for one run: its mode, run date and rules are fixed when it is built.
    """

    name: str
    """The checkpoints', logs' and run history's name of the sweep."""
    reader: Reader

    @abstractmethod
    def compute(self, row: Row) -> RowOutcome:
        """Evaluate one row, outside any transaction; never raises for bad data (returns a failure kind)."""

    @abstractmethod
    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        """The page's data, its bookkeeping stamp and its outbox events, in bulk, inside the page transaction.

        A row is written only if every column read still holds the value read (docs/reference/tables.md); the others are
        counted in `conflicts`. `rows` counts rows written whose outcome is a success (not a failure kept due).
        """

    def write_row(self, conn: sa.Connection, outcome: RowOutcome) -> WriteCounts:
        """One row of the per-row fallback, inside its own short transaction. Default: a page of one."""
        return self.write_page(conn, (outcome,))

    def describe_error(self, exc: BaseException) -> str:
        """One line naming a failed read or write in logs, stop reasons and run history. The database's own text may
        echo a value of the row (`invalid input syntax for type integer: "..."`): a sweep whose rows hold values
        nobody may read shows less. Default: the error's type and first line (`errors.error_text`)."""
        return error_text(exc)

    call_timeout_s: float | None = None
    """The longest one `compute` call may take (s): past it the row is counted `compute_timeout` (systemic) and the
    run goes on without waiting for the call, whose result is never written. None: not bounded (the compute is the
    product's own); `SweepSettings.call_timeout_s` overrides it for a run."""
    pre_check: RowHook | None = None
    side_effects: SideEffects | None = None
    write_failures: WriteFailures = DEFAULT_WRITE_FAILURES


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
