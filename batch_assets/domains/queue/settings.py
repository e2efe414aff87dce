"""The knobs of a queue worker: one frozen dataclass, 0 or None meaning the documented default."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from batch_assets.domains.queue.inflight import check_max_in_flight
from batch_assets.domains.queue.ratelimit import check_rate
from batch_assets.domains.queue.retry import RetryPolicy
from batch_assets.errors import ConfigError
from batch_assets.knobs import build_settings, check_positive_fields

MAX_BATCH = 1000
"""Upper bound of the adaptive claim batch (and of rows per result statement)."""
MAX_POLL_S = 5.0
"""An idle worker looks at the table at least this often, even without a notification."""
MAX_DB_OUTAGE_S = 600.0
"""Upper bound of `db_outage_s`: a worker rides out at most 10 minutes without its database, then fails."""
MAX_CONCURRENCY = 256
"""Upper bound of handler calls in flight in one worker."""
MIN_CLAIM_LEASE_S = 1.0
"""Lower bound of claim_lease_s (renewed every lease/3)."""


@dataclass(frozen=True)
class QueueSettings:
    """Queue and worker knobs; 0 or None means the documented default (use `build`)."""

    batch_size: int = 50  # first claim batch; adapts within 1..max_batch_size
    max_batch_size: int = MAX_BATCH  # upper bound of the adaptive claim batch, at most 1000
    concurrency: int = 8  # handler calls in flight, at most 256
    # claimed_until = now() + lease, renewed every lease/3 while the worker holds the claim (liveness.py); a
    # lapsed claim (its worker died) is claimed again. At least MIN_CLAIM_LEASE_S; may be shorter than a call.
    claim_lease_s: float = 30
    max_attempts: int = 5  # a retriable failure on this attempt is terminal (FAILED)
    backoff_base_s: float = 60  # delay after attempt k = base * 2^(k-1), capped
    backoff_max_s: float = 3600
    backoff_jitter: float = 0.1  # each backoff is spread by ± this fraction (0..1); see retry.RetryPolicy
    http_timeout_s: float = 10  # per handler call
    poll_interval_s: float = MAX_POLL_S  # idle look at the table without a notification, at most 5 s
    flush_delay_s: float = 0.005  # a result waits at most this long for others to share its statement
    breaker_failures: int = 5  # transient failures in a row (distinct rows) that open the breaker
    breaker_cooldown_s: float = 30  # first cool-down; doubles while the outage lasts
    breaker_max_cooldown_s: float = 600
    drain_timeout_s: float = 30  # on stop: calls in flight get this long to finish, then are given back
    # A lost database connection (backend terminated, server restarting) is re-established with
    # backoff for this long from the first failure; then the worker ends FAILURE. At most 600 s.
    db_outage_s: float = 60
    rate_limit_per_s: float = 0  # handler calls per second of this queue across all workers (ratelimit.py); 0 = none
    max_in_flight: int = 0  # handler calls of this queue in flight at once across all workers (inflight.py); 0 = none

    def __post_init__(self) -> None:
        check_positive_fields(self, may_be_zero=("rate_limit_per_s", "max_in_flight", "backoff_jitter"))
        if self.max_batch_size > MAX_BATCH:
            raise ConfigError(f"must be <= {MAX_BATCH}, got {self.max_batch_size}", field="max_batch_size")
        if self.batch_size > self.max_batch_size:
            raise ConfigError(f"must be <= max_batch_size ({self.max_batch_size}), got {self.batch_size}",
                              field="batch_size")
        if self.concurrency > MAX_CONCURRENCY:
            raise ConfigError(f"must be <= {MAX_CONCURRENCY}, got {self.concurrency}", field="concurrency")
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
        # The lease is renewed every lease/3 while the claim is held, so it need not outlive a call; it must
        # leave the renewal (one short statement) room to get through.
        if self.claim_lease_s < MIN_CLAIM_LEASE_S:
            raise ConfigError(f"must be >= {MIN_CLAIM_LEASE_S:g}, got {self.claim_lease_s:g}", field="claim_lease_s")
        if self.rate_limit_per_s:
            check_rate(self.rate_limit_per_s)
        if self.max_in_flight:
            check_max_in_flight(self.max_in_flight)
        if self.backoff_jitter > 1:
            raise ConfigError(f"must be within 0..1, got {self.backoff_jitter:g}", field="backoff_jitter")

    @classmethod
    def build(cls, **overrides: Any) -> QueueSettings:
        """Settings from keyword overrides; a value of 0 or None takes the default; unknown names are errors."""
        return build_settings(cls, overrides)

    @cached_property
    def retry(self) -> RetryPolicy:
        """The queue's retry policy: backoff with jitter, capped, max attempts, a delay the handler may ask for."""
        return RetryPolicy(base_s=self.backoff_base_s, max_s=self.backoff_max_s, jitter=self.backoff_jitter,
                           max_attempts=self.max_attempts)

    def backoff_s(self, attempts: int) -> float:
        """Delay before the next attempt after `attempts` tries, without jitter: base * 2^(attempts-1), capped."""
        return self.retry.backoff_s(attempts)
