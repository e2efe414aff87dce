"""A declared sweep on the engine, against the team's hostile or slow functions: a call past `call_timeout_s` is
`compute_timeout` and the run goes on (its late result is never written); a BaseException of compute is a
compute_error of its row; a failed write is named by its SQLSTATE condition, never by PostgreSQL's text; and
failures are logged per row at DEBUG, with one WARNING per page."""

from __future__ import annotations

import logging
import re
import time
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import wait_for, write_module

from batch_assets.engine import systemic_log
from batch_assets.engine.definition import RunContext
from batch_assets.engine.ranges import CursorRange
from batch_assets.engine.result import SweepResult
from batch_assets.engine.runner import run_sweep
from batch_assets.engine.settings import SweepSettings
from batch_assets.engine.table_sweep import DeclaredSweep
from batch_assets.orchestration.components.sweep_component import SweepComponent

pytestmark = pytest.mark.integration

RUN_DATE = date(2026, 12, 1)
LOYALTY = {
    "name": "loyalty_tier", "table": "accounts", "key": "id", "columns": ["id", "points", "tier", "tier_review_on"],
    "where": "status = 'OPEN'", "due": "tier_review_on", "compute": "tiers:compute",
    "writes": ["tier", "tier_review_on"], "sensitive": ["points"],
}


def _sweep(engine: sa.Engine, attributes: dict[str, Any], **settings: Any) -> SweepResult:
    target = SweepComponent.from_attributes_dict(attributes={**LOYALTY, **attributes}).target(engine)
    values = {"page_size": 100, "workers": 2, **settings}
    return run_sweep(engine, DeclaredSweep(target, "full", RUN_DATE), SweepSettings(**values),
                     RunContext("run-1", "full", RUN_DATE), cursor_range=CursorRange.whole(target.kind))


def test_a_call_past_its_bound_is_compute_timeout_and_its_late_result_is_never_written(
    accounts: sa.Engine, functions: Path
) -> None:
    write_module(functions, "stuck", """
        import threading

        STUCK = set()
        RELEASE = threading.Event()
        RETURNED = []

        def compute(row, run_date):
            if str(row["id"]) in STUCK:
                RELEASE.wait(120)
                RETURNED.append(row["id"])
                return {"tier": "LATE", "tier_review_on": run_date}
            return {"tier": "ON_TIME", "tier_review_on": run_date}
    """)
    import stuck  # type: ignore[import-not-found]

    with accounts.connect() as conn:
        keys = [str(k) for k in conn.execute(sa.text("SELECT id FROM accounts WHERE status = 'OPEN' ORDER BY id "
                                                     "OFFSET 150 LIMIT 3")).scalars()]
    stuck.STUCK.update(keys)
    started = time.monotonic()
    result = _sweep(accounts, {"compute": "stuck:compute", "call_timeout_s": 1})
    took = time.monotonic() - started
    assert result.status == "SUCCESS", result.stopped_reason
    assert result.failed_by_type.get("compute_timeout") == 3 and result.changed == 997, result
    assert took < 30, f"three calls of 1 s took {took:.0f}s: the run waited for calls it gave up on"

    stuck.RELEASE.set()
    wait_for(lambda: len(stuck.RETURNED) == 3, timeout=30, what="the calls left behind to return")
    with accounts.connect() as conn:
        tiers = {r[0]: r[1] for r in conn.execute(sa.text(
            "SELECT tier, count(*) FROM accounts WHERE status = 'OPEN' GROUP BY tier"))}
    assert tiers == {"ON_TIME": 997, None: 3}, "a result that came after its call's bound is never written"


def test_a_base_exception_of_compute_is_a_compute_error_of_its_row(accounts: sa.Engine, functions: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    write_module(functions, "exits", """
        def compute(row, run_date):
            points = row["points"] or 0
            if points % 3 == 0:
                raise SystemExit(f"points={points}")
            if points % 3 == 1:
                raise KeyboardInterrupt(f"points={points}")
            return {"tier": "X", "tier_review_on": run_date}
    """)
    caplog.set_level(logging.DEBUG, logger="batch_assets")
    result = _sweep(accounts, {"compute": "exits:compute"}, breaker_min_rows=10_000_000)
    with accounts.connect() as conn:
        written = conn.execute(sa.text("SELECT count(*) FROM accounts WHERE tier = 'X'")).scalar_one()
    assert result.status == "SUCCESS" and result.scanned == 1000, result.stopped_reason
    assert result.failed_by_type["compute_error"] == 1000 - written and written > 300
    assert "compute raised SystemExit" in caplog.text and "compute raised KeyboardInterrupt" in caplog.text
    assert "points=" not in caplog.text, "an exception's own text may hold a value: only its type is logged"


@pytest.mark.parametrize("every_s", [3600.0, 0.0])
def test_500_failing_rows_are_told_in_a_few_warnings_that_count_them_all(
        accounts: sa.Engine, functions: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
        every_s: float) -> None:
    """500 rows whose compute raises: per-row lines at DEBUG only; the pages' WARNINGs count them by kind, the first
    page at once and the others summed until WARN_EVERY_S has passed or the run ends (every page told on its own
    when it is 0), and the counts of all the lines add up to the run's."""
    monkeypatch.setattr(systemic_log, "WARN_EVERY_S", every_s)
    write_module(functions, "half", """
        def compute(row, run_date):
            if (row["points"] or 0) % 2 == 0:
                raise ValueError("bad")
            return {"tier": "X", "tier_review_on": run_date}
    """)
    caplog.set_level(logging.DEBUG, logger="batch_assets")
    result = _sweep(accounts, {"compute": "half:compute"}, breaker_min_rows=10_000_000)
    failed = result.failed_by_type["compute_error"]
    assert result.status == "SUCCESS" and 450 <= failed <= 550 and result.pages == 10
    sweep_records = [r for r in caplog.records if r.name == "batch_assets.sweep"]
    per_row = [r for r in sweep_records if "compute raised ValueError" in r.getMessage()]
    assert len(per_row) == failed and {r.levelno for r in per_row} == {logging.DEBUG}
    warnings = [r.getMessage() for r in sweep_records if r.levelno >= logging.WARNING]
    counts = [re.search(r": (\d+) of \d+ rows of (a page|(\d+) pages) failed systemically \(compute_error (\d+)\)$",
                        w) for w in warnings]
    assert all(counts), warnings
    assert sum(int(m.group(1)) for m in counts) == failed
    assert all(m.group(1) == m.group(4) for m in counts), warnings
    if every_s:  # the first page, then the nine others in one line at the end of the run
        assert [m.group(3) for m in counts] == [None, "9"], warnings
    else:
        assert len(warnings) == result.pages and all(m.group(2) == "a page" for m in counts), warnings
