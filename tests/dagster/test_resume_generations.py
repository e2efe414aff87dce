"""A new Dagster run resumes an interrupted sweep without re-reading the ranges that finished (docs/reference/rules.md);
after a run that succeeded, the next one reads everything again."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.orchestration.launch import launch_job
from batch_assets.reference.customer_status.dagster import SweepConfig, split_key_space
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

RANGES = split_key_space(4)
CONFIG = SweepConfig(mode="full", run_date="2025-06-01", ranges=4, page_size=50, workers=1, window=1,
                     breaker_min_rows=1)

BREAK = """
CREATE FUNCTION ba_test_break() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id BETWEEN (SELECT lo FROM ba_test_broken) AND (SELECT hi FROM ba_test_broken) THEN
        RAISE EXCEPTION 'injected failure';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER ba_test_break BEFORE UPDATE ON customers FOR EACH ROW EXECUTE FUNCTION ba_test_break();
"""
BROKEN_IDS = sa.text("CREATE TABLE ba_test_broken AS SELECT CAST(:lo AS uuid) AS lo, CAST(:hi AS uuid) AS hi")
# :lo, :hi — the inclusive id bounds whose updates the trigger refuses
UNBREAK = "DROP TRIGGER ba_test_break ON customers; DROP FUNCTION ba_test_break(); DROP TABLE ba_test_broken"
COUNT_IN = sa.text("SELECT count(*) FROM customers WHERE id BETWEEN :lo AND :hi")
# :lo, :hi — inclusive id bounds


def _break(engine: sa.Engine, lo: object, hi: object) -> None:
    """Another connection's trigger refuses every update of ids in [lo, hi]."""
    with engine.begin() as conn:
        conn.execute(BROKEN_IDS, {"lo": str(lo), "hi": str(hi)})
        conn.exec_driver_sql(BREAK)


def _ranges(engine: sa.Engine, run_id: str) -> dict[str, dict[str, Any]]:
    """Each range's own record of a run, by range key."""
    return {r["range"]: r for r in run_history.all_for_run(engine, run_id) if r.get("range")}


def _statuses(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT range_key, status FROM ba_checkpoints WHERE mode = 'full'").all()
    return {key: status for key, status in rows}


def _count(engine: sa.Engine, lo: object, hi: object) -> int:
    with engine.connect() as conn:
        return conn.execute(COUNT_IN, {"lo": lo, "hi": hi}).scalar_one()


def _settled(dagster_env: Settings, engine: sa.Engine, seeded: int) -> None:
    """The run after a full success reads every row again, and finds every one already right."""
    again = launch_job("customer_status_sweep_job", CONFIG, settings=dagster_env)
    assert again.summary["status"] == "SUCCESS" and again.summary["resumed_from"] is None
    assert again.summary["scanned"] == seeded and again.summary["changed"] == 0
    with engine.connect() as conn:
        events = conn.exec_driver_sql(
            "SELECT count(*), count(DISTINCT aggregate_id) FROM outbox_events").one()
    assert events[0] == events[1] == seeded - again.summary["failed"]


def test_a_new_run_skips_the_finished_ranges_and_resumes_the_failed_one(
    dagster_env: Settings, engine: sa.Engine, seeded: int
) -> None:
    """Range 2 fails half-way while 1, 3 and 4 finish; the next run reads 0 rows of 1, 3, 4 and range 2 only
    after its checkpoint; every row ends right, and the run after that reads all of them again."""
    second = RANGES[1]
    _break(engine, "60000000-0000-0000-0000-000000000000", second.hi)
    failed = launch_job("customer_status_sweep_job", CONFIG, settings=dagster_env)
    assert failed.dagster_status == "FAILURE" and "range 2/4" in failed.summary["error"]
    assert _statuses(engine) == {r.key: "DONE" for r in RANGES} | {second.key: "RUNNING"}
    with engine.connect() as conn:
        cursor = conn.execute(sa.text(
            "SELECT cursor #>> '{}' FROM ba_checkpoints WHERE mode = 'full' AND range_key = :k"
        ), {"k": second.key}).scalar_one()
    assert cursor is not None and cursor > str(second.lo)
    with engine.begin() as conn:
        conn.exec_driver_sql(UNBREAK)

    resumed = launch_job("customer_status_sweep_job", CONFIG, settings=dagster_env)
    assert resumed.dagster_status == "SUCCESS" and resumed.summary["status"] == "SUCCESS", resumed.summary
    ranges = _ranges(engine, resumed.run_id)
    for r in (RANGES[0], RANGES[2], RANGES[3]):
        assert (ranges[r.key]["scanned"], ranges[r.key]["resumed_from"]) == (0, "finished")
    assert ranges[second.key]["resumed_from"] == cursor
    assert resumed.summary["scanned"] == ranges[second.key]["scanned"] <= _count(engine, uuid.UUID(cursor), second.hi)
    assert resumed.summary["resumed_from"] == {
        r.key: ("finished" if r != second else cursor) for r in RANGES
    }
    _settled(dagster_env, engine, seeded)


def test_a_range_that_finished_before_the_others_started_is_not_read_again(
    dagster_env: Settings, engine: sa.Engine, seeded: int
) -> None:
    """Ranges 2-4 fail at their first page, so they never saved a checkpoint: the next run still skips range 1
    (it finished) and reads 2-4 from their start; the run after a full success reads everything."""
    _break(engine, RANGES[1].lo, RANGES[3].hi)
    failed = launch_job("customer_status_sweep_job", CONFIG, settings=dagster_env)
    assert failed.dagster_status == "FAILURE"
    with engine.connect() as conn:
        saved = conn.exec_driver_sql("SELECT count(*) FROM ba_checkpoints WHERE cursor IS NOT NULL").scalar_one()
    assert _statuses(engine)[RANGES[0].key] == "DONE" and saved == 1  # only range 1's
    with engine.begin() as conn:
        conn.exec_driver_sql(UNBREAK)

    resumed = launch_job("customer_status_sweep_job", CONFIG, settings=dagster_env)
    assert resumed.summary["status"] == "SUCCESS", resumed.summary
    ranges = _ranges(engine, resumed.run_id)
    assert (ranges[RANGES[0].key]["scanned"], ranges[RANGES[0].key]["resumed_from"]) == (0, "finished")
    assert resumed.summary["scanned"] == seeded - _count(engine, RANGES[0].lo, RANGES[0].hi)
    assert resumed.summary["resumed_from"] == {RANGES[0].key: "finished"}
    _settled(dagster_env, engine, seeded)


def test_a_corrupt_checkpoint_of_a_resumed_generation_starts_that_range_over(
    dagster_env: Settings, engine: sa.Engine, seeded: int
) -> None:
    """Range 2's checkpoint is overwritten with garbage by another connection after its run failed: the next run
    reads range 2 from its start (no read fails on the cursor), skips the finished ranges and ends SUCCESS."""
    second = RANGES[1]
    _break(engine, "60000000-0000-0000-0000-000000000000", second.hi)
    assert launch_job("customer_status_sweep_job", CONFIG, settings=dagster_env).dagster_status == "FAILURE"
    with engine.begin() as conn:
        conn.exec_driver_sql(UNBREAK)
        assert conn.execute(sa.text(
            "UPDATE ba_checkpoints SET cursor = CAST(:c AS jsonb) WHERE mode = 'full' AND range_key = :k "
            "AND status = 'RUNNING'"
        ), {"c": '"not-a-key"', "k": second.key}).rowcount == 1

    resumed = launch_job("customer_status_sweep_job", CONFIG, settings=dagster_env)
    assert resumed.summary["status"] == "SUCCESS", resumed.summary
    ranges = _ranges(engine, resumed.run_id)
    assert ranges[second.key]["scanned"] == _count(engine, second.lo, second.hi)
    assert ranges[second.key]["resumed_from"] is None
    assert [ranges[r.key]["scanned"] for r in RANGES if r != second] == [0, 0, 0]
    _settled(dagster_env, engine, seeded)
