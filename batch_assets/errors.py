"""Every exception of batch_assets: the ones it raises, the exit codes they map to, and the signals a team's
function raises to steer one row (`RowFailure`, `PermanentFailure`, `RetryAfter`).

Kept free of heavy imports: a team's function imports its signals from `batch_assets` at its own import time.
"""

from __future__ import annotations

import math
import re

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SKIPPED = 75


class BatchAssetsError(Exception):
    """Base of every error the product raises on purpose."""

    exit_code = EXIT_FAILED


class ConfigError(BatchAssetsError):
    """Invalid configuration or usage: non-retriable, raised before any read or write."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


PRIVILEGES_DOCS = "docs: production/privileges"
"""Where a refused grant points: the page that lists every grant each job needs."""


class PermissionDenied(ConfigError):
    """The database role lacks a grant: exit 2, one line naming it and the page that lists the grants."""

    def __init__(self, what: str) -> None:
        super().__init__(f"permission denied: {what} ({PRIVILEGES_DOCS})", field="database")


class DatabaseUnavailable(BatchAssetsError):
    """The database cannot be reached; the message is one line naming host and cause."""


class DecryptError(BatchAssetsError):
    """A ciphertext could not be decrypted (wrong key, wrong row, corrupt bytes)."""


class LockNotAcquired(BatchAssetsError):
    """Another run of a conflicting job holds the lock."""

    exit_code = EXIT_SKIPPED


class LockStoreUnavailable(BatchAssetsError):
    """The lock store (PostgreSQL lock table or Redis) cannot be reached."""


class LeaseLost(BatchAssetsError):
    """This run no longer owns its lease; it must stop writing."""



# --- what a team's function raises to steer its row -------------------------------------------------------


class RowFailure(Exception):
    """A sweep's `compute` cannot use this row's own data: counted under `failed_by_type[kind]`, the row not
    written and, with a due column, left due. `kind` is a short lower-case word, e.g. `RowFailure("no_points")`."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class PermanentFailure(Exception):
    """Raised by a queue handler: the row is FAILED at once (no retry). Any other exception is transient."""


class RetryAfter(Exception):
    """Raised by a queue handler: a transient failure, tried again after `seconds` instead of the backoff.

    The attempt is spent as for any transient failure (FAILED at max_attempts); the delay is clamped
    to 0..the queue's `backoff.max_s`. `RetryAfter(30)` or `RetryAfter(30, "quota exhausted")`.
    """

    def __init__(self, seconds: float, message: str = "") -> None:
        try:
            value = float(seconds)
        except (TypeError, ValueError):
            value = math.nan
        # A delay that is not a finite number falls back to the queue's backoff (None).
        self.seconds: float | None = value if math.isfinite(value) else None
        super().__init__(message or f"retry after {seconds}s")


def first_line(text: str) -> str:
    """The first non-empty line of a message, stripped: what goes on one line of stderr or in a summary."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def cause_line(exc: BaseException) -> str:
    """The first line of an error's own message (the driver's error for a SQLAlchemy wrapper), or its type."""
    cause = getattr(exc, "orig", None) or exc
    return first_line(str(cause)) or type(cause).__name__


def condition_text(exc: BaseException) -> str:
    """A database error by its SQLSTATE's condition name and the column PostgreSQL names (`not_null_violation (column
    tier)`), never by its message, which may echo a value of the row (`invalid input syntax for type integer:
    "..."`); any other error by its type name alone."""
    cause = getattr(exc, "orig", None) or exc
    if not getattr(cause, "sqlstate", None):
        return type(cause).__name__
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", type(cause).__name__).lower()  # psycopg: the condition, in CamelCase
    column = getattr(getattr(cause, "diag", None), "column_name", None)
    return f"{name} (column {column})" if column else name


def error_text(exc: BaseException) -> str:
    """`Type: first line` of an error (the driver's own error for SQLAlchemy wrappers); never more than one line."""
    cause = getattr(exc, "orig", None) or exc
    line = first_line(str(cause))
    return f"{type(cause).__name__}: {line}" if line else type(cause).__name__
