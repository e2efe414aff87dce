"""The relay's knobs: bounds, defaults and the cross-field rule of RelaySettings, and the relay job's own."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from batch_assets.errors import ConfigError
from batch_assets.settings_model import SettingsModel

MAX_BATCH = 10_000
DEFAULT_BATCH_BYTES = 8 * 1024 * 1024
"""A batch's payload budget: 8 MiB (an age_category_changed event stores ~100 bytes, so only hostile or
unusually large payloads ever cut a batch short of batch_size)."""
MIN_BATCH_BYTES = 1024
MAX_BATCH_BYTES = 1024 * 1024 * 1024
MAX_RELAY_SECONDS = 3600.0
"""Upper bound of every relay duration knob (s)."""
MAX_FOLLOW_SECONDS = 7 * 86_400.0
"""Upper bound of follow_seconds: a week."""


class RelaySettings(SettingsModel):
    """Knobs of the relay: bounds, defaults and the cross-field rule in one place (validated when built)."""

    batch_size: int = Field(default=500, ge=1, le=MAX_BATCH, description="Events per batch.")
    batch_bytes: int = Field(
        default=DEFAULT_BATCH_BYTES, ge=MIN_BATCH_BYTES, le=MAX_BATCH_BYTES,
        description="Payload bytes per batch (stored size): a batch holds at most this much, or its first event.")
    claim_lease_s: float = Field(default=60.0, gt=0, le=MAX_RELAY_SECONDS,
                                 description="Claim lease of a batch (s); another relay may take it after.")
    send_timeout_s: float = Field(default=10.0, gt=0, le=MAX_RELAY_SECONDS,
                                  description="Timeout of one send to the sink (s), below claim_lease_s.")
    poll_s: float = Field(default=5.0, gt=0, le=MAX_RELAY_SECONDS,
                          description="Follow mode: longest wait without a notification (s).")
    backoff_s: float = Field(default=0.5, gt=0, le=MAX_RELAY_SECONDS,
                             description="Follow mode: first wait after a failure (s), doubled up to backoff_max_s.")
    backoff_max_s: float = Field(default=30.0, gt=0, le=MAX_RELAY_SECONDS,
                                 description="Follow mode: longest wait after failures (s).")

    @model_validator(mode="after")
    def _send_within_lease(self) -> Self:
        if self.send_timeout_s >= self.claim_lease_s:
            raise ConfigError("must be shorter than claim_lease_s", field="send_timeout_s")
        return self


class OutboxRelayJobSettings(RelaySettings):
    """The relay job's settings (`outbox relay`, the launchpad): one pass or follow, on top of the relay's knobs."""

    follow: bool = Field(
        default=False,
        description="Keep relaying, woken by a PostgreSQL notification on every new event, until stopped "
        "(or follow_seconds pass). Default false: one pass until nothing is pending.",
    )
    follow_seconds: float | None = Field(
        default=None, gt=0, le=MAX_FOLLOW_SECONDS,
        description="With follow: stop after this many seconds. Default: until stopped.",
    )
