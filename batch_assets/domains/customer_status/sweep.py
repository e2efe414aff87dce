"""The customer-status sweep (CONTRACT §5) as a SweepDefinition plug-in.

Row = (id, encrypted_dob, age_category, next_review_date, review_failure). Only encrypted_dob is
decrypted, at most once per row; decrypted values never leave this module's
memory and are never logged. The rules and run date are fixed per instance
(per run), and evaluations are memoised per date-of-birth text for the run.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from datetime import date
from typing import Any

import sqlalchemy as sa

from batch_assets.crypto import DobCipher
from batch_assets.domains.customer_status import sql
from batch_assets.domains.customer_status.rules import Rules, evaluate, needs_evaluation, parse_dob
from batch_assets.engine.definition import CursorRange, RowOutcome, SweepDefinition, WriteCounts
from batch_assets.engine.result import DATA_FAILURES, DECRYPT_FAILURE, INVALID_VALUE, MISSING_DATA
from batch_assets.errors import DecryptError

SWEEP_NAME = "customer_status"
MODES = ("delta", "full", "config-change")
NEGATIVE_INFINITY = "-infinity"
MAX_MEMO = 100_000
"""Bound of the per-run evaluation memo (distinct dates of birth); cleared when exceeded."""

_INVALID = ("", None, None)
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


class CustomerStatusSweep(SweepDefinition):
    """delta | full | config-change over ACTIVE customers."""

    name = SWEEP_NAME
    modes = MODES
    ranged_modes = ("full", "config-change")

    def __init__(
        self,
        mode: str,
        *,
        cipher: DobCipher,
        run_date: date,
        rules: Rules,
        previous_rules: Rules | None = None,
    ) -> None:
        super().__init__(mode)
        self.run_date = run_date
        self.rules = rules
        self.previous_rules = previous_rules
        # config-change skips the decrypt of rows the rule change cannot affect.
        self.uses_pre_check = mode == "config-change" and previous_rules is not None
        # A delta row whose write failed keeps its stored (due) date, so tomorrow's delta retries it; a
        # full or config-change row may hold a date that is not due, so the run must not pass it.
        self.failed_writes_stay_due = mode == "delta"
        self._decrypt = cipher.decrypt_text
        self._memo: dict[str, tuple[str, date | None, date | None]] = {}
        self._unchanged_decrypted = RowOutcome(None, None, 1)

    # Reading ---------------------------------------------------------------

    def first_page_sql(self) -> sa.TextClause:
        return sql.DELTA_FIRST_PAGE if self.mode == "delta" else sql.FULL_FIRST_PAGE

    def after_page_sql(self) -> sa.TextClause:
        return sql.DELTA_AFTER_PAGE if self.mode == "delta" else sql.FULL_AFTER_PAGE

    def page_params(self, cursor: Any, limit: int, cursor_range: CursorRange) -> dict[str, Any]:
        if self.mode == "delta":
            params: dict[str, Any] = {"run_date": self.run_date, "limit": limit}
            if cursor is not None:
                params["after_date"], after_id = cursor
                params["after_id"] = uuid.UUID(after_id)
            return params
        if cursor is None:
            return {"lo": cursor_range.lo, "hi": cursor_range.hi, "limit": limit}
        return {"after": uuid.UUID(cursor), "hi": cursor_range.hi, "limit": limit}

    def cursor_of(self, row: Any) -> Any:
        if self.mode == "delta":
            return [NEGATIVE_INFINITY if row[3] is None else row[3].isoformat(), str(row[0])]
        return str(row[0])

    def describe(self, row: Any) -> str:
        return str(row[0])

    def valid_cursor(self, cursor: Any, cursor_range: CursorRange) -> bool:
        """full / config-change: an id inside the range; delta: [ISO date on or before the run date, or
        '-infinity'; an id]."""
        if self.mode != "delta":
            key = _uuid(cursor)
            return key is not None and cursor_range.lo <= key <= cursor_range.hi
        if not isinstance(cursor, list) or len(cursor) != 2 or _uuid(cursor[1]) is None:
            return False
        after = cursor[0]
        if after == NEGATIVE_INFINITY:
            return True
        if not isinstance(after, str) or not _ISO_DATE.fullmatch(after):
            return False
        try:
            return date.fromisoformat(after) <= self.run_date
        except ValueError:
            return False

    def display_cursor(self, cursor: Any) -> Any:
        """A delta cursor's date is the stored next_review_date, derived from the date of birth: only its
        id is shown ({"after_id": id}). A full cursor is an id and is shown as it is."""
        if self.mode == "delta" and cursor is not None:
            return {"after_id": str(cursor[-1]) if isinstance(cursor, list) and cursor else None}
        return cursor

    # Computing -------------------------------------------------------------

    def pre_check(self, row: Any) -> bool:
        if row[4] is not None:
            return True  # failed last time: always evaluate again
        return needs_evaluation(row[2], row[3], self.run_date, self.previous_rules, self.rules)

    def compute(self, row: Any) -> RowOutcome:
        customer_id, blob, category, next_review, stored_failure = row
        if blob is None:
            return self._failed(MISSING_DATA, row, 0)
        try:
            text = self._decrypt(customer_id, blob)
        except DecryptError:
            return self._failed(DECRYPT_FAILURE, row, 1)
        result = self._memo.get(text)
        if result is None:
            result = self._evaluate(text)
        new_category, new_review, since = result
        if new_review is None:
            return self._failed(INVALID_VALUE, row, 1)
        if new_category == category and new_review == next_review and stored_failure is None:
            return self._unchanged_decrypted
        trigger_since = since if category is not None and category != new_category else None
        return RowOutcome(
            (customer_id, category, next_review, new_category, new_review, trigger_since, None), None, 1
        )

    def _evaluate(self, text: str) -> tuple[str, date | None, date | None]:
        result: tuple[str, date | None, date | None]
        try:
            dob = parse_dob(text)
            if dob > self.run_date:
                result = _INVALID
            else:
                evaluation = evaluate(dob, self.run_date, self.rules)
                result = (evaluation.category, evaluation.next_review_date, evaluation.category_since)
        except (ValueError, OverflowError):
            result = _INVALID
        if len(self._memo) >= MAX_MEMO:
            self._memo.clear()
        self._memo[text] = result
        return result

    def _failed(self, kind: str, row: Any, decrypted: int) -> RowOutcome:
        # A row that cannot be evaluated keeps its category and must stay due: a future date left by an
        # earlier run is cleared for data failures (a decrypt failure keeps it: with a wrong key the
        # breaker stops the run before anything is written). The failure kind is recorded in
        # review_failure, so the same failure next time is known and does not feed the breaker; a row
        # already marked with this kind and still due costs no write.
        customer_id, _blob, category, next_review, stored_failure = row
        known = stored_failure == kind
        new_review = next_review
        if kind in DATA_FAILURES and next_review is not None and next_review > self.run_date:
            new_review = None
        if known and new_review == next_review:
            return RowOutcome(None, kind, decrypted, known)
        return RowOutcome((customer_id, category, next_review, category, new_review, None, kind), kind, decrypted,
                          known, record_only=new_review == next_review)

    # Writing ---------------------------------------------------------------

    def needs_side_effects(self, changed: Sequence[RowOutcome]) -> bool:
        return any(o.change[5] is not None for o in changed)

    def write_side_effects(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> int:
        triggers = [o.change for o in changed if o.change[5] is not None]
        if not triggers:
            return 0
        result = conn.execute(
            sql.INSERT_REVIEW_TRIGGERS,
            {
                "customer_ids": [t[0] for t in triggers],
                "from_categories": [t[1] for t in triggers],
                "to_categories": [t[3] for t in triggers],
                "effective_dates": [t[5] for t in triggers],
            },
        )
        return result.rowcount

    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        changes = [o.change for o in changed]
        rows, events = conn.execute(
            sql.WRITE_PAGE,
            {
                "ids": [c[0] for c in changes],
                "old_categories": [c[1] for c in changes],
                "old_dates": [c[2] for c in changes],
                "new_categories": [c[3] for c in changes],
                "new_dates": [c[4] for c in changes],
                "failures": [c[6] for c in changes],
            },
        ).one()
        return WriteCounts(int(rows), int(events))


def _uuid(value: Any) -> uuid.UUID | None:
    """`value` as a UUID if it is a string holding one, else None."""
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None
