"""A claimed row and the result written for it; the one-line error text every result carries."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batch_assets.queue.settings import QueueSettings

ERROR_MAX_BYTES = 500
"""last_error as this product writes it: one line of at most this many UTF-8 bytes (`clip`). A result
waiting in the worker's buffer holds its error already clipped, so the buffer is bounded in bytes too."""


@dataclass(frozen=True)
class Claim:
    """One claimed row: its key, attempts (after the claim's increment), the token that fences later
    writes, and the declared columns (`values`) the handler is called with."""

    id: Any
    attempts: int
    token: uuid.UUID
    # The row was PROCESSING under a claim of ours that lapsed (a worker died or hung mid-call), as
    # opposed to NEW, or PROCESSING written by another service: only such a claim may have spent its
    # attempts without an answer ("claim lapsed repeatedly" past max_attempts).
    lapsed: bool = False
    values: Mapping[str, Any] = field(default_factory=dict)


def claims_from_rows(rows: Sequence[Any], token: uuid.UUID, columns: Sequence[str]) -> list[Claim]:
    """Claims from CLAIM / CLAIMED_BY_TOKEN rows (key, attempts, lapsed, *columns)."""
    # Positional (a frozen dataclass's keyword __init__ costs more, once per claimed row); the statements
    # return exactly the declared columns after the first three.
    return [Claim(r[0], int(r[1]), token, bool(r[2]), dict(zip(columns, r[3:])))  # noqa: B905
            for r in rows]


@dataclass(frozen=True)
class Result:
    """One fenced result to write: DONE, FAILED, or NEW (retry after `delay_s`, or given back with `undo`)."""

    claim: Claim
    status: str
    undo: int = 0
    delay_s: float = 0.0
    error: str | None = None


def new_token() -> uuid.UUID:
    """A fresh claim token (one per claim statement)."""
    return uuid.uuid4()


def planned_result(claim: Claim, settings: QueueSettings, permanent: bool, delay_s: float | None = None) -> Result:
    """FAILED when permanent or at max attempts, else NEW after the retry policy's delay (`settings.retry`): the
    backoff of this attempt with jitter, or `delay_s` when the handler asked for one (Retry-After, RetryAfter).

    A call that was made and failed always spends its attempt (docs/guide/payment-queue.md), whatever the breaker.
    A row another service inserted NEW with attempts already at or past the maximum got one call by
    then (a NEW row always does); if that fails transiently it is FAILED with the call's own error.
    """
    policy = settings.retry
    if permanent or policy.is_last(claim.attempts):
        return Result(claim, "FAILED")
    return Result(claim, "NEW", delay_s=policy.delay_s(claim.attempts, delay_s))


def clip(error: object) -> str:
    """One line of at most ERROR_MAX_BYTES UTF-8 bytes (last_error); a longer text ends with '…'.

    Only the first 4 x ERROR_MAX_BYTES characters are looked at, so a huge text costs no more.
    """
    text = " ".join(str(error)[: 4 * ERROR_MAX_BYTES].split())
    raw = text.encode("utf-8", "replace")
    if len(raw) <= ERROR_MAX_BYTES:
        return text
    return raw[: ERROR_MAX_BYTES - 3].decode("utf-8", "ignore") + "…"
