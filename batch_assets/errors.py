"""The project's own exceptions, and the exit codes of CONTRACT §2 they map to."""

from __future__ import annotations

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


def first_line(text: str) -> str:
    """The first non-empty line of a message, stripped: what goes on one line of stderr or in a summary."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def cause_line(exc: BaseException) -> str:
    """The first line of an error's own message (the driver's error for a SQLAlchemy wrapper), or its type."""
    cause = getattr(exc, "orig", None) or exc
    return first_line(str(cause)) or type(cause).__name__


def error_text(exc: BaseException) -> str:
    """`Type: first line` of an error (the driver's own error for SQLAlchemy wrappers); never more than one line."""
    cause = getattr(exc, "orig", None) or exc
    line = first_line(str(cause))
    return f"{type(cause).__name__}: {line}" if line else type(cause).__name__
