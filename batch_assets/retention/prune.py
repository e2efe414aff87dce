"""`run_retention`: delete SENT outbox events, run history and finished checkpoints older than N days.

Bounded batches with short transactions: each delete covers one window of `batch_size` ids on the primary
key (sql.py) and commits on its own, so a table of millions of SENT events is pruned by many transactions
of a few milliseconds each, never one that holds locks or a snapshot for long. The cutoff is taken once,
from the database clock, so rows written while it runs are younger and kept. No Dagster here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import Field

from batch_assets.db.engine import translate_errors
from batch_assets.retention import sql
from batch_assets.settings_model import SettingsModel

log = logging.getLogger(__name__)

DEFAULT_OLDER_THAN_DAYS = 30
MAX_OLDER_THAN_DAYS = 36_500
DEFAULT_BATCH_SIZE = 5_000
MAX_BATCH_SIZE = 50_000


class RetentionSettings(SettingsModel):
    """Retention's settings (`retention run`, docs/reference/cli.md): the one model its run config and CLI options
    derive from."""

    older_than_days: int = Field(default=DEFAULT_OLDER_THAN_DAYS, ge=1, le=MAX_OLDER_THAN_DAYS,
                                 description="Delete what is older than this many days.")
    batch_size: int = Field(default=DEFAULT_BATCH_SIZE, ge=1, le=MAX_BATCH_SIZE,
                            description="Ids per delete transaction.")


@dataclass
class RetentionResult:
    deleted: dict[str, int] = field(default_factory=lambda: {"outbox_events": 0, "ba_run_history": 0,
                                                             "ba_checkpoints": 0})
    batches: int = 0
    longest_batch_s: float = 0.0
    duration_s: float = 0.0
    cutoff: str = ""

    def to_summary(self) -> dict[str, Any]:
        return {"status": "SUCCESS", "deleted": dict(self.deleted), "batches": self.batches,
                "longest_batch_s": round(self.longest_batch_s, 4), "duration_s": round(self.duration_s, 3),
                "cutoff": self.cutoff}


def run_retention(engine: sa.Engine, settings: RetentionSettings, *,
                  stop: Callable[[], bool] | None = None) -> RetentionResult:
    """Prune the product's own tables (docs/production/operations.md); `stop()` True ends it between batches."""
    started = time.monotonic()
    result = RetentionResult()
    with translate_errors(engine):
        with engine.connect() as conn:
            cutoff: datetime = conn.execute(sql.CUTOFF, {"days": settings.older_than_days}).scalar_one()
        result.cutoff = cutoff.isoformat()
        for table, span, delete in (("outbox_events", sql.OUTBOX_ID_SPAN, sql.DELETE_SENT_EVENTS),
                                    ("ba_run_history", sql.RUN_HISTORY_ID_SPAN, sql.DELETE_RUN_HISTORY)):
            result.deleted[table] = _by_id_windows(engine, span, delete, cutoff, settings.batch_size, result, stop)
        while not (stop and stop()):
            n = _timed(engine, sql.DELETE_FINISHED_CHECKPOINTS, {"cutoff": cutoff, "batch": settings.batch_size},
                       result)
            result.deleted["ba_checkpoints"] += n
            if n == 0:
                break
    result.duration_s = time.monotonic() - started
    return result


def _by_id_windows(engine: sa.Engine, span: sa.TextClause, delete: sa.TextClause, cutoff: datetime, batch: int,
                   result: RetentionResult, stop: Callable[[], bool] | None) -> int:
    with engine.connect() as conn:
        low, high = conn.execute(span).one()
    if low is None:
        return 0
    deleted = 0
    lo = int(low) - 1
    while lo < high and not (stop and stop()):
        hi = min(lo + batch, int(high))
        deleted += _timed(engine, delete, {"lo": lo, "hi": hi, "cutoff": cutoff}, result)
        lo = hi
    return deleted


def _timed(engine: sa.Engine, statement: sa.TextClause, params: dict[str, Any], result: RetentionResult) -> int:
    """One batch in its own transaction; its wall time is the longest transaction's bound."""
    began = time.monotonic()
    with engine.begin() as conn:
        count = conn.execute(statement, params).rowcount
    took = time.monotonic() - began
    result.batches += 1
    result.longest_batch_s = max(result.longest_batch_s, took)
    log.debug("retention batch: %d row(s) in %.4f s", count, took)
    return int(count)
