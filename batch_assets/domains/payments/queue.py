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
ERROR_MAX_BYTES = 500
"""last_error as this product writes it: one line of at most this many UTF-8 bytes (`clip`). A result
waiting in the worker's buffer holds its error already clipped, so the buffer is bounded in bytes too."""
DLQ_ERROR_CHARS = 500
"""`queue dlq list` reads last_error cut to this many characters: another service may have written any size."""
MAX_AMOUNT_CENTS = 2**53 - 1
"""The largest amount sent: a JSON number beyond 2^53 - 1 is not exact in many parsers (RFC 8259 §6), so
the limits service could check another amount than the one stored."""
_REPLAY_BATCH = 1000
_NIL_UUID = uuid.UUID(int=0)


MAX_BATCH = 1000
"""Upper bound of the adaptive claim batch (and of rows per result statement)."""
MAX_POLL_S = 5.0
"""An idle worker looks at the table at least this often, even without a notification."""
AGING_INTERVAL_S = 60
"""A due payment gains one priority level per this many seconds (fixed by payment_claim_rank, migration 0002)."""
PRIORITY_RANGE = (-32768, 32767)
MAX_DB_OUTAGE_S = 600.0
"""Upper bound of `db_outage_s`: a worker rides out at most 10 minutes without its database, then fails."""
QUEUE_NAME = "payments"


@dataclass(frozen=True)
class QueueSettings:
    """Queue and worker knobs; 0 or None means the documented default (use `build`)."""

    batch_size: int = 50  # first claim batch; adapts within 1..max_batch_size
    max_batch_size: int = MAX_BATCH  # upper bound of the adaptive claim batch, at most 1000
    concurrency: int = 8  # handler calls in flight, at most 256
    claim_lease_s: float = 300  # claimed_until = now() + lease; a lapsed claim is claimed again
    max_attempts: int = 5  # a retriable failure on this attempt is terminal (FAILED)
    backoff_base_s: float = 60  # delay after attempt k = base * 2^(k-1), capped
    backoff_max_s: float = 3600
    http_timeout_s: float = 10  # per handler call
    poll_interval_s: float = MAX_POLL_S  # idle look at the table without a notification, at most 5 s
    flush_delay_s: float = 0.005  # a result waits at most this long for others to share its statement
    breaker_failures: int = 5  # transient failures in a row (distinct payments) that open the breaker
    breaker_cooldown_s: float = 30  # first cool-down; doubles while the outage lasts
    breaker_max_cooldown_s: float = 600
    drain_timeout_s: float = 30  # on stop: calls in flight get this long to finish, then are given back
    # A lost database connection (backend terminated, server restarting) is re-established with
    # backoff for this long from the first failure; then the worker ends FAILURE. At most 600 s.
    db_outage_s: float = 60

    def __post_init__(self) -> None:
        check_positive_fields(self)
        if self.max_batch_size > MAX_BATCH:
            raise ConfigError(f"must be <= {MAX_BATCH}, got {self.max_batch_size}", field="max_batch_size")
        if self.batch_size > self.max_batch_size:
            raise ConfigError(f"must be <= max_batch_size ({self.max_batch_size}), got {self.batch_size}",
                              field="batch_size")
        if self.concurrency > 256:
            raise ConfigError(f"must be <= 256, got {self.concurrency}", field="concurrency")
        if self.poll_interval_s > MAX_POLL_S:
            raise ConfigError(f"must be <= {MAX_POLL_S:g}, got {self.poll_interval_s}", field="poll_interval_s")
        if self.db_outage_s > MAX_DB_OUTAGE_S:
            raise ConfigError(f"must be <= {MAX_DB_OUTAGE_S:g}, got {self.db_outage_s:g}", field="db_outage_s")
        if self.flush_delay_s > 1:
            raise ConfigError(f"must be <= 1, got {self.flush_delay_s}", field="flush_delay_s")
        if self.backoff_max_s < self.backoff_base_s:
            raise ConfigError("must be >= backoff_base_s", field="backoff_max_s")
        if self.breaker_max_cooldown_s < self.breaker_cooldown_s:
            raise ConfigError("must be >= breaker_cooldown_s", field="breaker_max_cooldown_s")
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
    # The row was PROCESSING under a claim of ours that lapsed (a worker died or hung mid-call), as
    # opposed to NEW, or PROCESSING written by another service: only such a claim may have spent its
    # attempts without an answer ("claim lapsed repeatedly" past max_attempts).
    lapsed: bool = False


def claims_from_rows(rows: Sequence[Any], token: uuid.UUID) -> list[Claim]:
    """Claims from CLAIM / CLAIMED_BY_TOKEN rows (id, amount_cents, attempts, lapsed)."""
    return [Claim(id=r[0], amount_cents=int(r[1]), attempts=int(r[2]), token=token, lapsed=bool(r[3])) for r in rows]


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
    engine: sa.Engine,
    count: int,
    *,
    seed: int | None = None,
    amount_range: tuple[int, int] = (100, 100_000),
    priority: int = 0,
) -> int:
    """Insert `count` NEW payments at `priority`, due now, with COPY (one wake-up notification)."""
    return copy_payments(engine, count, seed=seed, amount_range=amount_range, priority=priority)


def claim(engine: sa.Engine, n: int, lease_s: float) -> list[Claim]:
    """Claim up to `n` due payments (NEW and due by claim rank, or PROCESSING with a lapsed lease) at once."""
    if n <= 0:
        return []
    token = new_token()
    with engine.begin() as conn:
        rows = conn.exec_driver_sql(sql.CLAIM, {"n": int(n), "lease_s": float(lease_s), "token": token}).all()
    return claims_from_rows(rows, token)


@dataclass(frozen=True)
class Result:
    """One fenced result to write: DONE, FAILED, or NEW (retry after `delay_s`, or given back with `undo`)."""

    claim: Claim
    status: str
    undo: int = 0
    delay_s: float = 0.0
    error: str | None = None


def results_params(results: Sequence[Result]) -> dict[str, list[Any]]:
    """The WRITE_RESULTS parameters (parallel arrays) for `results`."""
    return {
        "ids": [r.claim.id for r in results],
        "tokens": [r.claim.token for r in results],
        "statuses": [r.status for r in results],
        "undo": [r.undo for r in results],
        "delays": [float(r.delay_s) for r in results],
        "errors": [None if r.error is None else clip(r.error) for r in results],
    }


def write_results(engine: sa.Engine, results: Sequence[Result]) -> list[Result]:
    """Write `results` in one fenced statement; returns the ones written (a lost claim writes nothing)."""
    if not results:
        return []
    with engine.begin() as conn:
        rows = conn.exec_driver_sql(sql.WRITE_RESULTS, results_params(results)).all()
    return [results[int(r[0]) - 1] for r in rows]


def new_token() -> uuid.UUID:
    """A fresh claim token (one per claim statement)."""
    return uuid.uuid4()


def complete(engine: sa.Engine, claim: Claim) -> bool:
    """Mark the claimed payment DONE; False when the claim was lost (nothing written)."""
    return len(write_results(engine, [Result(claim, "DONE")])) == 1


def outcome_status(claim: Claim, settings: QueueSettings, permanent: bool) -> Result:
    """FAILED when permanent or at max attempts, else NEW after the backoff of this attempt.

    A call that was made and failed always spends its attempt (CONTRACT §7 v3), whatever the breaker.
    A row another service inserted NEW with attempts already at or past the maximum got one call by
    then (a NEW row always does); if that fails transiently it is FAILED with the call's own error.
    """
    if permanent or claim.attempts >= settings.max_attempts:
        return Result(claim, "FAILED")
    return Result(claim, "NEW", delay_s=settings.backoff_s(claim.attempts))


def retry_or_fail(engine: sa.Engine, claim: Claim, error: str, settings: QueueSettings, permanent: bool) -> str | None:
    """Schedule a retry with backoff (→ 'NEW') or, when permanent or at max attempts, fail (→ 'FAILED').

    Returns the status written, or None when the claim was lost (nothing written).
    """
    planned = outcome_status(claim, settings, permanent)
    written = write_results(engine, [Result(claim, planned.status, delay_s=planned.delay_s, error=error)])
    return planned.status if written else None


def release(engine: sa.Engine, claim: Claim, delay_s: float = 0.0) -> bool:
    """Give back a claim that was never processed (NEW again, attempt undone); False when lost."""
    return len(write_results(engine, [Result(claim, "NEW", undo=1, delay_s=delay_s)])) == 1


def dlq_list(engine: sa.Engine, limit: int = 100, *, after_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
    """FAILED payments in id order (at most `limit`, after `after_id`): id, amount_cents, attempts, last_error, …"""
    with engine.connect() as conn:
        params = {"after_id": after_id or _NIL_UUID, "limit": int(limit), "error_chars": DLQ_ERROR_CHARS}
        rows = conn.execute(sql.DLQ_LIST, params).mappings().all()
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
    """`queue stats` (CONTRACT §7): counts by status, oldest_due_s, dlq_size, breaker; plus due and stuck rows.

    `due` = NEW and due + lapsed claims (§7's "due rows"); `stuck_processing` = the lapsed claims alone,
    a PROCESSING row without a lease included (§3 v3). A status another service wrote that is none of
    §3's four (`'new'`, `'PENDING'`, ...) is never claimed: it is counted under its own name in
    `by_status` and in `unknown_status`, so it is never lost without a trace. `never_due`: NEW rows whose
    next_attempt_at, or PROCESSING rows whose claimed_until, another service set to 'infinity'.
    """
    by_status = dict.fromkeys(STATUSES, 0)
    due = stuck = never_due = 0
    with engine.connect() as conn:
        for row in conn.execute(sql.STATS):
            by_status[row.status] = int(row.n)
            due += int(row.due)
            stuck += int(row.stuck)
            never_due += int(row.never_due)
        oldest_due_s = float(conn.exec_driver_sql(sql.OLDEST_DUE_S).scalar_one())
        state = conn.exec_driver_sql(sql.QUEUE_STATE, {"queue": QUEUE_NAME}).mappings().first()
    return {
        "by_status": by_status,
        "total": sum(by_status.values()),
        "due": due + stuck,
        "stuck_processing": stuck,
        "unknown_status": sum(n for status, n in by_status.items() if status not in STATUSES),
        "never_due": never_due,
        "oldest_due_s": round(max(oldest_due_s, 0.0), 3),
        "dlq_size": by_status["FAILED"],
        "breaker": state["breaker"] if state else "closed",
        "breaker_since": state["breaker_since"].isoformat() if state else None,
        "breaker_recorded_by": state["recorded_by"] if state else None,
    }


def _as_uuid(value: uuid.UUID | str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ConfigError(f"not a payment id: {value!r}", field="ids") from None


def clip(error: object) -> str:
    """One line of at most ERROR_MAX_BYTES UTF-8 bytes (last_error); a longer text ends with '…'.

    Only the first 4 x ERROR_MAX_BYTES characters are looked at, so a huge text costs no more.
    """
    text = " ".join(str(error)[: 4 * ERROR_MAX_BYTES].split())
    raw = text.encode("utf-8", "replace")
    if len(raw) <= ERROR_MAX_BYTES:
        return text
    return raw[: ERROR_MAX_BYTES - 3].decode("utf-8", "ignore") + "…"
