"""Time per row and peak RSS across table sizes, from bench reports of each size.

    python -m batch_assets.bench.scaling REPORT.json [REPORT.json ...] --output SCALE.json [--markdown SCALE.md]

Each report is a `batch-assets bench --rows N` run (100k, 1M, 10M: the 10M run is not for CI). Several reports
of one size are repeats: the size takes the median time per row of each scenario over them (and the largest
peak RSS), and keeps each run's figures under `runs`, because one run of a short scenario varies by more than
the 15% the goal allows (a 1M steady state took 7.2 and 10.7 µs per row in two runs on one day). The merge
gives, per size, the time per row of every scenario (microseconds: sweep_s / rows scanned; a delta per due
row), the seeding time per row and the peak RSS of a whole sweep in a fresh process, and between each size and
the next the ratio of those times (the goal: 10M within 1.15x of 1M) and of the RSS (flat: about 1.0). What each
first computation left in the tables (pg_stat_user_tables, see growth) is carried over per size, so index and
outbox growth can be read beside the times. Reports measured on different machines or under different load
are not comparable; the merge keeps each report's note and creation time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from batch_assets.bench import render

GOAL_PER_ROW_RATIO = 1.15
SCENARIOS = ("full_first_computation", "full_steady_state", "delta_0_1pct_due", "config_change")


def _per_row_us(entry: dict[str, Any]) -> float | None:
    scanned, seconds = entry.get("scanned"), entry.get("sweep_s")
    if not scanned or not seconds:
        return None
    return round(seconds / scanned * 1e6, 2)


def size_entry(report: dict[str, Any]) -> dict[str, Any]:
    """One size: per-row microseconds of each scenario and worker count, seeding, peak RSS, table growth."""
    sweep = report.get("sweep") or {}
    per_row: dict[str, float | None] = {}
    for name, entry in sweep.items():
        if isinstance(entry, dict) and any(name.startswith(s) for s in SCENARIOS):
            key = name if name != "config_change" else f"config_change_w{entry.get('workers')}"
            per_row[key] = _per_row_us(entry)
    rss = (report.get("checks") or {}).get("peak_rss") or {}
    # The first computation of the most workers the report has (a partial report may stop before the last).
    firsts = [sweep[k] for w in sorted(report.get("workers") or [1], reverse=True)
              if (k := render.sweep_key("first_computation", w)) in sweep]
    first = firsts[0] if firsts else {}
    return {
        "rows": report["rows"],
        "status": report.get("status"),  # RUNNING: a partial.json, the run stopped before its end
        "created_at": report.get("created_at"),
        "note": (report.get("machine") or {}).get("note"),
        "seed_us_per_row": round(report["seed_s"] / report["rows"] * 1e6, 2) if report.get("seed_s") else None,
        "per_row_us": per_row,
        "peak_rss_mib": (rss.get("large") or {}).get("peak_rss_mib"),
        "tables_after_first_computation": first.get("tables"),
    }


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 2) if known else None


def repeated_size(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One size measured by several runs (size entries of the same rows): the median per row of each scenario and
    of seeding over the runs that have it, the largest peak RSS, and the runs themselves under `runs`."""
    if len(runs) == 1:
        return runs[0]
    stamps = [r["created_at"] for r in runs]
    if len(set(stamps)) != len(stamps):
        raise ValueError(f"the same report of {runs[0]['rows']} rows twice (created_at {stamps})")
    runs = sorted(runs, key=lambda r: r["created_at"] or "")
    keys = sorted({k for r in runs for k in r["per_row_us"]})
    rss = [r["peak_rss_mib"] for r in runs if r["peak_rss_mib"] is not None]
    return {
        "rows": runs[0]["rows"],
        "status": "RUNNING" if any(r["status"] == "RUNNING" for r in runs) else runs[0]["status"],
        "created_at": runs[0]["created_at"],
        "note": runs[0]["note"],
        "seed_us_per_row": _median([r["seed_us_per_row"] for r in runs]),
        "per_row_us": {k: _median([r["per_row_us"].get(k) for r in runs]) for k in keys},
        "peak_rss_mib": max(rss) if rss else None,
        "tables_after_first_computation": runs[0]["tables_after_first_computation"],
        "runs": runs,
    }


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The sizes in ascending order (repeats of a size merged by `repeated_size`) and the ratios from each size
    to the next."""
    by_rows: dict[int, list[dict[str, Any]]] = {}
    for entry in map(size_entry, reports):
        by_rows.setdefault(entry["rows"], []).append(entry)
    sizes = [repeated_size(by_rows[rows]) for rows in sorted(by_rows)]
    steps = []
    for small, large in zip(sizes, sizes[1:], strict=False):
        ratios = {k: round(v / small["per_row_us"][k], 3) for k, v in large["per_row_us"].items()
                  if v and small["per_row_us"].get(k)}
        rss = (round(large["peak_rss_mib"] / small["peak_rss_mib"], 3)
               if large["peak_rss_mib"] and small["peak_rss_mib"] else None)
        seed = (round(large["seed_us_per_row"] / small["seed_us_per_row"], 3)
                if large["seed_us_per_row"] and small["seed_us_per_row"] else None)
        steps.append({"from_rows": small["rows"], "to_rows": large["rows"], "per_row_ratio": ratios,
                      "seed_per_row_ratio": seed, "peak_rss_ratio": rss,
                      "within_goal": {k: v <= GOAL_PER_ROW_RATIO for k, v in ratios.items()}})
    return {"schema": 1, "goal_per_row_ratio": GOAL_PER_ROW_RATIO, "sizes": sizes, "steps": steps}


def markdown(scale: dict[str, Any]) -> str:
    """The per-row table: one row per scenario, one column per size, then the ratio of each step."""
    sizes, steps = scale["sizes"], scale["steps"]
    keys = sorted({k for s in sizes for k in s["per_row_us"]})
    head = ["scenario (µs per row)",
            *[render.rows(s["rows"]) + (f" (median of {len(s['runs'])})" if s.get("runs") else "")
              + (" (partial)" if s.get("status") == "RUNNING" else "") for s in sizes],
            *[f"{render.rows(st['to_rows'])} ÷ {render.rows(st['from_rows'])}" for st in steps]]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]

    def cell(value: float | None, fmt: str) -> str:
        return "–" if value is None else format(value, fmt)

    for key in keys:
        cells = [cell(s["per_row_us"].get(key), ",.1f") for s in sizes]
        cells += [cell(st["per_row_ratio"].get(key), ".2f") + "×" for st in steps]
        lines.append(f"| {key.replace('_0_1pct_', ' 0.1% ').replace('_', ' ')} | " + " | ".join(cells) + " |")
    lines.append("| seeding | " + " | ".join(cell(s["seed_us_per_row"], ",.1f") for s in sizes) + " | "
                 + " | ".join(cell(st["seed_per_row_ratio"], ".2f") + "×" for st in steps) + " |")
    lines.append("| peak RSS of a whole sweep (MiB) | " + " | ".join(cell(s["peak_rss_mib"], ",.1f") for s in sizes)
                 + " | " + " | ".join(cell(st["peak_rss_ratio"], ".2f") + "×" for st in steps) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batch_assets.bench.scaling", description=__doc__.splitlines()[0])
    parser.add_argument("reports", type=Path, nargs="+")
    parser.add_argument("--output", type=Path, required=True, help="the merged JSON")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the per-row table here")
    args = parser.parse_args(argv)
    try:
        reports = [json.loads(p.read_text()) for p in args.reports]
        scale = merge(reports)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    args.output.write_text(json.dumps(scale, indent=2) + "\n")
    if args.markdown is not None:
        args.markdown.write_text(markdown(scale))
    print(json.dumps({"status": "SUCCESS", "sizes": [s["rows"] for s in scale["sizes"]],
                      "output": str(args.output)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
