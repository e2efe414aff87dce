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
