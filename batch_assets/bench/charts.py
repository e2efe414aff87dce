"""PNG charts of a bench report (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: CI and servers have no display

import matplotlib.pyplot as plt  # noqa: E402 — after the backend is chosen
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from batch_assets.bench.render import rate, rows, seconds, sweep_key  # noqa: E402

NAIVE, FLOOR, STARTUP = "#9e9e9e", "#f28e2b", "#bab0ac"
PRODUCT = ("#a0cbe8", "#4e79a7", "#2b4c7e", "#1b2f50")
DPI = 110
TIME_TICKS = ((0.1, "0.1 s"), (1, "1 s"), (10, "10 s"), (60, "1 min"), (600, "10 min"), (3600, "1 h"),
              (36000, "10 h"))


def _product_color(i: int) -> str:
    return PRODUCT[min(i, len(PRODUCT) - 1)]


def _subtitle(report: dict[str, Any]) -> str:
    return f"{report['command']} · {report['created_at'][:10]} · {report['machine']['cpus']} CPUs"


def _thousands(ax: Any) -> None:
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))


def _bar_labels(ax: Any, bars: Any, labels: list[str]) -> None:
    for bar, label in zip(bars, labels, strict=True):
        ax.annotate(label, (bar.get_x() + bar.get_width(), bar.get_y() + bar.get_height() / 2),
                    xytext=(4, 0), textcoords="offset points", va="center", fontsize=8.5)


def throughput_chart(report: dict[str, Any], path: Path) -> Path:
    """Rows/s per scenario and the time for the whole table, product beside the floor and the naive job."""
    sweep, refs, workers = report["sweep"], report["references"], report["workers"]
    floor, naive = refs.get("floor", {}), refs.get("naive")
    n = report["rows"]
    candidates: list[tuple[str, str, dict[str, Any] | None, str]] = []  # (group, label, entry, color)
    for kind, group in (("first_computation", "first computation"), ("steady_state", "steady state")):
        if naive:
            candidates.append((group, "naive job (seed 000), estimated",
                               {"rows_per_s": naive["estimated_rows_per_s"], "sweep_s": naive["estimated_s"]}, NAIVE))
        candidates.append((group, "single-stream floor", floor.get(f"full_{kind}"), FLOOR))
        for i, w in enumerate(workers):
            candidates.append((group, f"product, {w} worker{'s' if w > 1 else ''}", sweep.get(sweep_key(kind, w)),
                               _product_color(i + 1)))
    # The scenarios the report has (a section may be absent, e.g. no naive estimate).
    series = [(group, label, entry, color) for group, label, entry, color in candidates if entry]
    if not series:  # e.g. `--only queue`: nothing swept
        return _not_measured_chart(report, path, "Customer-status sweep",
                                   "Sweeps not measured\n(neither the product's sweeps nor the references are in "
                                   "this run)")

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 6.2), dpi=DPI)
    ypos, yticks, ylabels, y = [], [], [], 0.0
    last_group = None
    for group, label, _, _ in series:
        if last_group is not None and group != last_group:
            y += 0.8  # a gap between the two groups
        ypos.append(y)
        yticks.append(y)
        ylabels.append(f"{group}: {label}")
        last_group = group
        y += 1
    colors = [s[3] for s in series]

    bars = left.barh(ypos, [s[2]["rows_per_s"] for s in series], color=colors)
    _bar_labels(left, bars, [rate(s[2]["rows_per_s"]) for s in series])
    left.set_yticks(yticks, ylabels, fontsize=9)
    left.invert_yaxis()
    left.set_xlabel("rows per second (higher is better)")
    left.set_title(f"Throughput of a full sweep over {rows(n)} rows", fontsize=11)
    left.set_xlim(0, max(s[2]["rows_per_s"] for s in series) * 1.3)
    _thousands(left)
    left.grid(axis="x", alpha=0.3)

    startup = (report.get("startup") or {}).get("startup_s")
    engine_times = [s[2]["engine_duration_s"] if "engine_duration_s" in s[2] else s[2]["sweep_s"] for s in series]
    bars = right.barh(ypos, engine_times, color=colors)
    labels = [seconds(t) for t in engine_times]
    if startup:
        product = [i for i, s in enumerate(series) if s[1].startswith("product")]
        right.barh([ypos[i] for i in product], [startup] * len(product),
                   left=[engine_times[i] for i in product], color=STARTUP, hatch="//", edgecolor="white")
        for i in product:
            labels[i] = f"{seconds(engine_times[i])} + {seconds(startup)} start-up"
        extra = [startup if i in product else 0 for i in range(len(series))]
    else:
        extra = [0] * len(series)
    for bar, label, add in zip(bars, labels, extra, strict=True):
        right.annotate(label, (bar.get_width() + add, bar.get_y() + bar.get_height() / 2),
                       xytext=(4, 0), textcoords="offset points", va="center", fontsize=8.5)
    right.set_xscale("log")
    lo_x = min(engine_times) / 2
    hi_x = max(t + a for t, a in zip(engine_times, extra, strict=True)) * 5
    ticks = [t for t in TIME_TICKS if lo_x <= t[0] <= hi_x]
    right.set_xticks([t for t, _ in ticks], [label for _, label in ticks])
    right.xaxis.set_minor_formatter(NullFormatter())
    right.set_yticks(yticks, [""] * len(yticks))
    right.invert_yaxis()
    right.set_xlabel("time for the whole table (log scale, lower is better)")
    right.set_title(f"Time for {rows(n)} rows: engine + Dagster run start-up", fontsize=11)
    right.set_xlim(lo_x, hi_x)
    right.grid(axis="x", which="both", alpha=0.3)
    legend = [Patch(color=NAIVE, label="naive job of seed 000 (scaled from a sample)"),
              Patch(color=FLOOR, label="single-stream floor (1 connection)")]
    legend += [Patch(color=_product_color(i + 1), label=f"product engine, {w} worker(s)")
               for i, w in enumerate(workers)]
    if startup:
        legend.append(Patch(facecolor=STARTUP, hatch="//", edgecolor="white", label="Dagster run start-up (CLI)"))
    fig.legend(handles=legend, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle(f"Customer-status sweep: product vs floor vs naive job\n{_subtitle(report)}", fontsize=12)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def rss_chart(report: dict[str, Any], path: Path) -> Path:
    """Peak RSS of a whole sweep against the table size."""
    rss = report["checks"].get("peak_rss")
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=DPI)
    if not rss:
        _not_measured(ax, "peak RSS not measured")
    else:
        points = [rss["small"], rss["large"]]
        xs = [p["rows"] for p in points]
        ys = [p["peak_rss_mib"] for p in points]
        ax.plot(xs, ys, marker="o", markersize=8, color=PRODUCT[1], linewidth=2, label="peak RSS, product sweep")
        ax.plot(xs, [ys[0], ys[0] * xs[1] / xs[0]], linestyle="--", color=NAIVE, linewidth=1,
                label="if memory grew in proportion to the rows")
        for x, y_ in zip(xs, ys, strict=True):
            ax.annotate(f"{y_:.1f} MiB at {rows(x)} rows", (x, y_), xytext=(0, 10), textcoords="offset points",
                        ha="center", fontsize=9)
        ax.set_xscale("log")
        ax.set_xlim(xs[0] / 3, xs[1] * 3)
        ax.set_xticks(xs, [f"{rows(x)} rows" for x in xs])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(0, max(ys) * 1.5)
        ax.set_xlabel("rows in the table (log scale)")
        ax.set_ylabel("peak resident memory (MiB)")
        ax.set_title(f"Peak RSS of a whole first-computation sweep ({points[1].get('workers', 4)} workers, fresh "
                     f"process)\nratio {rss['ratio_large_over_small']:.2f} for {xs[1] // xs[0]}× the rows; "
                     f"{_subtitle(report)}", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="lower right", fontsize=9, framealpha=1)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def queue_chart(report: dict[str, Any], path: Path) -> Path:
    """Queue throughput (product, raw SKIP LOCKED floor, PgQueuer reference, HTTP stub) and pickup latency."""
    q = report.get("queue") or {}
    if q.get("status") != "measured":
        return _not_measured_chart(report, path, "Payment queue",
                                   f"Queue section not measured\n{q.get('reason', 'no queue section in the report')}")
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2), dpi=DPI, gridspec_kw={"width_ratios": [2.2, 1]})
    lo, hi = q["pgqueuer_reference_per_s"]
    stub = q["http_stub"]
    labels = [f"product ({q['worker_processes']} worker processes)", "raw SKIP LOCKED floor",
              "PgQueuer (published, not measured here)",
              f"HTTP stub ({stub['latency_ms']} ms/call, concurrency {stub['concurrency']})"]
    values = [q["product_per_s"], q["floor_per_s"], hi - lo, stub["per_s"]]
    lefts = [0, 0, lo, 0]  # PgQueuer's published figure is a range: drawn from its low to its high end
    colors = [PRODUCT[1], FLOOR, "white", PRODUCT[3]]
    bars = left.barh(range(4), values, left=lefts, color=colors, edgecolor=["none", "none", NAIVE, "none"])
    bars[2].set_hatch("..")
    target = stub["target_per_s"]
    left.plot([target, target], [2.55, 3.45], color="#e15759", linestyle="--", linewidth=1.5)
    left.annotate(f"target {target:,.0f}/s", (target, 2.6), xytext=(4, 0), textcoords="offset points",
                  color="#e15759", fontsize=8.5, va="top")
    texts = [rate(values[0], "payments/s") + f" ({q['ratio']:.2f}× floor)", rate(values[1], "payments/s"),
             f"{lo / 1000:.1f}k–{hi / 1000:.1f}k jobs/s", rate(values[3], "payments/s")]
    for i, (bar, text) in enumerate(zip(bars, texts, strict=True)):
        end = bar.get_x() + bar.get_width()
        if i == 3:
            end = max(end, target)  # keep the stub's figure clear of its target line
        left.annotate(text, (end, bar.get_y() + bar.get_height() / 2), xytext=(6, 0),
                      textcoords="offset points", va="center", fontsize=8.5)
    left.set_yticks(range(4), labels, fontsize=9)
    left.invert_yaxis()
    left.set_xlim(0, max(q["product_per_s"], q["floor_per_s"], hi, stub["per_s"], target) * 1.35)
    _thousands(left)
    left.set_xlabel("payments per second (higher is better)")
    left.set_title(f"Queue throughput, {q['payments']:,} payments", fontsize=11)
    left.grid(axis="x", alpha=0.3)

    lat = q["pickup_latency_ms"]
    bars = right.bar(["p50", "p99"], [lat["p50"], lat["p99"]], color=[PRODUCT[0], PRODUCT[2]])
    for bar in bars:
        right.annotate(f"{bar.get_height():.1f} ms", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                       xytext=(0, 4), textcoords="offset points", ha="center", fontsize=9)
    right.set_ylim(0, max(lat["p50"], lat["p99"]) * 1.3 or 1)
    right.set_ylabel("milliseconds (lower is better)")
    right.set_title(f"Pickup latency, insert → claim\n({lat['samples']} samples)", fontsize=11)
    right.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Payment queue: product vs raw SKIP LOCKED floor\n{_subtitle(report)}", fontsize=12)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _not_measured(ax: Any, text: str) -> None:
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=11, wrap=True, transform=ax.transAxes)


def _not_measured_chart(report: dict[str, Any], path: Path, title: str, text: str) -> Path:
    """A whole chart that only says what the run did not measure (a partial run, `--only`)."""
    fig, ax = plt.subplots(figsize=(9, 3.2), dpi=DPI)
    _not_measured(ax, text)
    fig.suptitle(f"{title}\n{_subtitle(report)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def draw_all(report: dict[str, Any], output_dir: Path, names: dict[str, str]) -> list[Path]:
    """Every chart of the report into `output_dir`, under the given file names."""
    return [
        throughput_chart(report, output_dir / names["throughput"]),
        rss_chart(report, output_dir / names["rss"]),
        queue_chart(report, output_dir / names["queue"]),
    ]
