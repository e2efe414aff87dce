"""`batch-assets bench` runs end to end on a scratch database and writes its JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bench_writes_a_report_and_leaves_no_scratch_database(cli_env: dict[str, str], tmp_path: Path) -> None:
    """A small bench run reports every scenario with rows/s and statements per page, then drops its database."""
    output = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "batch_assets.cli", "bench", "--rows", "10000", "--small-rows", "1000",
         "--output", str(output)],
        env=cli_env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert json.loads(result.stdout.strip().splitlines()[-1]) == report
    results = report["results"]
    for key in ("full_first_computation_w1", "full_steady_state_w1", "full_first_computation_w4",
                "full_steady_state_w4", "delta_500_due"):
        assert results[key]["rows_per_s"] > 0 and results[key]["statements_per_page"] >= 1
    assert results["full_first_computation_w1"]["changed"] == 10000
    assert results["full_steady_state_w1"]["changed"] == 0
    assert results["delta_500_due"]["changed"] == 500
    assert results["peak_rss_small"]["rows"] == 1000 and results["peak_rss_large"]["peak_rss_mib"] > 0
    engine = sa.create_engine(cli_env["BATCH_ASSETS_DATABASE_URL"])
    with engine.connect() as conn:
        left = conn.execute(sa.text("SELECT count(*) FROM pg_database WHERE datname LIKE 'ba_bench_%'")).scalar()
    engine.dispose()
    assert left == 0
