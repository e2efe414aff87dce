"""`batch-assets bench`: the benchmark suite. Figures go to a JSON report and the README.

Runs on a scratch database created next to the configured one (the embedded
server when no URL is set), so it never touches real data:

1. seed N customers with COPY (seconds);
2. full sweep, first computation (every row changes, one outbox event each),
   with 1 worker and with 4 workers (rows/s);
3. full sweep at steady state (nothing changes), 1 and 4 workers (rows/s);
4. delta over N rows with 500 due (seconds of sweep time);
5. SQL statements per page, counted by a SQLAlchemy cursor event;
6. peak RSS of a whole first-computation sweep in a fresh process, at the
   small and the large size (memory must not depend on table size).

The sweeps run in-process through the engine (the same code the Dagster op
calls), with the real lease, lock and checkpoint store when available, so the
figures measure the engine and not Dagster's start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from batch_assets.errors import EXIT_OK, ConfigError
from batch_assets.settings import Settings

DUE_ROWS = 500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="large size (default 1,000,000)")
    parser.add_argument("--small-rows", type=int, default=100_000, help="small size for the RSS comparison")
    parser.add_argument("--workers", default="1,4", help="worker counts to compare (default 1,4)")
    parser.add_argument("--run-date", default=None, help="YYYY-MM-DD (default: today in BATCH_ASSETS_TIMEZONE)")
    parser.add_argument("--output", default="bench-results/bench.json")
    parser.add_argument("--skip-rss", action="store_true", help="skip the peak-RSS subprocess runs")
    parser.add_argument("--rss-child", nargs=3, metavar=("URL", "KEY", "RUN_DATE"), help=argparse.SUPPRESS)


# --- scratch database ---------------------------------------------------------


@contextmanager
def scratch_database(base_url: str, name: str) -> Iterator[str]:
    admin = sa.create_engine(
        make_url(base_url).set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
    )
    # `name` is generated below from a fixed prefix and hex digits.
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(base_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


BOOKKEEPING_TABLES = ("ba_checkpoints", "ba_leases", "ba_job_locks", "ba_rules", "ba_run_history")


class StatementCounter:
    """Counts statements sent through an engine (DBAPI cursor executions).

    Statements on the bookkeeping tables (checkpoint saves, heartbeats) are
    counted apart from the page's own reads and writes; the lease fence inside
    the page transaction (in the timeouts preamble) counts as a page statement.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self.page = 0
        self.preambles = 0
        self.bookkeeping = 0
        sa.event.listen(engine, "before_cursor_execute", self._on)

    def _on(self, _conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if "set_config('statement_timeout'" in statement:
            self.page += 1  # a write transaction's preamble (timeouts, and the lease fence when guarded)
            self.preambles += 1
        elif "enable_bitmapscan" in statement or any(t in statement for t in BOOKKEEPING_TABLES):
            self.bookkeeping += 1  # per-run reader plan pin, checkpoints, heartbeats, lock, lease
        else:
            self.page += 1

    def take(self) -> tuple[int, int, int]:
        taken = (self.page, self.preambles, self.bookkeeping)
        self.page = self.preambles = self.bookkeeping = 0
        return taken


def _sweep(engine: sa.Engine, cipher: Any, mode: str, run_date: date, workers: int) -> dict[str, Any]:
    from batch_assets.domains.customer_status.job import run_customer_status_sweep
    from batch_assets.engine.settings import SweepSettings

    settings = SweepSettings.build(workers=workers, pool_size=max(10, workers + 4))
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    kwargs: dict[str, Any] = {}
    guard_cm = _guard(engine, run_id, settings)
    with guard_cm as guard:
        kwargs["guard"] = guard
        kwargs["checkpoints"] = _checkpoints(engine)
        started = time.perf_counter()
        result = run_customer_status_sweep(
            engine, cipher, mode=mode, run_date=run_date, settings=settings, run_id=run_id, **kwargs
        )
        elapsed = time.perf_counter() - started
    summary = result.to_summary()
    if summary["status"] != "SUCCESS":
        raise RuntimeError(f"bench sweep {mode} ended {summary['status']}: {summary.get('stopped_reason')}")
    summary["wall_s"] = round(elapsed, 3)
    summary["rows_per_s"] = round(summary["scanned"] / elapsed) if elapsed > 0 else None
    return summary


@contextmanager
def _guard(engine: sa.Engine, run_id: str, settings: Any) -> Iterator[Any]:
    try:
        from batch_assets.locking.guard import job_guard
    except ImportError:
        yield None
        return
    with job_guard(engine, job_key="customer_status", run_id=run_id, settings=settings) as guard:
        yield guard


def _checkpoints(engine: sa.Engine) -> Any:
    try:
        from batch_assets.locking.checkpoint import CheckpointStore
    except ImportError:
        return None
    return CheckpointStore(engine)


def _reset_to_first_computation(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE customers SET age_category = NULL, next_review_date = NULL")
        conn.exec_driver_sql("TRUNCATE review_triggers, outbox_events, ba_checkpoints")
    _vacuum(engine)


def _vacuum(engine: sa.Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE customers")
        conn.exec_driver_sql("VACUUM ANALYZE outbox_events")


def _make_due(engine: sa.Engine, run_date: date, count: int) -> None:
    """Make `count` settled rows due today with a real transition (stale stored category)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                UPDATE customers SET next_review_date = :d,
                       age_category = CASE WHEN age_category = 'MINOR' THEN 'ADULT' ELSE 'MINOR' END
                WHERE id IN (SELECT id FROM customers WHERE status = 'ACTIVE' AND next_review_date > :d
                             ORDER BY id LIMIT :n)
                """
            ),
            {"d": run_date, "n": count},
        )
    _vacuum(engine)


# --- RSS in a fresh process -----------------------------------------------------


def _rss_child(url: str, key_text: str, run_date_text: str) -> int:
    """Run one first-computation full sweep; print peak RSS (KiB) as JSON."""
    from batch_assets.crypto import DobCipher, decode_key
    from batch_assets.db.engine import create_engine

    engine = create_engine(url, pool_size=10)
    _reset_to_first_computation(engine)
    summary = _sweep(engine, DobCipher(decode_key(key_text)), "full", date.fromisoformat(run_date_text), 4)
    engine.dispose()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_rss_mib": round(peak_kib / 1024, 1), "scanned": summary["scanned"]}))
    return EXIT_OK


def _measure_rss(url: str, key_text: str, run_date: date) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "batch_assets.cli", "bench", "--rss-child", url, key_text, run_date.isoformat()],
        capture_output=True, text=True, timeout=1800, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- the suite ---------------------------------------------------------------


def run_bench(
    args: argparse.Namespace,
    settings: Settings,
    *,
    emit: Callable[[dict[str, Any]], None],
    err: Callable[[str], None],
) -> int:
    if args.rss_child:
        return _rss_child(*args.rss_child)

    from batch_assets.cli import today_in
    from batch_assets.crypto import DobCipher, decode_key, generate_key_text
    from batch_assets.db.engine import create_engine, resolve_database_url
    from batch_assets.db.migrate import migrate
    from batch_assets.seed import seed_customers

    if args.rows < 10_000 or args.small_rows < 1_000 or args.small_rows >= args.rows:
        raise ConfigError("need rows >= 10000 and 1000 <= small-rows < rows", field="rows")
    try:
        worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        raise ConfigError(f"{args.workers!r} is not a comma-separated list of integers", field="workers") from None
    run_date = date.fromisoformat(args.run_date) if args.run_date else today_in(settings.timezone)
    key_text = generate_key_text()  # a throwaway key: bench data is synthetic
    cipher = DobCipher(decode_key(key_text))
    base_url = resolve_database_url(settings)
    report: dict[str, Any] = {
        "status": "SUCCESS",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "rows": args.rows,
        "run_date": run_date.isoformat(),
        "results": {},
    }
    results = report["results"]
    started = time.perf_counter()
    with scratch_database(base_url, f"ba_bench_{uuid.uuid4().hex[:8]}") as url:
        engine = create_engine(url, pool_size=12)
        counter = StatementCounter(engine)
        migrate(engine)
        err(f"bench: seeding {args.rows:,} customers")
        seed = seed_customers(engine, cipher, args.rows, run_date=run_date, seed=1)
        results["seed_s"] = round(seed.duration_s, 2)
        _vacuum(engine)
        for workers in worker_counts:
            _reset_to_first_computation(engine)
            counter.take()
            err(f"bench: full sweep, first computation, {workers} worker(s)")
            first = _sweep(engine, cipher, "full", run_date, workers)
            statements = counter.take()
            results[f"full_first_computation_w{workers}"] = _pick(first, statements)
            _vacuum(engine)
            err(f"bench: full sweep, steady state, {workers} worker(s)")
            steady = _sweep(engine, cipher, "full", run_date, workers)
            statements = counter.take()
            results[f"full_steady_state_w{workers}"] = _pick(steady, statements)
        _make_due(engine, run_date, DUE_ROWS)
        counter.take()
        err(f"bench: delta with {DUE_ROWS} due over {args.rows:,} rows")
        delta = _sweep(engine, cipher, "delta", run_date, 1)
        results["delta_500_due"] = _pick(delta, counter.take())
        engine.dispose()
        if not args.skip_rss:
            err(f"bench: peak RSS of a full sweep at {args.rows:,} rows (fresh process)")
            results["peak_rss_large"] = {"rows": args.rows, **_measure_rss(url, key_text, run_date)}
    if not args.skip_rss:
        with scratch_database(base_url, f"ba_bench_{uuid.uuid4().hex[:8]}") as small_url:
            small = create_engine(small_url, pool_size=4)
            migrate(small)
            seed_customers(small, cipher, args.small_rows, run_date=run_date, seed=2)
            small.dispose()
            err(f"bench: peak RSS of a full sweep at {args.small_rows:,} rows (fresh process)")
            results["peak_rss_small"] = {"rows": args.small_rows, **_measure_rss(small_url, key_text, run_date)}
        large, small_rss = results["peak_rss_large"]["peak_rss_mib"], results["peak_rss_small"]["peak_rss_mib"]
        results["peak_rss_ratio_large_over_small"] = round(large / small_rss, 3)
    report["duration_s"] = round(time.perf_counter() - started, 1)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    err(f"bench: report written to {output}")
    emit(report)
    return EXIT_OK


def _pick(summary: dict[str, Any], statements: tuple[int, int, int]) -> dict[str, Any]:
    pages = max(summary["pages"], 1)
    page_statements, preambles, bookkeeping = statements
    return {
        "scanned": summary["scanned"],
        "changed": summary["changed"],
        "failed": summary["failed"],
        "pages": summary["pages"],
        "decrypted": summary["decrypted"],
        "sweep_s": summary["wall_s"],
        "rows_per_s": summary["rows_per_s"],
        "statements": page_statements,
        "statements_per_page": round(page_statements / pages, 2),
        "data_statements_per_page": round((page_statements - preambles) / pages, 2),
        "bookkeeping_statements_per_page": round(bookkeeping / pages, 2),
    }
