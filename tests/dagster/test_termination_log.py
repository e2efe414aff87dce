"""Termination says one thing: a terminated range logs what it drained and where its checkpoint stands (no date)."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from types import SimpleNamespace

import dagster as dg
import pytest
import sqlalchemy as sa

from batch_assets.engine.definition import CursorRange
from batch_assets.engine.settings import SweepSettings
from batch_assets.locking.checkpoint import CheckpointStore
from batch_assets.orchestration.sweep_job import PrepareContext, RangeTask
from batch_assets.orchestration.sweep_job.ops import log_termination
from batch_assets.reference.customer_status.dagster import SWEEP
from batch_assets.reference.customer_status.names import NAMES
from batch_assets.reference.customer_status.resources import EncryptionResource
from batch_assets.reference.customer_status.rules_store import current_rules
from batch_assets.reference.customer_status.sweep import SWEEP_NAME
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]


def test_a_terminated_delta_range_logs_its_counts_and_its_checkpoint_id_never_its_date(
    dagster_env: Settings, engine: sa.Engine, key_text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line names scanned/changed and the checkpoint's after_id; the cursor's date (from a DOB) is not shown."""
    run_date = date(2025, 6, 1)
    with engine.connect() as conn:
        _, rules = current_rules(conn)
    fingerprint = f"{rules.fingerprint}:{run_date}"
    row_id = uuid.uuid4()
    CheckpointStore(engine).save(
        SWEEP_NAME, "delta", CursorRange().key, cursor=["2031-03-07", str(row_id)], fingerprint=fingerprint,
        run_id="r1", run_date=run_date, counters={"scanned": 3000, "changed": 120, "failed": 0, "pages": 3},
    )
    task = RangeTask(index=0, count=1, cursor_range=CursorRange(), mode="delta", run_date=run_date,
                     settings=SweepSettings(), owner="r1@host:1", started_at=datetime.now(UTC),
                     fingerprint=fingerprint)
    prepared = SWEEP.prepare(PrepareContext(engine=engine, resources=SimpleNamespace(
        encryption=EncryptionResource(key=key_text))))
    with dg.build_op_context() as context:
        log_termination(context, task, NAMES, prepared.definition("delta", run_date), CheckpointStore(engine))
    [line] = [text for text in capsys.readouterr().err.splitlines() if "terminated" in text]
    assert "scanned 3,000" in line and "changed 120" in line and str(row_id) in line
    assert "2031" not in line
