"""A partial bench report (`batch-assets bench --only ...`) is written whole: its table, its charts and the
checker's verdict, whichever sections it ran. `--only queue` used to crash after measuring everything, first in
the start-up table (the queue's CLI drains live under `startup`, with no start-up probe beside them) and then in
the throughput chart (no sweep to draw)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from batch_assets.bench import check, outputs, render
from batch_assets.bench.options import SECTIONS

pytestmark = pytest.mark.unit

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "bench" / "latest.json"


def partial(report: dict[str, Any], only: tuple[str, ...]) -> dict[str, Any]:
    """The committed full report as an `--only` run of these sections would have written it: each other
    section's figures removed from where the report keeps them (check._present)."""
    part = copy.deepcopy(report)
    checks = part["checks"]
    startup = part.get("startup") or {}
    for name in set(SECTIONS) - set(only):
        if name == "plans":
            checks.pop("plans", None)
        elif name == "rss":
            checks.pop("peak_rss", None)
        elif name == "startup":
            startup = {k: v for k, v in startup.items() if k.startswith("cli_queue")}
        elif name == "sweep":  # a partial report keeps the sweep's (empty) places, as the bench writes them
            part["sweep"], checks["second_run_writes"] = {}, {}
        elif name == "references":
            part["references"] = {}
        else:
            part.pop(name, None)
            if name == "queue":
                startup = {k: v for k, v in startup.items() if not k.startswith("cli_queue")}
    part["startup"] = startup
    if not startup:
        part.pop("startup")
    part["only"] = list(only)
    part["command"] = f"batch-assets bench --only {','.join(only)}"
    return part


@pytest.mark.parametrize("only", [(s,) for s in SECTIONS if s != "startup"] + [("references", "startup")],
                         ids=lambda only: ",".join(only))
def test_a_partial_report_renders_its_table_and_charts_and_passes_the_checker(
        only: tuple[str, ...], tmp_path: Path) -> None:
    report = partial(json.loads(COMMITTED.read_text()), only)
    assert check.check_report(report) == []
    written = outputs.write_outputs(report, tmp_path)
    assert check.check_outputs(report, tmp_path) == []
    assert {p.name for p in written} >= set(render.CHART_FILES.values()) | {render.TABLE_FILE, render.LATEST_JSON}
    table = (tmp_path / render.TABLE_FILE).read_text()
    assert ("queue, 100,000 payments, 2 `queue work --drain` processes" in table) is ("queue" in only)
