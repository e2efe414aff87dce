"""The bench's command line: sizes (full or `--quick`), where the report goes, and their bounds."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from batch_assets.errors import ConfigError

DEFAULT_OUTPUT_DIR = "bench-results"

# Sizes of a full run (the figures) and of a CI-sized `--quick` run (a couple of minutes
# on 2 cores). An explicit --rows etc. overrides either.
FULL_SIZES = {"rows": 1_000_000, "small_rows": 100_000, "naive_sample": 20_000, "queue_payments": 100_000}
QUICK_SIZES = {"rows": 20_000, "small_rows": 5_000, "naive_sample": 2_000, "queue_payments": 5_000}

# Bounds of every knob: a bad value is one clear line and exit 2 before anything is written.
MIN_ROWS, MAX_ROWS = 10_000, 20_000_000
MIN_SMALL_ROWS = 1_000
MIN_NAIVE_SAMPLE = 500
MIN_QUEUE_PAYMENTS, MAX_QUEUE_PAYMENTS = 100, 5_000_000
MAX_WORKERS = 32
STARTUP_RUNS = 4
"""CLI runs that measure Dagster run start-up: the first on a fresh instance, the next on a warm one."""

SECTIONS = ("references", "sweep", "declared", "plans", "startup", "queue", "outbox", "rss")
"""The sections of a run, in the order they run; seeding always runs. `--only` picks some of them (the scaling runs: the
scaling runs need `sweep,rss` only, the rest would take hours at 10M rows)."""
NEEDS = {"startup": ("references",)}
"""Sections that read another's figures: the CLI's steady state is compared with the floor's time."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `batch-assets bench`."""
    parser.add_argument("--quick", action="store_true",
                        help="CI-sized run: 20k/5k rows, 2k naive sample, 5k payments (full: 1M/100k, 20k, 100k)")
    parser.add_argument("--rows", type=int, default=None, help="large size (default 1,000,000; --quick 20,000)")
    parser.add_argument("--small-rows", type=int, default=None,
                        help="small size of the peak-RSS comparison (default 100,000; --quick 5,000)")
    parser.add_argument("--naive-sample", type=int, default=None,
                        help="rows the naive reference job runs on before it is scaled (default 20,000)")
    parser.add_argument("--queue-payments", type=int, default=None,
                        help="payments of the queue section (default 100,000; --quick 5,000)")
    parser.add_argument("--workers", default="1,4", help="worker counts to compare (default 1,4)")
    parser.add_argument("--run-date", default=None, help="YYYY-MM-DD (default: today in BATCH_ASSETS_TIMEZONE)")
    parser.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR,
                        help=f"where the JSON report, markdown table and charts go (default {DEFAULT_OUTPUT_DIR})")
    parser.add_argument("--render", metavar="REPORT_JSON", default=None,
                        help="measure nothing: render the table and charts of an existing report into --output-dir")
    parser.add_argument("--readme", metavar="PAGE_MD", default=None,
                        help="also replace the bench tables between the markers of this page (docs/bench/index.md)")
    parser.add_argument("--only", default=None, metavar="SECTION[,SECTION...]",
                        help="run only these sections (seeding always runs): " + ",".join(SECTIONS)
                        + "; the report lists them under 'only' (default: all)")
    parser.add_argument("--note", default=None,
                        help="one line about the conditions, kept in the report (e.g. other work on the machine)")


@dataclass(frozen=True)
class BenchOptions:
    """Validated options of one measuring run."""

    quick: bool
    rows: int
    small_rows: int
    naive_sample: int
    queue_payments: int
    workers: tuple[int, ...]
    run_date: date | None
    output_dir: Path
    readme: Path | None
    note: str | None = None
    only: tuple[str, ...] | None = None
    """The sections to run, in SECTIONS order (None: every section, a full report)."""

    def runs(self, section: str) -> bool:
        return self.only is None or section in self.only


def _size(args: argparse.Namespace, name: str) -> int:
    value = getattr(args, name)
    if value is None:
        return (QUICK_SIZES if args.quick else FULL_SIZES)[name]
    return int(value)


def options_from(args: argparse.Namespace) -> BenchOptions:
    """Validate the arguments; raises ConfigError (exit 2) before anything is read or written."""
    rows, small = _size(args, "rows"), _size(args, "small_rows")
    naive, payments = _size(args, "naive_sample"), _size(args, "queue_payments")
    if not MIN_ROWS <= rows <= MAX_ROWS:
        raise ConfigError(f"must be between {MIN_ROWS:,} and {MAX_ROWS:,}, got {rows:,}", field="rows")
    if not MIN_SMALL_ROWS <= small < rows:
        raise ConfigError(f"must be at least {MIN_SMALL_ROWS:,} and below --rows ({rows:,}), got {small:,}",
                          field="small-rows")
    if not MIN_NAIVE_SAMPLE <= naive <= rows:
        raise ConfigError(f"must be between {MIN_NAIVE_SAMPLE:,} and --rows ({rows:,}), got {naive:,}",
                          field="naive-sample")
    if not MIN_QUEUE_PAYMENTS <= payments <= MAX_QUEUE_PAYMENTS:
        raise ConfigError(f"must be between {MIN_QUEUE_PAYMENTS:,} and {MAX_QUEUE_PAYMENTS:,}, got {payments:,}",
                          field="queue-payments")
    try:
        workers = tuple(int(w) for w in args.workers.split(",") if w.strip())
    except ValueError:
        raise ConfigError(f"{args.workers!r} is not a comma-separated list of integers", field="workers") from None
    if not workers or any(not 1 <= w <= MAX_WORKERS for w in workers) or len(set(workers)) != len(workers):
        raise ConfigError(f"must be distinct counts between 1 and {MAX_WORKERS}, got {args.workers!r}",
                          field="workers")
    run_date = None
    if args.run_date is not None:
        try:
            run_date = date.fromisoformat(args.run_date)
        except ValueError:
            raise ConfigError(f"{args.run_date!r} is not a date in YYYY-MM-DD form", field="run-date") from None
    readme = Path(args.readme) if args.readme else None
    if readme is not None and not readme.is_file():
        raise ConfigError(f"{readme} is not a file", field="readme")
    return BenchOptions(
        quick=bool(args.quick), rows=rows, small_rows=small, naive_sample=naive, queue_payments=payments,
        workers=tuple(sorted(workers)), run_date=run_date, output_dir=Path(args.output_dir), readme=readme,
        note=(args.note or "").strip()[:300] or None, only=parse_only(getattr(args, "only", None)),
    )


def parse_only(text: str | None) -> tuple[str, ...] | None:
    """`--only a,b`: known, distinct section names with what they need, in SECTIONS order (None: all sections)."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        raise ConfigError(f"unknown section(s) {', '.join(map(repr, unknown)) or 'none given'}; "
                          f"choose from {', '.join(SECTIONS)}", field="only")
    for name in names:
        missing = [n for n in NEEDS.get(name, ()) if n not in names]
        if missing:
            raise ConfigError(f"{name} needs {', '.join(missing)} too", field="only")
    return tuple(n for n in SECTIONS if n in names)
