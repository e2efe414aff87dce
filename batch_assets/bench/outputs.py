"""The bench's files: the dated JSON report, latest.json, latest.md, the charts, and the benchmarks page's tables."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from batch_assets.bench import charts
from batch_assets.bench.render import CHART_FILES, LATEST_JSON, TABLE_FILE, markdown, update_page


def report_path(output_dir: Path, report: dict[str, Any]) -> Path:
    """The dated report file: bench-<date>.json (bench-<date>-quick.json for --quick)."""
    suffix = "-quick" if report.get("quick") else ""
    return output_dir / f"bench-{report['created_at'][:10]}{suffix}.json"


def write_outputs(report: dict[str, Any], output_dir: Path, *, readme: Path | None = None) -> list[Path]:
    """The dated JSON, latest.json, latest.md and the charts; with `readme` (the bench command's `--readme PAGE`,
    the benchmarks page docs/bench/index.md), that page's copy of the tables too."""
    output_dir.mkdir(parents=True, exist_ok=True)
    dated = report_path(output_dir, report)
    text = json.dumps(report, indent=2, default=str) + "\n"
    dated.write_text(text)
    latest = output_dir / LATEST_JSON
    if latest.resolve() != dated.resolve():
        shutil.copyfile(dated, latest)
    (output_dir / TABLE_FILE).write_text(markdown(report))
    written = [dated, latest, output_dir / TABLE_FILE]
    written += charts.draw_all(report, output_dir, CHART_FILES)
    if readme is not None and update_page(readme, report):
        written.append(readme)
    return written
