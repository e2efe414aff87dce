"""The payment queue on PostgreSQL (CONTRACT §7): enqueue, claim, complete, retry, DLQ.

Every function opens its own short transaction; nothing here holds a transaction while a
payment is processed. Writes after a claim are fenced by the claim token (see `sql.py`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from batch_assets.domains.payments import sql
from batch_assets.domains.payments.seed import copy_payments
from batch_assets.errors import ConfigError
from batch_assets.knobs import build_settings, check_positive_fields

log = logging.getLogger(__name__)

STATUSES = ("NEW", "PROCESSING", "DONE", "FAILED")
ERROR_MAX_CHARS = 500
_REPLAY_BATCH = 1000
_NIL_UUID = uuid.UUID(int=0)


@dataclass(frozen=True)
class QueueSettings:
    """Queue and worker knobs; 0 or None means the documented default (use `build`)."""

    batch_size: int = 50  # rows per claim
    concurrency: int = 8  # handler calls in flight
    claim_lease_s: float = 300  # claimed_until = now() + lease; a lapsed claim is claimed again
    max_attempts: int = 5  # a retriable failure on this attempt is terminal (FAILED)
    backoff_base_s: float = 60  # delay after attempt k = base * 2^(k-1), capped
    backoff_max_s: float = 3600
    http_timeout_s: float = 10  # per handler call
    poll_interval_s: float = 1.0  # idle wait when nothing is due (drain=False)

    def __post_init__(self) -> None:
        check_positive_fields(self)
        if self.batch_size > 10_000:
            raise ConfigError(f"must be <= 10000, got {self.batch_size}", field="batch_size")
        if self.concurrency > 256:
            raise ConfigError(f"must be <= 256, got {self.concurrency}", field="concurrency")
        if self.backoff_max_s < self.backoff_base_s:
            raise ConfigError("must be >= backoff_base_s", field="backoff_max_s")
        # A claim must outlive the call that works on it, or a slow call loses its row.
        if self.claim_lease_s <= self.http_timeout_s:
            raise ConfigError(
                f"must be > http_timeout_s ({self.http_timeout_s}), got {self.claim_lease_s}", field="claim_lease_s"
            )

    @classmethod
    def build(cls, **overrides: Any) -> QueueSettings:
        """Settings from keyword overrides; a value of 0 or None takes the default; unknown names are errors."""
        return build_settings(cls, overrides)

    def backoff_s(self, attempts: int) -> float:
        """Delay before the next attempt after `attempts` tries: base * 2^(attempts-1), capped at backoff_max_s."""
        exponent = max(attempts - 1, 0)
        if exponent >= 64:
            return float(self.backoff_max_s)
        return float(min(self.backoff_base_s * (2**exponent), self.backoff_max_s))


@dataclass(frozen=True)
class Claim:
    """One claimed payment: what the handler needs plus the token that fences later writes."""

    id: uuid.UUID
    amount_cents: int
    attempts: int
    token: uuid.UUID


class ReplayCount(int):
    """Number of payments replayed; `.unknown` are ids with no payment, `.not_failed` ids not in FAILED."""

    unknown: tuple[uuid.UUID, ...]
    not_failed: tuple[uuid.UUID, ...]

    def __new__(
        cls, count: int, unknown: Sequence[uuid.UUID] = (), not_failed: Sequence[uuid.UUID] = ()
    ) -> ReplayCount:
        obj = super().__new__(cls, count)
        obj.unknown = tuple(unknown)
        obj.not_failed = tuple(not_failed)
        return obj


def enqueue(
    engine: sa.Engine, count: int, *, seed: int | None = None, amount_range: tuple[int, int] = (100, 100_000)
) -> int:
    """Insert `count` NEW payments, due now, with COPY; deterministic ids and amounts under `seed`."""
    return copy_payments(engine, count, seed=seed, amount_range=amount_range)


def claim(engine: sa.Engine, n: int, lease_s: float) -> list[Claim]:
    """Claim up to `n` due payments (NEW and due, or PROCESSING with a lapsed lease) in one statement."""
    if n <= 0:
        return []
    token = uuid.uuid4()
    with engine.begin() as conn:
        rows = conn.execute(sql.CLAIM, {"n": int(n), "lease_s": float(lease_s), "token": token}).all()
    return [Claim(id=r.id, amount_cents=int(r.amount_cents), attempts=int(r.attempts), token=token) for r in rows]


def complete(engine: sa.Engine, claim: Claim) -> bool:
    """Mark the claimed payment DONE; False when the claim was lost (nothing written)."""
    with engine.begin() as conn:
        return conn.execute(sql.COMPLETE, {"id": claim.id, "token": claim.token}).rowcount == 1


def retry_or_fail(engine: sa.Engine, claim: Claim, error: str, settings: QueueSettings, permanent: bool) -> str | None:
    """Schedule a retry with backoff (→ 'NEW') or, when permanent or at max attempts, fail (→ 'FAILED').

    Returns the status written, or None when the claim was lost (nothing written).
    """
    error = _clip(error)
    with engine.begin() as conn:
        if permanent or claim.attempts >= settings.max_attempts:
            written = conn.execute(sql.FAIL, {"id": claim.id, "token": claim.token, "error": error}).rowcount
            return "FAILED" if written == 1 else None
        params = {"id": claim.id, "token": claim.token, "error": error, "delay_s": settings.backoff_s(claim.attempts)}
        written = conn.execute(sql.RETRY, params).rowcount
        return "NEW" if written == 1 else None


def release(engine: sa.Engine, claim: Claim) -> bool:
    """Give back a claim that was never processed (NEW again, attempt undone); False when lost."""
    with engine.begin() as conn:
        return conn.execute(sql.RELEASE, {"id": claim.id, "token": claim.token}).rowcount == 1


def dlq_list(engine: sa.Engine, limit: int = 100, *, after_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
    """FAILED payments in id order (at most `limit`, after `after_id`): id, amount_cents, attempts, last_error, …"""
    with engine.connect() as conn:
        rows = conn.execute(sql.DLQ_LIST, {"after_id": after_id or _NIL_UUID, "limit": int(limit)}).mappings().all()
    return [dict(r) for r in rows]


def dlq_size(engine: sa.Engine) -> int:
    """Number of FAILED payments."""
    with engine.connect() as conn:
        return int(conn.execute(sql.DLQ_COUNT).scalar_one())


def dlq_replay(engine: sa.Engine, ids: Sequence[uuid.UUID | str] | None) -> int:
    """FAILED → NEW (attempts 0, due now) for `ids`, or every FAILED row when None; returns a `ReplayCount`.

    last_error is kept as the reason the payment was dead-lettered until its next attempt
    overwrites it. Ids that are unknown or not FAILED are skipped and reported on the result.
    """
    if ids is None:
        total = 0
        while True:
            with engine.begin() as conn:
                n = len(conn.execute(sql.DLQ_REPLAY_BATCH, {"limit": _REPLAY_BATCH}).all())
            total += n
            if n < _REPLAY_BATCH:
                return ReplayCount(total)
    wanted = list(dict.fromkeys(_as_uuid(i) for i in ids))
    if not wanted:
        return ReplayCount(0)
    with engine.begin() as conn:
        replayed = {r.id for r in conn.execute(sql.DLQ_REPLAY_IDS, {"ids": wanted})}
        skipped = [i for i in wanted if i not in replayed]
        present = {r.id for r in conn.execute(sql.STATUS_OF, {"ids": skipped})} if skipped else set()
    unknown = [i for i in skipped if i not in present]
    not_failed = [i for i in skipped if i in present]
    if skipped:
        log.warning(
            "dlq replay skipped %d id(s): %d unknown, %d not FAILED", len(skipped), len(unknown), len(not_failed)
        )
    return ReplayCount(len(replayed), unknown, not_failed)


def queue_stats(engine: sa.Engine) -> dict[str, Any]:
    """Counts by status, due NEW rows, and PROCESSING rows stuck past their claim lease."""
    by_status = dict.fromkeys(STATUSES, 0)
    due = stuck = 0
    with engine.connect() as conn:
        for row in conn.execute(sql.STATS):
            by_status[row.status] = int(row.n)
            due += int(row.due)
            stuck += int(row.stuck)
    return {"by_status": by_status, "total": sum(by_status.values()), "due": due, "stuck_processing": stuck}


def _as_uuid(value: uuid.UUID | str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ConfigError(f"not a payment id: {value!r}", field="ids") from None


def _clip(error: str) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= ERROR_MAX_CHARS else text[: ERROR_MAX_CHARS - 1] + "…"
