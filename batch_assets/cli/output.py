"""What the CLI prints: messages on stderr, the JSON summary as the last line of stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from batch_assets.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SKIPPED,
)

SUMMARY_KEYS = ("status", "run_id", "scanned", "changed", "unchanged", "failed", "failed_by_type", "duration_s")
EXIT_BY_STATUS = {"SUCCESS": EXIT_OK, "FAILURE": EXIT_FAILED, "SKIPPED": EXIT_SKIPPED}


def err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def emit(summary: dict[str, Any]) -> None:
    """Print the summary as the last line of stdout."""
    sys.stdout.flush()
    print(json.dumps(summary, default=str, sort_keys=False), flush=True)


def empty_summary(status: str, error: str | None = None) -> dict[str, Any]:
    from batch_assets.run_history import empty_summary as zero_summary

    return zero_summary(status, None, **({"error": error} if error is not None else {}))


def looks_like_job(argv: Sequence[str]) -> bool:
    """Whether these arguments name a job command (its failure still owes a JSON summary), from the words alone."""
    words = [w for w in argv if not w.startswith("-")]
    return words[:1] == ["sweep"] or words[:2] in (
        ["subscriptions", "expire"], ["queue", "work"], ["outbox", "relay"], ["jobs", "run"], ["retention", "run"]
    )
