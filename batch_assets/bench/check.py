"""Is a bench report complete and consistent? Never: was it fast?

    python -m batch_assets.bench.check REPORT.json [--allow-missing queue] [--page docs/bench/index.md]

Checks that every section is there, that the counts agree with each other and
with the sizes asked for (a first computation changes every row, a second run
writes nothing, the config-change pre-check accounts for every row it did not
decrypt, ...), that every explained query uses an index, that the markdown
table and the charts beside the report were made from it, and, with
--page, that the benchmarks page shows the same tables between its markers
(`--readme` is the same option, by its former name). Speeds are only required to
be positive numbers. Exit 0 when all hold, 1 with one line per problem, 2 on
bad usage.

A partial report (`batch-assets bench --only ...`) names the sections it ran
under `only`: it is held to those sections alone, and must not hold others. A
report without `only` must have every section.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from batch_assets.bench import render
from batch_assets.bench.check_services import check_outbox, check_queue, check_startup
from batch_assets.bench.checker import Checker, close
from batch_assets.bench.options import SECTIONS

OPTIONAL_SECTIONS = ("queue",)
EXPECTED_PLANS = ("delta first page", "delta next page", "full first page", "full next page", "payment claim")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_report(report: dict[str, Any], *, allow_missing: tuple[str, ...] = ()) -> list[str]:
    """Every problem of the report, one message each (empty: complete and consistent)."""
    c = Checker()
    c.that(report.get("schema") == 2, f"report.schema must be 2, got {report.get('schema')!r}")
    c.that(report.get("status") == "SUCCESS", f"report.status must be SUCCESS, got {report.get('status')!r}")
    for key in ("rows", "small_rows", "page_size", "seed_s", "duration_s"):
        c.positive(report, key, "report")
    for key in ("command", "created_at", "run_date", "machine"):
        c.that(bool(report.get(key)), f"report.{key} is missing")
    rows, workers = report.get("rows", 0), report.get("workers") or []
    c.that(bool(workers), "report.workers is empty")
    c.that(report.get("small_rows", 0) < rows, "report.small_rows must be below report.rows")
    ran = _sections_run(c, report)
    if "sweep" in ran:
        _check_sweep(c, report, rows, workers)
    if "references" in ran:
        _check_references(c, report, rows)
    if "startup" in ran:
        check_startup(c, report)
    _check_checks(c, report, rows, workers, ran)
    if "queue" in ran:
        check_queue(c, report, allow_missing)
    if "outbox" in ran:
        check_outbox(c, report)
    for name in SECTIONS:
        if name not in ran:
            c.that(not _present(report, name), f"report has the {name} section but report.only does not name it")
    return c.problems


def _present(report: dict[str, Any], section: str) -> bool:
    """Does the report hold figures of this section (where it puts them)?"""
    checks = report.get("checks") or {}
    if section == "plans":
        return bool(checks.get("plans"))
    if section == "rss":
        return bool(checks.get("peak_rss"))
    if section == "startup":  # the queue's CLI drain lives under startup too
        return bool({k for k in report.get("startup") or {} if not k.startswith("cli_queue")})
    return bool(report.get(section))


def _sections_run(c: Checker, report: dict[str, Any]) -> tuple[str, ...]:
    """The sections the report must have: every one, unless it says it is a partial run (`only`, from --only)."""
    if "only" not in report:
        return SECTIONS
    only = report["only"]
    if not c.that(isinstance(only, list) and bool(only) and all(n in SECTIONS for n in only),
                  f"report.only must list sections among {', '.join(SECTIONS)}, got {only!r}"):
        return SECTIONS
    c.that(f"--only {','.join(only)}" in str(report.get("command")),
           f"report.command {report.get('command')!r} does not say --only {','.join(only)}")
    return tuple(only)


def _check_sweep(c: Checker, report: dict[str, Any], rows: int, workers: list[int]) -> None:
    sweep = c.section(report, "sweep")
    floor = (report.get("references") or {}).get("floor") or {}
    pages = math.ceil(rows / max(report.get("page_size", 1), 1))
    for w in workers:
        for kind in ("first_computation", "steady_state"):
            name = render.sweep_key(kind, w)
            entry = c.section(sweep, name, "sweep")
            if not entry:
                continue
            where = f"sweep.{name}"
            for key in ("rows_per_s", "sweep_s", "engine_duration_s", "statements_per_page",
                        "data_statements_per_page"):
                c.positive(entry, key, where)
            c.that(entry.get("scanned") == rows, f"{where}.scanned is {entry.get('scanned')}, the table has {rows}")
            c.that(entry.get("decrypted") == rows, f"{where}.decrypted is {entry.get('decrypted')}, not {rows}")
            c.that(entry.get("failed") == 0, f"{where}.failed is {entry.get('failed')}, not 0")
            c.that(entry.get("pages") == pages, f"{where}.pages is {entry.get('pages')}, expected {pages}")
            expected = rows if kind == "first_computation" else 0
            c.that(entry.get("changed") == expected, f"{where}.changed is {entry.get('changed')}, expected {expected}")
            c.that(entry.get("statements_per_page", 0) >= entry.get("data_statements_per_page", 0) >= 1,
                   f"{where}: statements per page must count at least the data statements (>= 1)")
            ref = floor.get(f"full_{kind}") or {}
            if ref.get("sweep_s") and entry.get("sweep_s"):
                c.that(close(entry.get("floor_time_ratio", -1), entry["sweep_s"] / ref["sweep_s"]),
                       f"{where}.floor_time_ratio does not equal sweep_s / the floor's sweep_s")
    delta = c.section(sweep, "delta_500_due", "sweep")
    if delta:
        c.that(delta.get("changed") == 500 and delta.get("scanned") == 500,
               f"sweep.delta_500_due must read and change the 500 due rows, got scanned={delta.get('scanned')} "
               f"changed={delta.get('changed')}")
        c.positive(delta, "sweep_s", "sweep.delta_500_due")
    _check_permille_delta(c, sweep, rows, workers)
    _check_growth(c, sweep, rows, workers)
    cc = c.section(sweep, "config_change", "sweep")
    if cc:
        c.that(cc.get("scanned") == rows, f"sweep.config_change.scanned is {cc.get('scanned')}, not {rows}")
        c.that(cc.get("decrypted", 0) + cc.get("skipped_by_pre_check", -1) == cc.get("scanned"),
               "sweep.config_change: decrypted + skipped_by_pre_check must equal scanned")
        c.that(cc.get("skipped_by_pre_check", 0) > 0, "sweep.config_change: the pre-check skipped no row")
        c.that(0 < cc.get("changed", 0) <= cc.get("decrypted", 0),
               "sweep.config_change.changed must be positive and at most the rows decrypted")
        c.that(cc.get("workers") in workers, "sweep.config_change.workers is not one of report.workers")
        c.positive(cc, "rows_per_s", "sweep.config_change")


def _check_permille_delta(c: Checker, sweep: dict[str, Any], rows: int, workers: list[int]) -> None:
    """The 0.1%-due delta of each worker count, in reports that have it: it reads and changes exactly
    the rows // 1000 rows made due."""
    due = max(1, rows // 1000)
    for w in workers:
        entry = sweep.get(f"delta_0_1pct_due_w{w}")
        if entry is None:
            continue
        where = f"sweep.delta_0_1pct_due_w{w}"
        c.that(entry.get("scanned") == due and entry.get("changed") == due,
               f"{where} must read and change the {due} due rows, got scanned={entry.get('scanned')} "
               f"changed={entry.get('changed')}")
        c.positive(entry, "sweep_s", where)


def _check_growth(c: Checker, sweep: dict[str, Any], rows: int, workers: list[int]) -> None:
    """The tables each full sweep left (reports that have them): a first computation updates each row once and
    inserts one event per row; a steady state writes no tuple at all (no row rewritten unchanged)."""
    for w in workers:
        for kind, expected in (("first_computation", rows), ("steady_state", 0)):
            name = render.sweep_key(kind, w)
            tables = (sweep.get(name) or {}).get("tables")
            if not tables:
                continue
            customers, outbox = tables.get("customers") or {}, tables.get("outbox_events") or {}
            c.that(customers.get("updated") == expected,
                   f"sweep.{name}.tables.customers.updated is {customers.get('updated')}, expected {expected}")
            c.that(outbox.get("inserted") == expected,
                   f"sweep.{name}.tables.outbox_events.inserted is {outbox.get('inserted')}, expected {expected}")
            c.that(0 <= customers.get("hot_updated", -1) <= customers.get("updated", -1),
                   f"sweep.{name}.tables.customers.hot_updated must be between 0 and updated")


def _check_references(c: Checker, report: dict[str, Any], rows: int) -> None:
    refs = c.section(report, "references")
    naive = c.section(refs, "naive", "references")
    if naive:
        for key in ("sample_rows", "sample_s", "sample_rows_per_s", "per_row_ms", "estimated_s",
                    "estimated_rows_per_s"):
            c.positive(naive, key, "references.naive")
        c.that(naive.get("table_rows") == rows, "references.naive.table_rows is not report.rows")
        c.that(naive.get("sample_failed") == 0, "references.naive.sample_failed must be 0")
        c.that(len(naive.get("offset_page_ms") or []) >= 2, "references.naive.offset_page_ms needs 2+ samples")
        linear = rows * naive.get("per_row_ms", 0) / 1000
        c.that(naive.get("estimated_s", 0) >= linear - 0.1,
               "references.naive.estimated_s is below its own per-row cost times the rows")
    floor = c.section(refs, "floor", "references")
    for kind, changed in (("first_computation", rows), ("steady_state", 0)):
        entry = c.section(floor, f"full_{kind}", "references.floor") if floor else {}
        if entry:
            where = f"references.floor.full_{kind}"
            c.positive(entry, "rows_per_s", where)
            c.that(entry.get("scanned") == rows, f"{where}.scanned is {entry.get('scanned')}, not {rows}")
            c.that(entry.get("changed") == changed, f"{where}.changed is {entry.get('changed')}, not {changed}")
            c.that(entry.get("outbox_events") == changed, f"{where}.outbox_events is not {changed}")


def _check_checks(c: Checker, report: dict[str, Any], rows: int, workers: list[int],
                  ran: tuple[str, ...] = SECTIONS) -> None:
    checks = c.section(report, "checks")
    if "plans" in ran:
        _check_plans(c, checks)
    if "rss" in ran:
        _check_rss(c, report, checks, rows)
    if "sweep" in ran:
        _check_second_run_writes(c, checks, workers)


def _check_plans(c: Checker, checks: dict[str, Any]) -> None:
    plans = {p.get("query"): p for p in checks.get("plans") or []}
    for name in EXPECTED_PLANS:
        plan = plans.get(name)
        if plan is None:
            c.that(False, f"checks.plans has no EXPLAIN of the {name} query")
        else:
            c.that(plan.get("index_scan") is True,
                   f"checks.plans: the {name} query is not an index scan "
                   f"({plan.get('other_scans') or plan.get('error') or 'no index'})")


def _check_rss(c: Checker, report: dict[str, Any], checks: dict[str, Any], rows: int) -> None:
    rss = c.section(checks, "peak_rss", "checks")
    if rss:
        small, large = rss.get("small") or {}, rss.get("large") or {}
        c.that(small.get("rows") == report.get("small_rows") and large.get("rows") == rows,
               "checks.peak_rss must be measured at report.small_rows and report.rows")
        c.that(small.get("scanned") == small.get("rows") and large.get("scanned") == large.get("rows"),
               "checks.peak_rss: each sweep must scan its whole table")
        if c.positive(small, "peak_rss_mib", "checks.peak_rss.small") and c.positive(
                large, "peak_rss_mib", "checks.peak_rss.large"):
            c.that(close(rss.get("ratio_large_over_small", -1), large["peak_rss_mib"] / small["peak_rss_mib"]),
                   "checks.peak_rss.ratio_large_over_small is not large / small")


def _check_second_run_writes(c: Checker, checks: dict[str, Any], workers: list[int]) -> None:
    writes = checks.get("second_run_writes") or {}
    for w in workers:
        name = f"full_steady_state_w{w}"
        counts = writes.get(name)
        if not (isinstance(counts, dict) and counts):
            c.that(False, f"checks.second_run_writes.{name} is missing")
        else:
            c.that(all(v == 0 for v in counts.values()),
                   f"checks.second_run_writes.{name}: a second run wrote rows {counts}")


def check_outputs(report: dict[str, Any], directory: Path) -> list[str]:
    """The table and charts beside a report were made from it."""
    c = Checker()
    table = directory / render.TABLE_FILE
    if c.that(table.is_file(), f"{table} is missing"):
        c.that(table.read_text() == render.markdown(report),
               f"{table} was not rendered from this report (run: batch-assets bench --render ... )")
    for name in render.CHART_FILES.values():
        path = directory / name
        if c.that(path.is_file(), f"{path} is missing"):
            c.that(path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 2000, f"{path} is not a PNG chart")
    return c.problems


def check_page(report: dict[str, Any], page: Path) -> list[str]:
    """The docs page shows the report's tables, between its markers."""
    shown = render.page_tables(page)
    if shown is None:
        return [f"{page} has no bench tables between {render.TABLES_BEGIN!r} and {render.TABLES_END!r}"]
    if shown != render.tables(report):
        return [f"{page} does not show this report's tables (run: batch-assets bench --render REPORT "
                f"--output-dir {page.parent} --readme {page})"]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batch_assets.bench.check", description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--allow-missing", action="append", default=[], choices=OPTIONAL_SECTIONS,
                        help="a section that may be 'not measured' (only: queue)")
    parser.add_argument("--page", "--readme", dest="page", type=Path, default=None,
                        help="also check that this docs page (docs/bench/index.md) shows the tables")
    args = parser.parse_args(argv)
    try:
        report = json.loads(args.report.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: cannot read {args.report}: {type(exc).__name__}", file=sys.stderr)
        return 2
    problems = check_report(report, allow_missing=tuple(args.allow_missing))
    latest = args.report.parent / render.LATEST_JSON
    if latest.is_file() and json.loads(latest.read_text()) == report:
        problems += check_outputs(report, args.report.parent)
    else:
        problems.append(f"{args.report} is not the latest report of its folder ({latest}): its table and charts "
                        "cannot be checked")
    if args.page is not None:
        problems += check_page(report, args.page)
    for problem in problems:
        print(f"FAIL {problem}")
    if problems:
        print(f"{args.report}: {len(problems)} problem(s)")
        return 1
    allowed = f" (allowed missing: {', '.join(args.allow_missing)})" if args.allow_missing else ""
    print(f"{args.report}: complete and consistent{allowed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
