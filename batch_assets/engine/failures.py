"""What a sweep's failure kinds may be, and the kinds the product itself counts a declared compute's defects under
(one that broke, returned what it may not, or did not return)."""

from __future__ import annotations

import re

KIND_RE = re.compile(r"[a-z][a-z_]{0,39}")
"""A failure kind: a short lower-case word of letters and `_` (it becomes a key of `failed_by_type`). No digits: a
kind built from a row's value (`RowFailure(f"p{points}")`) would make one key per value and carry the value into
the summary, run history, checkpoints and metadata."""

COMPUTE_ERROR = "compute_error"
"""Any other exception of a declared compute (or a result that is not exactly the `writes` columns): systemic."""

INVALID_FAILURE_KIND = "invalid_failure_kind"
"""A `RowFailure` whose kind is not a KIND_RE word (or not a str): still the row's own failure, counted under this
name; its text is never shown anywhere."""

INVALID_RESULT = "invalid_result"
"""A result of exactly the `writes` columns holding a value whose Python type does not fit its column's type (an int
for a text column, a str for an integer column, ...): systemic like compute_error, never cast on the way in."""


def is_kind(kind: object) -> bool:
    """Whether `kind` may be a key of `failed_by_type`."""
    return isinstance(kind, str) and KIND_RE.fullmatch(kind) is not None

COMPUTE_TIMEOUT = "compute_timeout"
"""A compute call that outlasted its bound (`Sweep.call_timeout_s`): the row is not written; systemic, like
compute_error."""
