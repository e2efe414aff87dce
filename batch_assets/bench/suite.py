"""`batch-assets bench`: every measurement of the report, in one command, on one dedicated database.

Order of a run (each step prints a progress line on stderr):

1. seed N fresh customers with COPY on a scratch database next to the configured one;
2. the naive job of seed 000 on a sample, and the single-stream floor (first computation,
   then steady state) on the same rows;
3. the product's sweep: full first computation and full steady state with each worker count
   (counting statements per page and the rows a second run writes), delta with 500 due, and
   config-change with its pre-check after a rules change;
4. EXPLAIN of the delta, full-page and payment-claim queries;
5. Dagster run start-up of a CLI sweep, on its own, and a steady-state full sweep through the CLI against the floor;
6. the queue section (payments domain) and the same queue drained by `queue work --drain` processes, then the
   outbox section (events/s to each broker with confirms, beside a raw client loop, and the drain of a first
   computation's events, up to 1M, on a database of its own);
7. peak RSS of a whole sweep at N rows and at the small size, each in a fresh process;
8. the JSON report, the markdown table and the charts under --output-dir.

`--only sweep,rss` runs only those sections (options.SECTIONS) after the seeding, as the scaling runs at 10M rows
do; the report lists them under `only`, and the checker holds it to those sections alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from batch_assets.bench import memory, outputs, plans, references, render, scratch, startup, sweeps
from batch_assets.bench.options import STARTUP_RUNS, BenchOptions, options_from
from batch_assets.bench.outbox import drain_section, outbox_section
from batch_assets.bench.queue import queue_section
from batch_assets.errors import EXIT_OK, ConfigError
from batch_assets.settings import Settings

DUE_ROWS = 500
PERMILLE_DELTA = "delta_0_1pct_due"
"""Key prefix (+ _w<workers>) of the delta with 0.1% of the rows due (rows // 1000), run with each worker count:
its cost should follow the due rows, not the table."""
COMMAND = "batch-assets bench"
PARTIAL_JSON = "partial.json"


class Progress:
    """Numbered progress lines on stderr, with the time since the bench started."""

    def __init__(self, err: Callable[[str], None], steps: int,
                 on_step: Callable[[str, float], None] | None = None) -> None:
        self.err, self.steps, self.step, self.on_step, self.running = err, steps, 0, on_step, ""
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        self.err(f"bench [{time.perf_counter() - self.started:6.1f} s] {message}")

    def next(self, message: str) -> None:
        self.step += 1
        self.running = message
        self.keep()  # the steps before this one are done
        self(f"({self.step}/{self.steps}) {message}")

    def keep(self) -> None:
        """Hand what was measured so far to on_step (the partial report), e.g. after a long scenario."""
        if self.on_step is not None:
            self.on_step(self.running, time.perf_counter() - self.started)


def partial_saver(output_dir: Path, report: dict[str, Any]) -> Callable[[str, float], None]:
    """Keep what a long run measured so far in <output_dir>/partial.json, rewritten at each step: a 10M run takes
    hours, and one stopped before its end keeps the scenarios it finished (status RUNNING, which the checker
    rejects; the scaling merge marks the size as partial). A run that ends removes it."""
    path = output_dir / PARTIAL_JSON

    def save(running: str, elapsed_s: float) -> None:
        output_dir.mkdir(parents=True, exist_ok=True)
        snapshot = dict(report, status="RUNNING", running=running, duration_s=round(elapsed_s, 1))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(snapshot, indent=2, default=str) + "\n")
        tmp.replace(path)

    return save


def run_bench(
    args: argparse.Namespace,
    settings: Settings,
    *,
    emit: Callable[[dict[str, Any]], None],
    err: Callable[[str], None],
) -> int:
    """Measure (or, with --render, only redraw) and write the report; the report is the last stdout line."""
    if args.render:
        return _render_only(args, err=err, emit=emit)
    options = options_from(args)
    report = measure(options, settings, err=err)
    written = outputs.write_outputs(report, options.output_dir, readme=options.readme)
    (options.output_dir / PARTIAL_JSON).unlink(missing_ok=True)
    err("bench: wrote " + ", ".join(str(p) for p in written))
    emit(report)
    return EXIT_OK


def _render_only(args: argparse.Namespace, *, err: Callable[[str], None],
                 emit: Callable[[dict[str, Any]], None]) -> int:
    source = Path(args.render)
    try:
        report = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read a report from {source}: {type(exc).__name__}", field="render") from None
    readme = Path(args.readme) if args.readme else None
    if readme is not None and not readme.is_file():
        raise ConfigError(f"{readme} is not a file", field="readme")
    written = outputs.write_outputs(report, Path(args.output_dir), readme=readme)
    err("bench: rendered " + ", ".join(str(p) for p in written))
    emit({"status": "SUCCESS", "rendered": [str(p) for p in written]})
    return EXIT_OK


def _postgres_version(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        return str(conn.exec_driver_sql("SHOW server_version").scalar_one()).split()[0]


def measure(options: BenchOptions, settings: Settings, *, err: Callable[[str], None]) -> dict[str, Any]:
    """Run every measurement and return the report (nothing is written to disk here)."""
    from batch_assets.db.engine import create_engine, resolve_database_url
    from batch_assets.db.migrate import LIBRARY, migrate
    from batch_assets.reference.customer_status.crypto import DobCipher, decode_key, generate_key_text
    from batch_assets.reference.customer_status.seed import seed_customers
    from batch_assets.reference.migrations import REFERENCE
    from batch_assets.run_dates import today_in

    run_date = options.run_date or today_in(settings.timezone)
    key_text = generate_key_text()  # a throwaway key: bench data is synthetic
    cipher = DobCipher(decode_key(key_text))
    base_url = resolve_database_url(settings)
    report = _new_report(options, run_date)
    say = Progress(err, steps=_steps(options), on_step=partial_saver(options.output_dir, report))
    large: dict[str, Any] | None = None
    with scratch.scratch_database(base_url, scratch.scratch_name()) as url:
        engine = create_engine(url, pool_size=12)
        report["machine"]["postgres"] = _postgres_version(engine)
        migrate(engine, (LIBRARY, REFERENCE))
        say.next(f"seeding {options.rows:,} customers")
        seeded = seed_customers(engine, cipher, options.rows, run_date=run_date, seed=1)
        report["seed_s"] = round(seeded.duration_s, 2)
        scratch.vacuum(engine)
        if options.runs("references"):
            _measure_references(report, options, engine, url, cipher, run_date, say)
        if options.runs("sweep") or options.runs("declared"):
            _measure_sweeps(report, options, engine, cipher, run_date, say)
        if options.runs("plans"):
            say.next("EXPLAIN (FORMAT JSON) of the delta, full-page and payment-claim queries")
            report["checks"]["plans"] = [*plans.explain_sweep_reads(engine, run_date), plans.explain_claim(engine)]
        if options.runs("startup"):
            sweeps.run_sweep(engine, cipher, "full", run_date, max(options.workers))  # settled: the CLI's steady state
            scratch.vacuum(engine)
        engine.dispose()

        if options.runs("startup"):
            _measure_startup(report, options, url, key_text, run_date, say)
        if options.runs("queue"):
            _measure_queue(report, options, url, key_text, run_date, say)
        if options.runs("outbox"):
            outbox_engine = create_engine(url, pool_size=2)
            try:
                report["outbox"] = outbox_section(outbox_engine, quick=options.quick, progress=say)
            finally:
                outbox_engine.dispose()
            report["outbox"]["drain"] = drain_section(base_url, cipher, run_date, rows=options.rows,
                                                      workers=max(options.workers), progress=say)

        if options.runs("rss"):
            say.next(f"peak RSS of a whole sweep in a fresh process, at {options.rows:,} then "
                     f"{options.small_rows:,} rows")
            large = {"rows": options.rows, **memory.measure_rss(url, key_text, run_date)}
    if large is not None:
        with scratch.scratch_database(base_url, scratch.scratch_name()) as small_url:
            small_engine = create_engine(small_url, pool_size=4)
            migrate(small_engine, (LIBRARY, REFERENCE))
            seed_customers(small_engine, cipher, options.small_rows, run_date=run_date, seed=2)
            small_engine.dispose()
            small = {"rows": options.small_rows, **memory.measure_rss(small_url, key_text, run_date)}
        report["checks"]["peak_rss"] = {
            "small": small, "large": large,
            "ratio_large_over_small": round(large["peak_rss_mib"] / small["peak_rss_mib"], 3)}
    report["duration_s"] = round(time.perf_counter() - say.started, 1)
    say(f"done in {report['duration_s']:.0f} s")
    return report


def _steps(options: BenchOptions) -> int:
    """The numbered progress lines of a run: seeding, then one per section run (the sweep: one per worker count
    and three more, the declared form's counted with it)."""
    steps = 1 + sum(options.runs(s) for s in ("references", "plans", "startup", "queue", "rss"))
    if options.runs("sweep"):
        steps += len(options.workers) + 2
    return steps + options.runs("declared")


def _measure_startup(report: dict[str, Any], options: BenchOptions, url: str, key_text: str, run_date: date,
                     say: Progress) -> None:
    """Dagster run start-up on its own, then the CLI's wall time of a steady-state sweep against the floor's."""
    say.next(f"Dagster run start-up: {STARTUP_RUNS} CLI delta sweeps with nothing due, then the CLI's wall "
             "against the floor (a steady-state full sweep per worker count)")
    report["startup"] = startup.measure_startup(url, key_text, run_date, runs=STARTUP_RUNS)
    floor_s = report["references"]["floor"]["full_steady_state"]["sweep_s"]
    launcher = report["startup"]["launcher"]
    say(f"  start-up {report['startup']['startup_s']} s; through the resident launcher {launcher['startup_s']} s "
        f"(goal <= {startup.STARTUP_GOAL_S} s)")
    report["startup"]["cli_steady_state"] = [
        startup.measure_cli_sweep(url, key_text, run_date, workers=w, floor_s=floor_s, launcher=served)
        for w in options.workers for served in (False, True)]
    for probe in report["startup"]["cli_steady_state"]:
        via = "the launcher" if probe["launcher"] else "the CLI"
        say(f"  full sweep through {via}, steady state, {probe['workers']} worker(s): {probe['cli_wall_s']} s wall, "
            f"{probe['cli_wall_over_floor']}x the floor's {floor_s} s")


def _measure_queue(report: dict[str, Any], options: BenchOptions, url: str, key_text: str, run_date: date,
                   say: Progress) -> None:
    """The queue section, then the same queue drained through the CLI when the section could be measured."""
    say.next(f"queue section: {options.queue_payments:,} payments")
    report["queue"] = queue_section(url, payments=options.queue_payments, quick=options.quick, progress=say)
    if report["queue"]["status"] != "measured":
        say(f"  queue: {report['queue']['status']}: {report['queue']['reason']}")
        return
    say(f"  queue through the CLI: {startup.QUEUE_CLI_PROCESSES} `queue work --drain` processes")
    for key, served, rows in startup.CLI_QUEUE_PROBES:
        report.setdefault("startup", {})[key] = cli_queue = startup.measure_cli_queue(
            url, key_text, run_date, payments=options.queue_payments, floor_per_s=report["queue"]["floor_per_s"],
            launcher=served, rows=rows)
        say(f"  {'through the launcher: ' if served else ''}{'seed payments rows: ' if rows == 'seed' else ''}"
            f"{cli_queue['cli_wall_per_s']:,}/s by wall "
            f"({cli_queue['cli_wall_over_floor']}x the raw floor), {cli_queue['own_clock_per_s']:,}/s by the "
            "workers' own clock")


def _command(options: BenchOptions) -> str:
    """The command as run: --quick, and --only with the sections of a partial run."""
    only = f" --only {','.join(options.only)}" if options.only is not None else ""
    return COMMAND + (" --quick" if options.quick else "") + only


def _new_report(options: BenchOptions, run_date: date) -> dict[str, Any]:
    """The report's header: what was run, where, on how many rows; the sections are filled in by `measure`.
    A partial run (`--only`) names the sections it ran under `only`; a full report has no such key."""
    return {
        "schema": 2,
        "status": "SUCCESS",
        "command": _command(options),
        **({"only": list(options.only)} if options.only is not None else {}),
        "quick": options.quick,
        "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    **({"note": options.note} if options.note else {})},
        "rows": options.rows,
        "small_rows": options.small_rows,
        "workers": list(options.workers),
        "page_size": references.PAGE_SIZE,
        "run_date": run_date.isoformat(),
        "sweep": {},
        "references": {},
        "checks": {"second_run_writes": {}},
    }


def _measure_references(report: dict[str, Any], options: BenchOptions, engine: sa.Engine, url: str,
                        cipher: Any, run_date: date, say: Progress) -> None:
    """The naive job on a sample (scaled to the table) and the single-stream floor, first computation and steady."""
    from batch_assets.reference.customer_status.rules import DEFAULT_RULES

    say.next(f"references: naive job on a {options.naive_sample:,}-row sample, then the single-stream floor")
    naive = report["references"]["naive"] = references.run_naive(
        url, cipher, run_date, DEFAULT_RULES, sample_rows=options.naive_sample, table_rows=options.rows)
    say(f"  naive: {naive['sample_rows_per_s']:,} rows/s on the sample, est. "
        f"{render.seconds(naive['estimated_s'])} for {options.rows:,} rows")
    scratch.reset_to_first_computation(engine)
    floor: dict[str, Any] = {}
    floor["full_first_computation"] = references.run_floor(url, cipher, run_date, DEFAULT_RULES)
    scratch.vacuum(engine)
    floor["full_steady_state"] = references.run_floor(url, cipher, run_date, DEFAULT_RULES)
    report["references"]["floor"] = floor
    say(f"  floor: {floor['full_first_computation']['rows_per_s']:,} rows/s first computation, "
        f"{floor['full_steady_state']['rows_per_s']:,} rows/s steady state")


def _measure_sweeps(report: dict[str, Any], options: BenchOptions, engine: sa.Engine, cipher: Any,
                    run_date: date, say: Progress) -> None:
    """The product: full sweeps (first computation, then steady state) per worker count, a delta, a config-change;
    then the declared form beside the plug-in (each when its section runs)."""
    counter = scratch.StatementCounter(engine)
    workers = max(options.workers)
    if options.runs("sweep"):
        _measure_product(report, options, engine, counter, cipher, run_date, say)
    if options.runs("declared"):
        from batch_assets.bench import declared

        say.next(f"declared form of the customer-status rule (SweepComponent) vs the plug-in, {workers} worker(s)")
        report["declared"] = declared.measure(engine, counter, cipher, run_date, workers, say)


def _measure_product(report: dict[str, Any], options: BenchOptions, engine: sa.Engine,
                     counter: scratch.StatementCounter, cipher: Any, run_date: date, say: Progress) -> None:
    sweep, checks = report["sweep"], report["checks"]
    for workers in options.workers:
        scratch.reset_to_first_computation(engine)
        label = f"full, first computation, {workers} worker(s)"
        say.next(f"product: {label}, then the same sweep again (steady state)")
        first = sweeps.measured(engine, counter, cipher, "full", run_date, workers, say=say, label=label)
        sweep[render.sweep_key("first_computation", workers)] = first
        say.keep()
        scratch.vacuum(engine)
        mark = scratch.write_mark(engine)
        steady = sweeps.measured(engine, counter, cipher, "full", run_date, workers, say=say,
                                 label=f"full, steady state, {workers} worker(s)")
        checks["second_run_writes"][f"full_steady_state_w{workers}"] = scratch.rows_written_since(engine, mark)
        sweep[render.sweep_key("steady_state", workers)] = steady
        say(f"  {first['rows_per_s']:,} rows/s first computation, {steady['rows_per_s']:,} rows/s steady state")
    _add_floor_ratios(report)

    say.next(f"product: delta with {DUE_ROWS} due over {options.rows:,} rows")
    scratch.make_due(engine, run_date, DUE_ROWS)
    sweep["delta_500_due"] = sweeps.measured(engine, counter, cipher, "delta", run_date, 1, say=say, label="delta")
    permille = max(1, options.rows // 1000)  # a delta with 0.1% of the table due, at every size (the scaling goal)
    for w in options.workers:
        say(f"  delta with 0.1% due: {permille:,} of {options.rows:,} rows, {w} worker(s)")
        scratch.make_due(engine, run_date, permille)
        sweep[f"{PERMILLE_DELTA}_w{w}"] = sweeps.measured(engine, counter, cipher, "delta", run_date, w, say=say,
                                                          label=f"delta 0.1%, {w} worker(s)")

    workers = max(options.workers)
    change = sweeps.change_rules(engine)
    say.next(f"product: config-change after the rules change {change}, {workers} worker(s)")
    scratch.vacuum(engine)
    cc = sweeps.measured(engine, counter, cipher, "config-change", run_date, workers, say=say, label="config-change")
    cc.update(workers=workers, change="YOUNG_ADULT 18 → 21", rules=change,
              skipped_by_pre_check=cc["scanned"] - cc["decrypted"])
    sweep["config_change"] = cc
    say.keep()


def _add_floor_ratios(report: dict[str, Any]) -> None:
    """Product time ÷ floor time for the same scenario (below 1: the product is faster than one stream)."""
    floor = report["references"].get("floor") or {}  # none in a run without the references (--only)
    for kind in ("first_computation", "steady_state"):
        ref = floor.get(f"full_{kind}")
        for workers in report["workers"]:
            entry = report["sweep"].get(render.sweep_key(kind, workers))
            if entry and ref and ref["sweep_s"] > 0:
                entry["floor_time_ratio"] = round(entry["sweep_s"] / ref["sweep_s"], 3)
