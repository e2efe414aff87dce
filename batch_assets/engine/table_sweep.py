# ruff: noqa: S608 — statements are built from quoted identifiers of catalog columns; every value is bound.
"""The sweep a `SweepComponent` declares, as an engine plug-in: statements built from the declared columns.

Row = (key, every other declared column in declaration order, the due column when it is not declared, the columns
`where` names that are not declared). Every identifier in a statement is a quoted column the catalog has
(`components.table`); every value is a bound parameter. `compute(row, run_date)` gets a mapping of the declared
columns and returns a mapping of exactly the `writes` columns:

* `RowFailure(kind)` is the row's own failure: `failed_by_type[kind]`, not systemic, nothing written (with
  `due`, the row stays due); a kind that is not a short lower-case word of letters and `_` (or not a str) is
  counted under `invalid_failure_kind` instead, and its text is never shown;
* any other exception (`SystemExit` included), or a result that is not a mapping of exactly the `writes` columns,
  is `compute_error`, systemic (it feeds the breaker);
* a result whose value does not fit its column's type (an int for a text column, a str for an integer column, a
  datetime for a date column, ...) is `invalid_result`, systemic: never cast on the way in (`Column.python_types`);
* a result equal to what is stored is not written;
* the page write (one statement) applies a row only if every column read still holds the value read; the others
  are conflicts, left as the other writer left them.

`where` selects the rows to read (pages, range bounds, the overdue count) and never takes part in a write
statement: pasted into the write, text that escapes its parentheses could rewrite the write's own fence. The
fence is the values read. The columns of the table that `where` names are read with every page for that reason
(not handed to `compute`), so a row another writer moved out of `where` between the read and the write (its
`status` changed, say) still holds a value other than the one read: a conflict, as before. What `where` reads
elsewhere (a subquery on another table), and a column whose type has no equality (a point), are not fenced: the
row is written from the values its own columns held.

Sensitive columns are compared in SQL only: they never appear in a log line, a cursor, a checkpoint or an
event. Neither does any value of a row: logs name rows by key (or not at all when the key is sensitive), an
exception of `compute` (SystemExit and other BaseExceptions included) by its type only, and a failed read or write
by its SQLSTATE condition and column only (`describe_error`), since PostgreSQL's text may echo the value.
Each `compute` call is bounded (`call_timeout_s`): past it the row is `compute_timeout`, systemic.
"""

from __future__ import annotations

import json
import logging
import operator
from collections.abc import Callable, Mapping, Sequence
from datetime import date
from typing import Any, ClassVar

import sqlalchemy as sa

from batch_assets.engine.definition import UNCHANGED, RowOutcome, SqlReader, Sweep, WriteCounts
from batch_assets.engine.failures import COMPUTE_ERROR, INVALID_FAILURE_KIND, INVALID_RESULT, is_kind
from batch_assets.engine.ranges import CursorRange, key_json, key_value
from batch_assets.engine.table import Column
from batch_assets.engine.table_statements import SweepTarget, statements
from batch_assets.errors import ConfigError, RowFailure, condition_text

log = logging.getLogger("batch_assets.sweep")

NEGATIVE_INFINITY = "-infinity"
class _Reader(SqlReader):
    """What the declared sweep reads; statements built once per sweep (`table_statements.statements`)."""

    def __init__(self, target: SweepTarget, sql: dict[str, sa.TextClause]) -> None:
        self.target = target
        self.sql = sql
        self.show_key = target.key.name not in target.sensitive

    def describe_key(self, key: Any) -> str:
        return str(key) if self.show_key else "(a row whose key is sensitive)"


class FullReader(_Reader):
    """Every row matching `where`, in key order, within a cursor range."""

    ranged = True

    def first_page_sql(self) -> sa.TextClause:
        return self.sql["full_first"]

    def after_page_sql(self) -> sa.TextClause:
        return self.sql["full_after"]

    def page_params(self, cursor: Any, limit: int, cursor_range: CursorRange) -> dict[str, Any]:
        if cursor is None:
            return {"lo": cursor_range.lo, "hi": cursor_range.hi, "limit": limit}
        return {"after": key_value(self.target.kind, cursor), "hi": cursor_range.hi, "limit": limit}

    def cursor_of(self, row: Any) -> Any:
        return key_json(row[0])

    def valid_cursor(self, cursor: Any, cursor_range: CursorRange) -> bool:
        """A key inside the range."""
        try:
            return cursor_range.contains(key_value(self.target.kind, cursor))
        except (ValueError, TypeError):
            return False

    def display_cursor(self, cursor: Any) -> Any:
        return cursor if cursor is None or self.show_key else "(sensitive)"


class DeltaReader(_Reader):
    """The rows that are due (`due` NULL or on or before the run date): in (due, key) order, or in key order when
    the due column is sensitive (a sensitive value is never a cursor)."""

    failed_writes_stay_due = True

    def __init__(self, target: SweepTarget, sql: dict[str, sa.TextClause], run_date: date, due_index: int) -> None:
        super().__init__(target, sql)
        self.run_date = run_date
        self.due_index = due_index
        assert target.due is not None
        self.by_due = target.due.name not in target.sensitive

    def first_page_sql(self) -> sa.TextClause:
        return self.sql["delta_first"]

    def after_page_sql(self) -> sa.TextClause:
        return self.sql["delta_after"]

    def page_params(self, cursor: Any, limit: int, cursor_range: CursorRange) -> dict[str, Any]:
        params: dict[str, Any] = {"run_date": self.run_date, "limit": limit}
        if cursor is not None:
            if self.by_due:
                params["after_date"] = cursor[0]
            params["after"] = key_value(self.target.kind, cursor[-1])
        return params

    def cursor_of(self, row: Any) -> Any:
        key = key_json(row[0])
        if not self.by_due:
            return [key]
        due = row[self.due_index]
        return [NEGATIVE_INFINITY if due is None else due.isoformat(), key]

    def valid_cursor(self, cursor: Any, cursor_range: CursorRange) -> bool:
        """[ISO date on or before the run date, or '-infinity', key], or [key] when ordered by key."""
        try:
            if not isinstance(cursor, list) or len(cursor) != (2 if self.by_due else 1):
                return False
            key_value(self.target.kind, cursor[-1])
            if not self.by_due or cursor[0] == NEGATIVE_INFINITY:
                return True
            return isinstance(cursor[0], str) and date.fromisoformat(cursor[0]) <= self.run_date
        except (ValueError, TypeError):
            return False

    def display_cursor(self, cursor: Any) -> Any:
        """Only the key (never a due date, never a sensitive key)."""
        if cursor is None:
            return None
        if not self.show_key:
            return "(sensitive)"
        return {"after_key": cursor[-1] if isinstance(cursor, list) and cursor else None}


class DeclaredSweep(Sweep):
    """delta (with `due`: rows whose due date is NULL or on or before the run date) | full (cursor ranges)."""

    max_page_size: ClassVar[int] = min(FullReader.max_page_size, DeltaReader.max_page_size)
    """The largest settings.page_size a declared sweep takes: what its readers allow (one page write carries it)."""

    def __init__(self, target: SweepTarget, mode: str, run_date: date) -> None:
        if mode not in target.modes:
            raise ConfigError(f"must be one of {', '.join(target.modes)}, got {mode!r}", field="mode")
        self.name = target.name
        self.target = target
        self.run_date = run_date
        table = target.table
        key = target.key
        others = [table.columns[c] for c in target.columns if c != key.name]
        if target.due is not None and target.due.name not in target.columns:
            others.append(target.due)
        fenced = {key.name, *(c.name for c in others)}
        others.extend(table.columns[c] for c in target.where_columns if c not in fenced)
        self.read: tuple[Column, ...] = (key, *others)
        position = {c.name: i for i, c in enumerate(self.read)}
        self._writes = tuple((name, position[name]) for name in target.writes)
        self._write_set = frozenset(target.writes)
        # The hot path (per row): the declared columns as a dict, the stored values of the writes.
        self._given = _dict_builder(tuple(target.columns), tuple(position[name] for name in target.columns))
        self._stored = _picker(tuple(i for _, i in self._writes))
        self._new = _picker(tuple(target.writes))
        self._n_writes = len(self._write_set)
        self._fits = _type_checker(tuple(table.columns[name].python_types for name in target.writes))
        self._told_types = False
        by_due = target.due is not None and target.due.name not in target.sensitive
        sql = statements(target, self.read, by_due)
        self._sql = sql
        self.reader: _Reader
        if mode == "delta":
            assert target.due is not None
            self.reader = DeltaReader(target, sql, run_date, position[target.due.name])
        else:
            self.reader = FullReader(target, sql)
        self._compute = target.compute
        self.call_timeout_s = target.call_timeout_s

    def describe(self, row: Any) -> str:
        return self.reader.describe_key(row[0])

    def describe_error(self, exc: BaseException) -> str:
        """A failed read or write by its SQLSTATE condition and column only: PostgreSQL's text may echo a value."""
        return condition_text(exc)

    # Computing -------------------------------------------------------------

    def compute(self, row: Any) -> RowOutcome:
        given = self._given(row)
        try:
            result = self._compute(given, self.run_date)
        except RowFailure as failure:
            # The row's own data: counted under its kind, never systemic (like a known bad row). A kind that is no
            # short word may have been built from the row's values: counted under a name of the product's own.
            kind = failure.kind
            return RowOutcome(None, kind if is_kind(kind) else INVALID_FAILURE_KIND, 0, True)
        except BaseException as exc:  # noqa: BLE001 — the team's function (SystemExit too): a defect, systemic
            # Its type only: its message is the team's text and may hold a value. The page's warning counts it.
            log.debug("sweep %s: compute raised %s for %s", self.name, type(exc).__name__, self.describe(row))
            return RowOutcome(None, COMPUTE_ERROR)
        # Exactly the writes: a dict of as many keys that has every one of them (the common case, checked by
        # picking them), else any mapping whose keys are the writes.
        if type(result) is dict and len(result) == self._n_writes:
            try:
                new = self._new(result)
            except KeyError:  # a key that is not a write in place of one that is: not exactly the writes
                return self._not_the_writes(result, row)
        elif isinstance(result, Mapping) and result.keys() == self._write_set:
            new = self._new(result)
        else:
            return self._not_the_writes(result, row)
        if new == self._stored(row):
            return UNCHANGED
        if self._fits is not None and not self._fits(new):
            return self._wrong_type(new)
        return RowOutcome((row, new))

    def _wrong_type(self, new: Sequence[Any]) -> RowOutcome:
        """A result value whose type does not fit its column: invalid_result (told once per sweep, by column and
        type names only)."""
        if not self._told_types:
            self._told_types = True
            columns = self.target.table.columns
            wrong = [(name, columns[name].sql_type, type(value).__name__)
                     for (name, _), value in zip(self._writes, new, strict=True)
                     if value is not None and type(value) not in (columns[name].python_types or (type(value),))]
            log.warning("sweep %s: compute returned %s; counted as %s, nothing written", self.name,
                        ", ".join(f"{kind} for {name} ({sql_type})" for name, sql_type, kind in wrong),
                        INVALID_RESULT)
        return RowOutcome(None, INVALID_RESULT)

    def _not_the_writes(self, result: Any, row: Sequence[Any]) -> RowOutcome:
        """A result that is not exactly the declared writes: compute_error. Logged by the declared names it lacks and
        how many others it had (a key of the team's result is the team's text: it may hold a value)."""
        if isinstance(result, Mapping):
            keys = set(result.keys())
            got = f"missing {sorted(self._write_set - keys)}, {len(keys - self._write_set)} other key(s)"
        else:
            got = type(result).__name__
        log.debug("sweep %s: compute must return exactly %s, got %s for %s", self.name,
                  sorted(self._write_set), got, self.describe(row))
        return RowOutcome(None, COMPUTE_ERROR)

    # Writing ---------------------------------------------------------------

    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        params: dict[str, Any] = {"k": [o.change[0][0] for o in changed]}
        for i, column in enumerate(self.read[1:], start=1):
            params[f"o{i}"] = [_param(column, o.change[0][i]) for o in changed]
        for j, (name, _) in enumerate(self._writes):
            column = self.target.table.columns[name]
            params[f"n{j}"] = [_param(column, o.change[1][j]) for o in changed]
        rows, events, conflicts = conn.execute(self._sql["write"], params).one()
        return WriteCounts(int(rows), int(events), conflicts=int(conflicts))


def _dict_builder(names: tuple[str, ...], positions: tuple[int, ...]) -> Callable[[Any], dict[str, Any]]:
    """`lambda row: {names[0]: row[positions[0]], ...}` as a dict display: about 0.3 µs a row less than
    `dict(zip(names, row))` (what a declared sweep's steady state spends around the team's function).

    Generated the way `collections.namedtuple` generates its methods: the source holds only `repr()` of each
    name (a str literal, whatever the name) and integer positions, never a value."""
    body = ", ".join(f"{name!r}: row[{int(i)}]" for name, i in zip(names, positions, strict=True))
    return eval(f"lambda row: {{{body}}}", {"__builtins__": {}})  # noqa: S307 — literals only, see above


def _type_checker(allowed: tuple[frozenset[type] | None, ...]) -> Callable[[Sequence[Any]], bool] | None:
    """`new` → whether each value is NULL or of a Python type its column takes (None: no column is checked).

    An exact type test per value (`type(v) in allowed`): bool is not an int, datetime not a date."""
    checked = tuple((i, types) for i, types in enumerate(allowed) if types is not None)
    if not checked:
        return None
    if len(checked) == 1:
        ((only, types),) = checked
        return lambda new: new[only] is None or type(new[only]) in types

    def fits(new: Sequence[Any]) -> bool:
        for i, types in checked:
            value = new[i]
            if value is not None and type(value) not in types:
                return False
        return True

    return fits


def _picker(keys: tuple[Any, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """`lambda x: tuple(x[k] for k in keys)`, in C (operator.itemgetter; a 1-tuple for one key)."""
    if len(keys) == 1:
        (only,) = keys
        return lambda x: (x[only],)
    return operator.itemgetter(*keys)


def _param(column: Column, value: Any) -> Any:
    """A value as the write statement's array takes it (json travels as its text)."""
    if column.is_json and value is not None:
        return json.dumps(value)
    return value
