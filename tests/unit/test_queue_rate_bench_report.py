"""The rate limit's bench figures: window counting, the report's table rows and the checker."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from batch_assets.bench import render
from batch_assets.bench.check_services import check_rate_limit
from batch_assets.bench.checker import Checker
from batch_assets.bench.payments_rate import window_counts

pytestmark = pytest.mark.unit

RATE_LIMIT: dict[str, Any] = {
    "limit_per_s": 100.0, "worker_processes": 2, "calls": 400, "achieved_per_s": 98.6,
    "window_1s": {"windows": 299, "min": 95, "max": 104, "mean": 99.1, "min_ratio": 0.95, "max_ratio": 1.04},
    "statements_per_call": 0.105, "refused": 14, "dropped_slots": 0,
    "cost": {"payments": 2000, "unlimited_per_s": 3797.4, "limit_far_above_per_s": 3500.0,
             "far_above_limit_per_s": 100000.0, "ratio": 0.922},
}


def test_window_counts_are_the_calls_in_each_full_second() -> None:
    """Calls 0.1 s apart: 10 in every 1 s window that ends by the last call; a burst shows as a larger count."""
    even = [i * 0.1 for i in range(31)]
    assert set(window_counts(even)) == {10}
    assert max(window_counts([*even, 1.01, 1.02, 1.03])) == 13
    assert window_counts([]) == [] and window_counts([5.0]) == []


def test_the_report_shows_accuracy_and_cost_and_the_checker_holds_them() -> None:
    """Two table rows from the figures; the checker accepts them and names an inconsistent max_ratio."""
    rows = render.rate_limit_rows(RATE_LIMIT)
    assert len(rows) == 2
    assert "every 1 s window 95–104 calls (0.95–1.04× the limit)" in rows[0]
    assert "(0.92×)" in rows[1]
    assert render.rate_limit_rows(None) == []
    ok = Checker()
    check_rate_limit(ok, RATE_LIMIT)
    assert ok.problems == []
    bad = copy.deepcopy(RATE_LIMIT)
    bad["window_1s"]["max_ratio"] = 2.0
    bad["cost"]["ratio"] = 0
    found = Checker()
    check_rate_limit(found, bad)
    assert any("max_ratio" in p for p in found.problems) and any("cost.ratio" in p for p in found.problems)
