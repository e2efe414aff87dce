"""The customer-status sweep (docs/reference/rules.md) as a `Sweep` on the engine's plug-in API.

Row = (id, encrypted_dob, age_category, next_review_date, review_failure, dob_bytes): encrypted_dob is
NULL when it is longer than `max_value_bytes` (its length is in dob_bytes), so what a page holds is
bounded by the settings, never by what other services store. Only encrypted_dob is decrypted, at most
once per row; decrypted values never leave this module's memory and are never logged. The rules and
run date are fixed per instance (per run), and evaluations are memoised per plaintext for the run.

Every row another service may write gets a counted, named outcome and a row that cannot be evaluated
is always left due (docs/reference/rules.md): no ciphertext or an empty one is missing_data; one that does not
authenticate under the key and the row's id (too short, corrupt, another row's, another key) is
decrypt_failure; one that decrypts to anything but `YYYY-MM-DD` in ASCII digits, or to a date that does not exist
or lies after the run date, is invalid_value. A value longer than max_value_bytes is never read into a page: the
reader authenticates it a part at a time (OVERSIZED_PART), so it is decrypt_failure or invalid_value like any other
whatever its length, and a page's memory stays bounded.
"""

from __future__ import annotations

import base64
import json
import operator
import re
import uuid
from collections.abc import Sequence
from datetime import date
from typing import Any, Literal, get_args

import sqlalchemy as sa

from batch_assets import (
    DECRYPT_FAILURE,
    INVALID_VALUE,
    MISSING_DATA,
    ConfigError,
    CursorRange,
    DecryptError,
    RowOutcome,
    SqlReader,
    Sweep,
    WriteCounts,
)
from batch_assets.reference.customer_status import sql
from batch_assets.reference.customer_status.crypto import NONCE_BYTES, TAG_BYTES, DobCipher
from batch_assets.reference.customer_status.rules import Rules, evaluate, needs_evaluation, parse_dob

SWEEP_NAME = "customer_status"
Mode = Literal["delta", "full", "config-change"]
"""The sweep's modes: the one definition (the settings model's field type, the launchpad Enum, the CLI choices)."""
MODES: tuple[str, ...] = get_args(Mode)
NEGATIVE_INFINITY = "-infinity"
MAX_MEMO = 100_000
"""Bound of the per-run evaluation memo (distinct dates of birth); cleared when exceeded."""
MAX_VALUE_BYTES = 1024
"""Default bound of an encrypted_dob the reads return (a valid one is 12 + 10 + 16 = 38 bytes); a longer
value is not read into the page, only its length, and is authenticated a part at a time. A page holds at most
page_size × max_value_bytes of ciphertext."""
OVERSIZED_PART_BYTES = 1_048_576
"""How much of a value too long to read is held at once while it is authenticated."""
VALID_CIPHERTEXT_BYTES = 38
SEALED_PREFIX = "v1."
"""A delta checkpoint's cursor as stored: `v1.` + base64url of the sealed JSON (see DeltaReader)."""
CURSOR_ASSOCIATED_DATA = b"batch_assets/customer_status/delta_cursor/v1"
"""The associated data of a sealed delta cursor: fixed, and longer than an id, so it never opens as a date of birth."""

_INVALID = ("", None, None)
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


class AuthenticLong:
    """In place of an encrypted_dob too long to read (a page's memory stays bounded) that authenticates under the key
    and its row's id: its plaintext, of that length, is not a date (invalid_value). One too long that does not
    authenticate stays None with its length (decrypt_failure)."""

    __slots__ = ()


AUTHENTIC_LONG = AuthenticLong()
_BLOB = operator.itemgetter(1)


class _CustomerReader(SqlReader):
    """What both readers share: the page as read, then each value too long to read judged part by part."""

    def __init__(self, max_value_bytes: int, cipher: DobCipher) -> None:
        self.max_value_bytes = max_value_bytes
        self.cipher = cipher

    def read_page(self, conn: sa.Connection, cursor: Any, limit: int, cursor_range: CursorRange) -> list:
        rows = super().read_page(conn, cursor, limit, cursor_range)
        if None in map(_BLOB, rows):  # in C; only a page with a NULL or a value too long to read looks further
            for index, row in enumerate(rows):
                if row[1] is None and row[5] is not None and self._authenticates(conn, row):
                    rows[index] = (row[0], AUTHENTIC_LONG, *row[2:])
        return rows

    def _authenticates(self, conn: sa.Connection, row: Any) -> bool:
        """Whether a value too long to read authenticates, read OVERSIZED_PART_BYTES at a time (False when it changed
        since the page's read: the write's comparison of its length then finds the change)."""
        customer_id, size = row[0], int(row[5])

        def part(start: int, length: int) -> bytes:
            value = conn.execute(sql.OVERSIZED_PART, {"id": customer_id, "size": size, "start": start,
                                                      "length": length}).scalar()
            if value is None:
                raise _Changed
            return bytes(value)

        body_end = size - TAG_BYTES  # the body is bytes NONCE_BYTES + 1 .. body_end (1-based)
        body = (part(start, min(OVERSIZED_PART_BYTES, body_end - start + 1))
                for start in range(NONCE_BYTES + 1, body_end + 1, OVERSIZED_PART_BYTES))
        try:
            return self.cipher.authenticates(customer_id, part(1, NONCE_BYTES), part(body_end + 1, TAG_BYTES), body)
        except _Changed:
            return False


class _Changed(Exception):
    """A value too long to read was edited while it was being authenticated."""


class DeltaReader(_CustomerReader):
    """delta: ACTIVE rows due on the run date (next_review_date <= run date or NULL), in (date, id) order.

    Its cursor's date is a stored next_review_date, derived from a date of birth: the checkpoint keeps the cursor
    sealed (AES-256-GCM under the sweep's key, `CURSOR_ASSOCIATED_DATA`), so no date can be read from it."""

    # A delta row whose write failed keeps its stored (due) date, so tomorrow's delta retries it.
    failed_writes_stay_due = True

    def __init__(self, run_date: date, max_value_bytes: int, cipher: DobCipher) -> None:
        super().__init__(max_value_bytes, cipher)
        self.run_date = run_date

    def first_page_sql(self) -> sa.TextClause:
        return sql.DELTA_FIRST_PAGE

    def after_page_sql(self) -> sa.TextClause:
        return sql.DELTA_AFTER_PAGE

    def page_params(self, cursor: Any, limit: int, cursor_range: CursorRange) -> dict[str, Any]:
        params: dict[str, Any] = {"run_date": self.run_date, "limit": limit, "max_value_bytes": self.max_value_bytes}
        if cursor is not None:
            params["after_date"], after_id = cursor
            params["after_id"] = uuid.UUID(after_id)
        return params

    def cursor_of(self, row: Any) -> Any:
        return [NEGATIVE_INFINITY if row[3] is None else row[3].isoformat(), str(row[0])]

    def valid_cursor(self, cursor: Any, cursor_range: CursorRange) -> bool:
        """[ISO date on or before the run date, or '-infinity'; an id]."""
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
        """A delta cursor's date is the stored next_review_date, derived from the date of birth: only its id is
        shown ({"after_id": id})."""
        if cursor is None:
            return None
        return {"after_id": str(cursor[-1]) if isinstance(cursor, list) and cursor else None}

    def seal_cursor(self, cursor: Any) -> Any:
        """`v1.` + base64url(nonce ‖ AES-256-GCM(the cursor's JSON)): what the checkpoint table keeps."""
        sealed = self.cipher.seal(json.dumps(cursor, separators=(",", ":")).encode(), CURSOR_ASSOCIATED_DATA)
        return SEALED_PREFIX + base64.urlsafe_b64encode(sealed).decode("ascii").rstrip("=")

    def open_cursor(self, stored: Any) -> Any:
        """The sealed cursor, or a cursor in clear as the previous release saved it (resumed once: the next save seals
        it); None when it cannot be read (another key, altered): the range starts over."""
        if isinstance(stored, list):
            return stored
        if not isinstance(stored, str) or not stored.startswith(SEALED_PREFIX):
            return None
        text = stored[len(SEALED_PREFIX):]
        try:
            sealed = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            return json.loads(self.cipher.unseal(sealed, CURSOR_ASSOCIATED_DATA))
        except (DecryptError, ValueError):  # binascii.Error and JSONDecodeError are ValueErrors
            return None


class FullReader(_CustomerReader):
    """full / config-change: every ACTIVE row of a UUID cursor range, in id order (an id is shown as it is)."""

    ranged = True
    # failed_writes_stay_due stays False: a full row may hold a date that is not due, so the run must not pass it.

    def first_page_sql(self) -> sa.TextClause:
        return sql.FULL_FIRST_PAGE

    def after_page_sql(self) -> sa.TextClause:
        return sql.FULL_AFTER_PAGE

    def page_params(self, cursor: Any, limit: int, cursor_range: CursorRange) -> dict[str, Any]:
        if cursor is None:
            return {"lo": cursor_range.lo, "hi": cursor_range.hi, "limit": limit,
                    "max_value_bytes": self.max_value_bytes}
        return {"after": uuid.UUID(cursor), "hi": cursor_range.hi, "limit": limit,
                "max_value_bytes": self.max_value_bytes}

    def cursor_of(self, row: Any) -> Any:
        return str(row[0])

    def valid_cursor(self, cursor: Any, cursor_range: CursorRange) -> bool:
        """An id inside the range."""
        key = _uuid(cursor)
        return key is not None and cursor_range.lo <= key <= cursor_range.hi


class CustomerStatusSweep(Sweep):
    """delta | full | config-change over ACTIVE customers. Hooks: the config-change pre-check; review triggers
    and outbox events are written by the page write itself (no side-effect transaction)."""

    name = SWEEP_NAME

    def __init__(
        self,
        mode: str,
        *,
        cipher: DobCipher,
        run_date: date,
        rules: Rules,
        previous_rules: Rules | None = None,
        max_value_bytes: int = MAX_VALUE_BYTES,
    ) -> None:
        if not VALID_CIPHERTEXT_BYTES <= max_value_bytes <= 1_048_576:
            raise ConfigError(f"must be between {VALID_CIPHERTEXT_BYTES} and 1048576, got {max_value_bytes}",
                              field="max_value_bytes")
        self.mode = mode
        self.max_value_bytes = max_value_bytes
        self.run_date = run_date
        self.rules = rules
        self.previous_rules = previous_rules
        self.reader = (DeltaReader(run_date, max_value_bytes, cipher) if mode == "delta"
                       else FullReader(max_value_bytes, cipher))
        # config-change skips the decrypt of rows the rule change cannot affect.
        if mode == "config-change" and previous_rules is not None:
            self.pre_check = self._affected
        self._decrypt = cipher.decrypt
        self._memo: dict[bytes, tuple[str, date | None, date | None]] = {}
        self._unchanged_decrypted = RowOutcome(None, None, 1)

    # Computing -------------------------------------------------------------

    def _affected(self, row: Any) -> bool:
        """The pre-check of config-change: False = the rule change cannot affect this row (not decrypted)."""
        if row[4] is not None:
            return True  # failed last time: always evaluate again
        return needs_evaluation(row[2], row[3], self.run_date, self.previous_rules, self.rules)

    def compute(self, row: Any) -> RowOutcome:
        customer_id, blob, category, next_review, stored_failure, _size = row
        if blob is None:
            # No ciphertext (size NULL), or one too long to read that does not authenticate (size set; the reader
            # judged it part by part).
            return self._failed(MISSING_DATA, row, 0) if _size is None else self._failed(DECRYPT_FAILURE, row, 1)
        if blob is AUTHENTIC_LONG:  # it decrypts, to a plaintext far longer than a date
            return self._failed(INVALID_VALUE, (customer_id, None, *row[2:]), 1)
        if not blob:
            return self._failed(MISSING_DATA, row, 0)  # an empty ciphertext: "unknown", not a key problem
        try:
            plain = self._decrypt(customer_id, blob)
        except DecryptError:
            return self._failed(DECRYPT_FAILURE, row, 1)
        result = self._memo.get(plain)
        if result is None:
            result = self._evaluate(plain)
        new_category, new_review, since = result
        if new_review is None:
            return self._failed(INVALID_VALUE, row, 1)
        if new_category == category and new_review == next_review and stored_failure is None:
            return self._unchanged_decrypted
        trigger_since = since if category is not None and category != new_category else None
        return RowOutcome(_change(row, new_category, new_review, None, trigger_since), None, 1)

    def _evaluate(self, plain: bytes) -> tuple[str, date | None, date | None]:
        result: tuple[str, date | None, date | None]
        try:
            # parse_dob accepts exactly YYYY-MM-DD in ASCII digits; other bytes never reach it as text.
            dob = parse_dob(plain.decode("ascii"))
            if dob > self.run_date:
                result = _INVALID
            else:
                evaluation = evaluate(dob, self.run_date, self.rules)
                result = (evaluation.category, evaluation.next_review_date, evaluation.category_since)
        except (ValueError, OverflowError):  # UnicodeDecodeError is a ValueError
            result = _INVALID
        if len(self._memo) >= MAX_MEMO:
            self._memo.clear()
        self._memo[plain] = result
        return result

    def _failed(self, kind: str, row: Any, decrypted: int) -> RowOutcome:
        # A row that cannot be evaluated keeps its category and is always left due, whatever the kind
        # (docs/reference/rules.md): a future date left by an earlier run is cleared. A wrong key writes nothing all
        # the same: the runner drops the failures of a page that may trip the breaker. The failure kind
        # is recorded in review_failure, so the same failure next time is known and does not feed the
        # breaker; a row already marked with this kind and still due costs no write.
        _id, _blob, category, next_review, stored_failure, _size = row
        known = stored_failure == kind
        new_review = next_review if next_review is None or next_review <= self.run_date else None
        if known and new_review == next_review:
            return RowOutcome(None, kind, decrypted, known)
        return RowOutcome(_change(row, category, new_review, kind, None), kind, decrypted, known)

    # Writing ---------------------------------------------------------------
    # Review triggers are written by WRITE_PAGE itself, from the rows it updated: a trigger exists exactly
    # when its row's change committed, so a row edited since the read gets none (no side_effects hook).

    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        changes = [o.change for o in changed]
        params: dict[str, Any] = {name: [c[i] for c in changes] for i, name in _WRITE_ARRAYS}
        # The values read go back as one bytea and their offsets: WRITE_PAGE compares each row's whole value.
        offsets: list[int | None] = []
        position = 1
        for change in changes:
            blob = change[1]
            offsets.append(None if blob is None else position)
            position += 0 if blob is None else len(blob)
        params["old_offsets"] = offsets
        params["old_dobs"] = b"".join(c[1] for c in changes if c[1] is not None)
        rows, events, triggers, conflicts = conn.execute(sql.WRITE_PAGE, params).one()
        return WriteCounts(int(rows), int(events), conflicts=int(conflicts), triggers=int(triggers))


def _uuid(value: Any) -> uuid.UUID | None:
    """`value` as a UUID if it is a string holding one, else None."""
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


_WRITE_ARRAYS = tuple((i, name) for i, name in enumerate(
    ("ids", None, "old_lengths", "old_categories", "old_dates", "old_failures", "new_categories", "new_dates",
     "failures", "trigger_dates")) if name is not None)
"""WRITE_PAGE's array parameters by their place in a change tuple (`_change`); the values read (place 1) go as
one bytea (`old_dobs`, `old_offsets`)."""


def _change(row: Any, new_category: str | None, new_review: date | None, failure: str | None,
            trigger_date: date | None) -> tuple:
    """A change tuple: what was read (every column WRITE_PAGE compares) and what to write."""
    customer_id, blob, category, next_review, stored_failure, size = row
    return (customer_id, blob, size, category, next_review, stored_failure, new_category, new_review, failure,
            trigger_date)
