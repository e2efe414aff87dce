"""The knobs of a queue worker: one typed settings model (`batch_assets.settings_model.SettingsModel`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Self

from pydantic import Field, model_validator

from batch_assets.errors import ConfigError
from batch_assets.queue.limits.inflight import MAX_IN_FLIGHT
from batch_assets.queue.limits.ratelimit import MAX_RATE_PER_S
from batch_assets.queue.retry import RetryPolicy
from batch_assets.settings_model import MAX_CALL_TIMEOUT_S, SettingsModel

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


MAX_ATTEMPTS = 1000
"""Upper bound of max_attempts."""
MAX_WAIT_S = 7 * 86_400.0
"""Upper bound of every other duration knob (s): a week."""
MAX_KNOB_COUNT = 10_000_000
"""Upper bound of a count knob without a tighter one of its own."""


class QueueSettings(SettingsModel):
    """Queue and worker knobs: bounds, real defaults, descriptions and the cross-field rules in one place
    (validated when built; a bad value is a ConfigError naming the field)."""

    batch_size: int = Field(default=50, ge=1, le=MAX_BATCH,
                            description="First claim batch; it adapts within 1..max_batch_size.")
    max_batch_size: int = Field(default=MAX_BATCH, ge=1, le=MAX_BATCH,
                                description="Upper bound of the adaptive claim batch.")
    concurrency: int = Field(default=8, ge=1, le=MAX_CONCURRENCY, description="Handler calls in flight.")
    # claimed_until = now() + lease, renewed every lease/3 while the worker holds the claim (liveness.py); a
    # lapsed claim (its worker died) is claimed again. It may be shorter than a call, and must leave the
    # renewal (one short statement) room to get through.
    claim_lease_s: float = Field(default=30.0, ge=MIN_CLAIM_LEASE_S, le=MAX_WAIT_S,
                                 description="Claim lease (s), renewed every lease/3 while the claim is held.")
    max_attempts: int = Field(default=5, ge=1, le=MAX_ATTEMPTS,
                              description="A retriable failure on this attempt is terminal (FAILED).")
    backoff_base_s: float = Field(default=60.0, gt=0, le=MAX_WAIT_S,
                                  description="Delay after attempt k = base * 2^(k-1) (s), capped by backoff_max_s.")
    backoff_max_s: float = Field(default=3600.0, gt=0, le=MAX_WAIT_S, description="Longest backoff (s).")
    backoff_jitter: float = Field(default=0.1, ge=0, le=1,
                                  description="Each backoff is spread by ± this fraction (0 = none); see retry.py.")
    http_timeout_s: float = Field(default=10.0, gt=0, le=MAX_WAIT_S, description="Timeout of one handler call (s).")
    call_timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_CALL_TIMEOUT_S,
        description="The longest one handler call may take (s): past it the attempt is a transient failure "
        "(`timeout`, retried after its backoff) and the call is left to its thread, its result never written. "
        "Default: http_timeout_s + 1.")
    poll_interval_s: float = Field(default=MAX_POLL_S, gt=0, le=MAX_POLL_S,
                                   description="Idle look at the table without a notification (s).")
    flush_delay_s: float = Field(default=0.005, gt=0, le=1,
                                 description="A result waits at most this long for others to share its statement (s).")
    breaker_failures: int = Field(default=5, ge=1, le=MAX_KNOB_COUNT,
                                  description="Transient failures in a row (distinct rows) that open the breaker.")
    breaker_cooldown_s: float = Field(default=30.0, gt=0, le=MAX_WAIT_S,
                                      description="First cool-down of an open breaker (s); doubles while it lasts.")
    breaker_max_cooldown_s: float = Field(default=600.0, gt=0, le=MAX_WAIT_S, description="Longest cool-down (s).")
    drain_timeout_s: float = Field(default=30.0, gt=0, le=MAX_WAIT_S,
                                   description="On stop: calls in flight get this long to finish, then are given back.")
    db_outage_s: float = Field(
        default=60.0, gt=0, le=MAX_DB_OUTAGE_S,
        description="Seconds a lost database connection is retried (backoff) before the worker fails.")
    rate_limit_per_s: float = Field(
        default=0.0, ge=0, le=MAX_RATE_PER_S,
        description="Handler calls per second of this queue across all workers (ratelimit.py); 0 = none.")
    max_in_flight: int = Field(
        default=0, ge=0, le=MAX_IN_FLIGHT,
        description="Handler calls of this queue in flight at once across all workers (inflight.py); 0 = none.")

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        if self.batch_size > self.max_batch_size:
            raise ConfigError(f"must be <= max_batch_size ({self.max_batch_size}), got {self.batch_size}",
                              field="batch_size")
        if self.backoff_max_s < self.backoff_base_s:
            raise ConfigError("must be >= backoff_base_s", field="backoff_max_s")
        if self.breaker_max_cooldown_s < self.breaker_cooldown_s:
            raise ConfigError("must be >= breaker_cooldown_s", field="breaker_max_cooldown_s")
        return self

    @cached_property
    def retry(self) -> RetryPolicy:
        """The queue's retry policy: backoff with jitter, capped, max attempts, a delay the handler may ask for."""
        return RetryPolicy(base_s=self.backoff_base_s, max_s=self.backoff_max_s, jitter=self.backoff_jitter,
                           max_attempts=self.max_attempts)

    def backoff_s(self, attempts: int) -> float:
        """Delay before the next attempt after `attempts` tries, without jitter: base * 2^(attempts-1), capped."""
        return self.retry.backoff_s(attempts)


class QueueRunSettings(SettingsModel):
    """One worker run's settings (`queue work`, the launchpad): a drain or the resident worker, and the knobs
    a run may set over the queue's declared ones (unset = the declaration's value). `worker_settings` builds
    the worker's QueueSettings from the declaration's, where the cross-field rules then hold."""

    drain: bool = Field(
        default=True,
        description="Exit once nothing is due. False = the resident worker: it waits for notifications "
        "and runs until stopped (SIGTERM, run termination) or max_seconds.",
    )
    max_seconds: float | None = Field(default=None, gt=0, le=MAX_WAIT_S,
                                      description="Stop claiming new work after this many seconds. Default: no limit.")
    concurrency: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY,
                                    description="Handler calls in flight. Default: the queue's declared value.")
    batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH,
                                   description="First claim batch (it adapts within 1..1000). Default 50.")
    db_outage_s: int | None = Field(
        default=None, ge=1, le=int(MAX_DB_OUTAGE_S),
        description="Whole seconds a lost database connection is retried (backoff) before the worker fails. "
        "Default 60.")
    call_timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_CALL_TIMEOUT_S,
        description="The longest one handler call may take (s); past it the attempt is a transient failure. "
        "Default: the queue's declared value (30 s unless it says otherwise).")

    def worker_settings(self, declared: Callable[..., QueueSettings]) -> QueueSettings:
        """The worker's settings: `declared(**this run's knobs)` (a declaration's `settings`, None = its value)."""
        return declared(concurrency=self.concurrency, batch_size=self.batch_size, db_outage_s=self.db_outage_s,
                        call_timeout_s=self.call_timeout_s)
