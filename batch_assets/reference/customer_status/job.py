"""run_customer_status_sweep(): validate, load the rules, build the sweep, run it."""

from __future__ import annotations

import threading
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from pydantic import Field, ValidationInfo, field_validator

from batch_assets import (
    MAX_PAGE_SIZE,
    CheckpointStoreLike,
    ConfigError,
    CursorRange,
    DatedSettings,
    ProgressCallback,
    RunContext,
    RunGuardLike,
    SweepResult,
    SweepSettings,
    check_page_size,
    run_sweep,
)
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.rules import Rules
from batch_assets.reference.customer_status.rules_store import current_rules, settled_rules
from batch_assets.reference.customer_status.sweep import MODES, CustomerStatusSweep, FullReader, Mode

SWEEP_MODES = MODES
DEFAULT_RANGES = 4
"""Cursor ranges of a full or config-change run (one mapped op each); a delta is always one range."""
MAX_RANGES = 256


class CustomerStatusSettings(DatedSettings, SweepSettings):
    """The customer-status sweep's settings (`sweep customer-status`, docs/reference/cli.md): the run's mode, date
    and cursor
    ranges on top of every engine knob. The one model its run config (launchpad) and CLI options derive from."""

    mode: Mode = Field(default="delta", description="delta | full | config-change.")
    ranges: int = Field(
        default=DEFAULT_RANGES, ge=1, le=MAX_RANGES,
        description="Cursor ranges (UUID key ranges, one mapped op each) for full/config-change; delta is always "
        "one range.",
    )
    page_size: int = Field(default=MAX_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE, description="Rows per page.")

    @field_validator("ranges")
    @classmethod
    def _delta_is_one_range(cls, ranges: int, info: ValidationInfo) -> int:
        return 1 if info.data.get("mode") == "delta" else ranges

    @property
    def engine(self) -> SweepSettings:
        """The engine's knobs alone (what each range op gets)."""
        return SweepSettings(**{name: getattr(self, name) for name in SweepSettings.model_fields})


def checkpoint_fingerprint(rules: Rules, run_date: date) -> str:
    """What a checkpoint must match to be resumed: the rules and the run date."""
    return f"{rules.fingerprint}:{run_date}"


def run_customer_status_sweep(
    engine: sa.Engine,
    cipher: DobCipher,
    *,
    mode: str,
    run_date: date,
    settings: SweepSettings | dict[str, Any] | None,
    run_id: str,
    guard: RunGuardLike | None = None,
    checkpoints: CheckpointStoreLike | None = None,
    stop: threading.Event | None = None,
    cursor_range: CursorRange | None = None,
    progress: ProgressCallback | None = None,
) -> SweepResult:
    """The customer-status sweep (docs/reference/rules.md); every argument is validated before any read or write."""
    if mode not in MODES:  # called without the settings model (tests, bench): the same Mode values
        raise ConfigError(f"must be one of {', '.join(MODES)}, got {mode!r}", field="mode")
    if not isinstance(run_date, date) or isinstance(run_date, datetime):
        raise ConfigError("must be a date", field="run_date")
    if not isinstance(run_id, str) or not run_id.strip():
        raise ConfigError("must be a non-empty string", field="run_id")
    if not isinstance(cipher, DobCipher):
        raise ConfigError("a DobCipher is required", field="encryption_key")
    if settings is None:
        settings = SweepSettings()
    elif isinstance(settings, dict):
        settings = SweepSettings(**settings)
    check_page_size(settings.page_size, FullReader.max_page_size)  # the delta reader's bound is the same
    if cursor_range is not None and not cursor_range.is_full and mode == "delta":
        raise ConfigError("delta runs over the whole key space only", field="cursor_range")
    with engine.connect() as conn:
        _, rules = current_rules(conn)
        old_rules = settled_rules(conn) if mode == "config-change" else None
    definition = CustomerStatusSweep(mode, cipher=cipher, run_date=run_date, rules=rules, previous_rules=old_rules)
    # A checkpoint is resumed only by a run with the same rules and run date.
    ctx = RunContext(run_id=run_id, mode=mode, run_date=run_date, fingerprint=checkpoint_fingerprint(rules, run_date))
    return run_sweep(
        engine,
        definition,
        settings,
        ctx,
        checkpoints=checkpoints,
        guard=guard,
        stop=stop,
        cursor_range=cursor_range,
        progress=progress,
    )
