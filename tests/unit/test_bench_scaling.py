"""The bench's scaling merge: per-row times and peak RSS across sizes, from the reports of each size."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from batch_assets.bench import scaling

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "bench" / "latest.json"


def _at(report: dict[str, Any], rows: int, slower: float, rss: float) -> dict[str, Any]:
    """The committed report as if measured at `rows`, each sweep `slower` times slower per row."""
    scaled = copy.deepcopy(report)
    factor = rows / report["rows"]
    scaled["rows"], scaled["seed_s"] = rows, report["seed_s"] * factor
    for entry in scaled["sweep"].values():
        entry["scanned"] = round(entry["scanned"] * factor)
        entry["sweep_s"] = entry["sweep_s"] * factor * slower
    scaled["checks"]["peak_rss"]["large"]["peak_rss_mib"] = rss
    return scaled


def test_the_merge_gives_per_row_times_their_ratios_and_the_rss_per_size(tmp_path: Path) -> None:
    base = json.loads(COMMITTED.read_text())
    reports = [_at(base, 10_000_000, 1.2, 88.0), _at(base, 1_000_000, 1.0, 88.0), _at(base, 100_000, 1.0, 80.0)]
    scale = scaling.merge(reports)
    assert [s["rows"] for s in scale["sizes"]] == [100_000, 1_000_000, 10_000_000]
    first = scale["sizes"][1]["per_row_us"]["full_first_computation_w4"]
    w4 = base["sweep"]["full_first_computation_w4"]
    assert first == pytest.approx(w4["sweep_s"] / w4["scanned"] * 1e6, rel=0.01)
    to_10m = scale["steps"][1]
    assert to_10m["per_row_ratio"]["full_first_computation_w4"] == pytest.approx(1.2, rel=0.01)
    assert to_10m["within_goal"]["full_first_computation_w4"] is False  # 1.2 > 1.15
    assert scale["steps"][0]["within_goal"]["full_steady_state_w1"] is True
    assert to_10m["peak_rss_ratio"] == 1.0 and scale["steps"][0]["peak_rss_ratio"] == 1.1
    table = scaling.markdown(scale)
    assert "| full first computation w4 |" in table and "| 10M ÷ 1M |" in table.splitlines()[0] + " |"
    with pytest.raises(ValueError, match="the same report of 1000000 rows twice"):
        scaling.merge([reports[1], reports[1]])
    paths = []
    for i, r in enumerate(reports):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(r))
    out = tmp_path / "scale.json"
    assert scaling.main([*map(str, paths), "--output", str(out), "--markdown", str(tmp_path / "s.md")]) == 0
    assert json.loads(out.read_text()) == json.loads(json.dumps(scale))
    assert scaling.main([str(paths[0]), str(paths[0]), "--output", str(out)]) == 2


def test_repeats_of_a_size_give_the_median_per_row_and_keep_each_run() -> None:
    """Three 1M runs, one of them slow (1.6x): the size's time per row is the median run's, so the 10M step is
    judged against 1.0x, not the mean's 1.2x; each run stays under `runs` and the table says how many."""
    base = json.loads(COMMITTED.read_text())
    runs = [_at(base, 1_000_000, slower, rss) for slower, rss in ((1.0, 84.0), (1.6, 86.0), (1.1, 85.0))]
    for i, run in enumerate(runs):
        run["created_at"] = f"2026-12-04T16:0{i}:00Z"
    scale = scaling.merge([_at(base, 10_000_000, 1.1, 85.0), *runs])
    one_m = scale["sizes"][0]
    assert [r["created_at"] for r in one_m["runs"]] == [r["created_at"] for r in runs]
    w1 = base["sweep"]["full_first_computation_w1"]
    assert one_m["per_row_us"]["full_first_computation_w1"] == pytest.approx(
        w1["sweep_s"] / w1["scanned"] * 1e6 * 1.1, rel=0.01)
    assert one_m["peak_rss_mib"] == 86.0
    assert scale["steps"][0]["per_row_ratio"]["full_first_computation_w1"] == pytest.approx(1.0, rel=0.01)
    assert scaling.markdown(scale).splitlines()[0].startswith("| scenario (µs per row) | 1M (median of 3) | 10M |")


def test_a_run_keeps_its_finished_scenarios_in_partial_json_and_the_merge_marks_the_size(tmp_path: Path) -> None:
    """A long run (10M rows) rewrites <output-dir>/partial.json at each step with what it measured so far
    (status RUNNING, never the report's own status); merged, such a size is shown as partial."""
    from batch_assets.bench import check, suite

    base = json.loads(COMMITTED.read_text())
    report: dict[str, Any] = {**copy.deepcopy(base), "sweep": {}}
    said: list[str] = []
    say = suite.Progress(said.append, steps=3, on_step=suite.partial_saver(tmp_path / "out", report))
    say.next("seeding")
    partial = tmp_path / "out" / suite.PARTIAL_JSON
    saved = json.loads(partial.read_text())
    assert (saved["status"], saved["running"], saved["sweep"]) == ("RUNNING", "seeding", {})
    report["sweep"]["full_first_computation_w4"] = base["sweep"]["full_first_computation_w4"]
    say.keep()  # after one long sweep, before the step ends
    saved = json.loads(partial.read_text())
    assert list(saved["sweep"]) == ["full_first_computation_w4"] and saved["running"] == "seeding"
    assert report["status"] == "SUCCESS" and "running" not in report and said[0].endswith("(1/3) seeding")
    assert "report.status must be SUCCESS, got 'RUNNING'" in check.check_report(saved)
    saved["sweep"]["full_first_computation_w1"] = base["sweep"]["full_first_computation_w1"]
    merged = scaling.merge([saved, _at(base, 100_000, 1.0, 80.0)])
    # its table counts are those of the first computation with the most workers it got to
    assert merged["sizes"][1]["tables_after_first_computation"] == base["sweep"]["full_first_computation_w4"]["tables"]
    del saved["sweep"]["full_first_computation_w4"]
    merged = scaling.merge([saved, _at(base, 100_000, 1.0, 80.0)])
    assert merged["sizes"][1]["tables_after_first_computation"] == base["sweep"]["full_first_computation_w1"]["tables"]
    table = scaling.markdown(merged)
    assert table.splitlines()[0].startswith("| scenario (µs per row) | 100k | 1M (partial) |")
