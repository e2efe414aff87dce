"""`batch-assets`: the one command line of CONTRACT §2.

Rules every command keeps:
- progress and messages go to stderr; a job command's last line of stdout is
  one JSON object (its summary), whatever the outcome;
- exit codes: 0 success, 1 the run failed, 2 bad usage or configuration
  (nothing was written), 75 skipped because another run holds the lock;
- configuration is validated before anything is read or written;
- no secret (database password, key, decrypted value) is ever printed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import date, datetime
from typing import Any

from batch_assets.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SKIPPED,
    BatchAssetsError,
    ConfigError,
)
from batch_assets.settings import Settings, load_settings

SUMMARY_KEYS = ("status", "run_id", "scanned", "changed", "unchanged", "failed", "failed_by_type", "duration_s")
EXIT_BY_STATUS = {"SUCCESS": EXIT_OK, "FAILURE": EXIT_FAILED, "SKIPPED": EXIT_SKIPPED}


class UsageError(ConfigError):
    """argparse errors, reported with exit 2 like any configuration error."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


# --- helpers -----------------------------------------------------------------


def err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def emit(summary: dict[str, Any]) -> None:
    """Print the summary as the last line of stdout."""
    sys.stdout.flush()
    print(json.dumps(summary, default=str, sort_keys=False), flush=True)


def empty_summary(status: str, error: str | None = None) -> dict[str, Any]:
    from batch_assets.run_history import empty_summary as zero_summary

    return zero_summary(status, None, **({"error": error} if error is not None else {}))


def parse_run_date(text: str | None) -> date | None:
    """`--run-date`: exactly YYYY-MM-DD (ASCII digits); the one parser the Config classes use too."""
    from batch_assets.orchestration.config import parse_run_date as parse

    return parse(text)


def today_in(timezone: str) -> date:
    """Today in the configured time zone: the default run date, computed once per run."""
    from batch_assets.orchestration.config import today_in as today

    return today(timezone)


MAX_COUNT = 100_000_000
"""Upper bound of a row or item count on the command line (a mistyped extra digit fails at once)."""


def positive(name: str, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """A whole number 0..maximum in ASCII digits (int() alone also takes '１８' and '1_000')."""

    def parse(text: str) -> int:
        if not re.fullmatch(r"[+-]?[0-9]+", text.strip(), re.ASCII):
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {text!r}")
        value = int(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} must not be negative, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{name} must be at most {maximum}, got {value}")
        return value

    return parse


def at_least_one(name: str, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = positive(name, maximum)(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {value}")
        return value

    return parse


def fraction(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not 0.0 <= value <= 1.0:
            raise argparse.ArgumentTypeError(f"{name} must be between 0 and 1, got {value}")
        return value

    return parse


def engine_for(settings: Settings):  # -> sa.Engine
    """The process's engine, after checking the database answers (one-line error if not)."""
    from batch_assets.db.engine import check_connection, get_engine, resolve_database_url

    engine = get_engine(resolve_database_url(settings))
    check_connection(engine)
    return engine


def check_connection_budget(engine, needed: int) -> None:  # engine: sa.Engine
    """ConfigError (exit 2) when the server has fewer free connections than a run's budget needs."""
    from batch_assets.db.engine import free_connections

    free = free_connections(engine)
    if needed > free:
        raise ConfigError(
            f"a run needs {needed} connections (workers + prefetch + side effects + heartbeat) but the server "
            f"has {free} free (max_connections minus reserved and in use); lower --workers",
            field="workers",
        )


def cipher_for_settings(settings: Settings):
    from batch_assets.crypto import cipher_for, load_key

    return cipher_for(load_key(settings))


# --- db ----------------------------------------------------------------------


def cmd_db_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.db.migrate import applied_versions, migrate

    engine = engine_for(settings)
    applied = migrate(engine)
    for m in applied:
        err(f"applied migration {m.version:04d}_{m.name}")
    versions = applied_versions(engine)
    emit({"status": "SUCCESS", "applied": [m.version for m in applied], "schema_versions": versions})
    return EXIT_OK


def cmd_db_url(args: argparse.Namespace, settings: Settings) -> int:
    from sqlalchemy.engine import make_url

    from batch_assets.db.engine import resolve_database_url

    url = make_url(resolve_database_url(settings))
    print(url.render_as_string(hide_password=bool(url.password) and not args.show_password))
    return EXIT_OK


def cmd_db_stop(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.db import embedded

    if not settings.embedded:
        raise ConfigError("only the embedded server can be stopped; BATCH_ASSETS_DATABASE_URL is set")
    was_running = embedded.stop(settings.home)
    err("embedded PostgreSQL stopped" if was_running else "embedded PostgreSQL was not running")
    return EXIT_OK


# --- seed --------------------------------------------------------------------


def cmd_seed_customers(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.seed import check_fraction, seed_customers

    check_fraction(args.due_fraction, "due_fraction")
    check_fraction(args.bad_fraction, "bad_fraction")
    run_date = parse_run_date(args.run_date) or today_in(settings.timezone)
    cipher = cipher_for_settings(settings)
    engine = engine_for(settings)
    rules = _current_rules(engine)
    report = seed_customers(
        engine,
        cipher,
        args.rows,
        run_date=run_date,
        due_fraction=args.due_fraction,
        bad_fraction=args.bad_fraction,
        seed=args.seed,
        rules=rules,
        progress=lambda n: err(f"seeded {n:,} customers"),
    )
    summary = report.to_summary()
    summary["run_date"] = run_date.isoformat()
    err(f"seeded {report.rows:,} customers in {report.duration_s:.1f}s")
    emit(summary)
    return EXIT_OK


def _current_rules(engine):  # -> Rules
    try:
        from batch_assets.domains.customer_status.rules_store import current_rules
    except ImportError:  # pragma: no cover - during bring-up
        from batch_assets.domains.customer_status.rules import DEFAULT_RULES

        return DEFAULT_RULES
    with engine.connect() as conn:
        return current_rules(conn)[1]


def cmd_seed_subscriptions(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.subscriptions.seed import seed_subscriptions

    check = __import__("batch_assets.seed", fromlist=["check_fraction"]).check_fraction
    check(args.expired_fraction, "expired_fraction")
    run_date = parse_run_date(args.run_date) or today_in(settings.timezone)
    engine = engine_for(settings)
    started = datetime.now()
    rows = seed_subscriptions(
        engine, args.rows, seed=args.seed, expired_fraction=args.expired_fraction, run_date=run_date
    )
    emit({"status": "SUCCESS", "table": "subscriptions", "rows": rows,
          "duration_s": round((datetime.now() - started).total_seconds(), 3)})
    return EXIT_OK


def cmd_seed_payments(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.payments.seed import seed_payments

    engine = engine_for(settings)
    started = datetime.now()
    rows = seed_payments(engine, args.rows, seed=args.seed)
    emit({"status": "SUCCESS", "table": "payments", "rows": rows,
          "duration_s": round((datetime.now() - started).total_seconds(), 3)})
    return EXIT_OK


# --- jobs (each one a Dagster run) -----------------------------------------


def run_job(job_name: str, config: Any, settings: Settings, extra: dict[str, Any] | None = None) -> int:
    """Launch `job_name` as a Dagster run, print its summary, return the exit code."""
    from batch_assets.orchestration.launch import launch_job
    from batch_assets.shutdown import install_signal_handlers

    install_signal_handlers()
    result = launch_job(job_name, config, settings=settings)
    summary = dict(result.summary or {})
    summary.setdefault("status", "FAILURE")
    summary["run_id"] = result.run_id
    for key in SUMMARY_KEYS:
        summary.setdefault(key, {} if key == "failed_by_type" else 0)
    for key, value in (extra or {}).items():
        summary.setdefault(key, value)
    if summary["status"] == "SKIPPED":
        err(f"{job_name}: skipped, another run holds the lock")
    elif summary["status"] != "SUCCESS":
        err(f"{job_name}: run {result.run_id} ended {summary['status']}"
            + (f": {summary['error']}" if summary.get("error") else ""))
    emit(summary)
    return EXIT_BY_STATUS.get(summary["status"], EXIT_FAILED)


def cmd_sweep(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.orchestration.config import SweepConfig

    run_date = parse_run_date(args.run_date) or today_in(settings.timezone)
    config = _build_config(
        SweepConfig,
        mode=args.mode,
        run_date=run_date.isoformat(),
        workers=args.workers,
        window=args.window,
        page_size=args.page_size,
        ranges=args.ranges,
        lock_fail_open=args.lock_fail_open or None,
        allow_distant_run_date=args.allow_distant_run_date or None,
    )
    # Checked before launching: a missing or malformed key is exit 2, nothing read; so is a
    # connection budget the server cannot give.
    cipher_for_settings(settings)
    check_connection_budget(engine_for(settings), config.to_engine_settings().engine.connections_needed)
    return run_job("customer_status_sweep_job", config, settings, {"mode": args.mode, "run_date": run_date})


def cmd_subscriptions_expire(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.orchestration.config import ExpiryConfig

    run_date = parse_run_date(args.run_date) or today_in(settings.timezone)
    config = _build_config(ExpiryConfig, run_date=run_date.isoformat(), retry_failed=args.retry_failed,
                           allow_distant_run_date=args.allow_distant_run_date or None)
    engine_for(settings)
    return run_job("subscription_expiry_job", config, settings, {"run_date": run_date})


def cmd_queue_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.payments.queue import enqueue

    if args.count <= 0:
        raise ConfigError(f"must be positive, got {args.count}", field="count")
    engine = engine_for(settings)
    count = enqueue(engine, args.count, seed=args.seed)
    emit({"status": "SUCCESS", "enqueued": count})
    return EXIT_OK


def cmd_queue_work(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.orchestration.config import QueueDrainConfig

    config = _build_config(QueueDrainConfig, concurrency=args.concurrency, max_seconds=args.max_seconds)
    engine_for(settings)
    return run_job("payment_queue_drain_job", config, settings)


def cmd_queue_dlq_list(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.payments.queue import dlq_list

    rows = dlq_list(engine_for(settings), limit=args.limit)
    for row in rows:
        err(f"{row['id']}  attempts={row['attempts']}  amount_cents={row['amount_cents']}  "
            f"last_error={row.get('last_error')}")
    emit({"status": "SUCCESS", "count": len(rows), "items": rows})
    return EXIT_OK


def cmd_queue_dlq_replay(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.payments.queue import dlq_replay

    ids = None
    if args.id:
        try:
            ids = [uuid.UUID(i) for i in args.id]
        except ValueError:
            raise ConfigError("every --id must be a UUID", field="id") from None
    result = dlq_replay(engine_for(settings), ids)
    summary = result if isinstance(result, dict) else {"replayed": result}
    emit({"status": "SUCCESS", **summary})
    return EXIT_OK


def cmd_outbox_relay(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.orchestration.config import OutboxRelayConfig

    config = _build_config(OutboxRelayConfig, batch_size=args.batch_size)
    engine_for(settings)
    return run_job("outbox_relay_job", config, settings)


def _build_config(cls: type, **values: Any) -> Any:
    """Build a run-config object and validate it fully; errors name the field (exit 2)."""
    import pydantic

    clean = {k: v for k, v in values.items() if v is not None}
    try:
        config = cls(**clean)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or None
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        if field and message.startswith(f"{field}: "):
            message = message[len(field) + 2:]
        raise ConfigError(message, field=field) from None
    config.to_engine_settings()
    return config


# --- rules -------------------------------------------------------------------


def cmd_rules_show(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.customer_status.rules_store import current_rules

    with engine_for(settings).connect() as conn:
        version, rules = current_rules(conn)
    err(str(rules))
    emit({"status": "SUCCESS", "version": version, "fingerprint": rules.fingerprint,
          "rules": [{"category": r.category, "min_age": r.min_age} for r in rules.rules]})
    return EXIT_OK


def cmd_rules_set(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.customer_status.rules import Rules
    from batch_assets.domains.customer_status.rules_store import current_rules, set_rules

    rules = Rules.parse(args.thresholds)
    engine = engine_for(settings)
    version = set_rules(engine, rules)
    with engine.connect() as conn:
        current_version, current = current_rules(conn)
    err(f"rules version {current_version}: {current} (fingerprint {current.fingerprint}); "
        "run `sweep customer-status --mode config-change` (the rules_changed_sensor does it on the daemon)")
    emit({"status": "SUCCESS", "version": version, "fingerprint": current.fingerprint, "rules": str(current)})
    return EXIT_OK


# --- demo, bench, ui --------------------------------------------------------


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.demo import run_demo

    return run_demo(settings, rows=args.rows, emit=emit, err=err)


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.bench import run_bench

    return run_bench(args, settings, emit=emit, err=err)


def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    import os
    import subprocess

    from batch_assets.orchestration.launch import ensure_instance, repo_root

    home = ensure_instance(settings)
    err(f"DAGSTER_HOME={home}; open http://127.0.0.1:{args.port}")
    env = dict(os.environ, DAGSTER_HOME=str(home))
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", str(repo_root() / "workspace.yaml"), "-p", str(args.port)]
    return subprocess.call(cmd, env=env)


# --- parser ------------------------------------------------------------------


DISTANT_HELP = "allow a --run-date further from today than BATCH_ASSETS_RUN_DATE_WINDOW_DAYS (default 366)"


def build_parser() -> argparse.ArgumentParser:
    from batch_assets.engine.settings import MAXIMA
    from batch_assets.orchestration.config import MAX_RANGES

    p = _Parser(prog="batch-assets", description="Fast, safe batch sweeps, queue and nightly jobs on PostgreSQL.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    db = sub.add_parser("db", help="database: migrate, url, stop").add_subparsers(dest="db_command", required=True)
    db.add_parser("migrate", help="create or upgrade every table, index and trigger").set_defaults(func=cmd_db_migrate)
    url = db.add_parser("url", help="print the database URL (password hidden)")
    url.add_argument("--show-password", action="store_true")
    url.set_defaults(func=cmd_db_url)
    db.add_parser("stop", help="stop the embedded PostgreSQL").set_defaults(func=cmd_db_stop)

    seed = sub.add_parser("seed", help="insert test data").add_subparsers(dest="seed_command", required=True)
    sc = seed.add_parser("customers", help="ACTIVE customers with encrypted dates of birth")
    sc.add_argument("--rows", type=at_least_one("rows"), required=True)
    sc.add_argument("--due-fraction", type=fraction("due-fraction"), default=None,
                    help="settle the table and make this fraction due on the run date (default: all fresh)")
    sc.add_argument("--bad-fraction", type=fraction("bad-fraction"), default=0.0)
    sc.add_argument("--seed", type=int, default=None)
    sc.add_argument("--run-date", default=None)
    sc.set_defaults(func=cmd_seed_customers)
    ss = seed.add_parser("subscriptions", help="subscriptions with enrollments")
    ss.add_argument("--rows", type=at_least_one("rows"), required=True)
    ss.add_argument("--expired-fraction", type=fraction("expired-fraction"), default=0.3)
    ss.add_argument("--seed", type=int, default=None)
    ss.add_argument("--run-date", default=None)
    ss.set_defaults(func=cmd_seed_subscriptions)
    sp = seed.add_parser("payments", help="NEW payments")
    sp.add_argument("--rows", type=at_least_one("rows"), required=True)
    sp.add_argument("--seed", type=int, default=None)
    sp.set_defaults(func=cmd_seed_payments)

    sweep = sub.add_parser("sweep", help="run a sweep").add_subparsers(dest="sweep_name", required=True)
    cs = sweep.add_parser("customer-status", help="the customer-status sweep (CONTRACT §5)")
    cs.add_argument("--mode", choices=["delta", "full", "config-change"], required=True)
    cs.add_argument("--run-date", default=None, help="YYYY-MM-DD (default: today in BATCH_ASSETS_TIMEZONE)")
    cs.add_argument("--workers", type=positive("workers", MAXIMA["workers"]), default=None)
    cs.add_argument("--window", type=positive("window", MAXIMA["window"]), default=None)
    cs.add_argument("--page-size", type=positive("page_size", MAXIMA["page_size"]), default=None)
    cs.add_argument("--ranges", type=positive("ranges", MAX_RANGES), default=None,
                    help="cursor ranges for full/config-change (one mapped op each)")
    cs.add_argument("--lock-fail-open", action="store_true",
                    help="run even when the lock store is unreachable (the lease still fences writes)")
    cs.add_argument("--allow-distant-run-date", action="store_true", help=DISTANT_HELP)
    cs.set_defaults(func=cmd_sweep)

    subs = sub.add_parser("subscriptions", help="subscription jobs").add_subparsers(dest="subs_command", required=True)
    ex = subs.add_parser("expire", help="the nightly subscription-expiry job")
    ex.add_argument("--run-date", default=None)
    ex.add_argument("--retry-failed", action="store_true", help="retry FAILED rows under the retry maximum")
    ex.add_argument("--allow-distant-run-date", action="store_true", help=DISTANT_HELP)
    ex.set_defaults(func=cmd_subscriptions_expire)

    queue = sub.add_parser("queue", help="the payment task queue").add_subparsers(dest="queue_command", required=True)
    en = queue.add_parser("enqueue", help="enqueue NEW payments")
    en.add_argument("--count", type=at_least_one("count"), required=True)
    en.add_argument("--seed", type=int, default=None)
    en.set_defaults(func=cmd_queue_enqueue)
    wk = queue.add_parser("work", help="drain due payments")
    wk.add_argument("--concurrency", type=positive("concurrency"), default=None)
    wk.add_argument("--max-seconds", type=float, default=None)
    wk.set_defaults(func=cmd_queue_work)
    dlq = queue.add_parser("dlq", help="the FAILED payments").add_subparsers(dest="dlq_command", required=True)
    dl = dlq.add_parser("list")
    dl.add_argument("--limit", type=positive("limit"), default=100)
    dl.set_defaults(func=cmd_queue_dlq_list)
    dr = dlq.add_parser("replay")
    dr.add_argument("--id", action="append", default=None, help="payment id (repeatable); default: all")
    dr.set_defaults(func=cmd_queue_dlq_replay)

    outbox = sub.add_parser("outbox", help="the outbox").add_subparsers(dest="outbox_command", required=True)
    rl = outbox.add_parser("relay", help="send PENDING outbox events to the sink")
    rl.add_argument("--batch-size", type=positive("batch-size"), default=None)
    rl.set_defaults(func=cmd_outbox_relay)

    rules = sub.add_parser("rules", help="the age-category rules").add_subparsers(dest="rules_command", required=True)
    rules.add_parser("show").set_defaults(func=cmd_rules_show)
    rs = rules.add_parser("set")
    rs.add_argument("--thresholds", required=True, help="NAME=AGE,... e.g. MINOR=0,YOUNG_ADULT=18,ADULT=26,SENIOR=65")
    rs.set_defaults(func=cmd_rules_set)

    demo = sub.add_parser("demo", help="the README's main job, end to end")
    demo.add_argument("--rows", type=positive("rows"), default=100_000)
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="the benchmark suite (JSON report)")
    from batch_assets.bench import add_arguments

    add_arguments(bench)
    bench.set_defaults(func=cmd_bench)

    ui = sub.add_parser("ui", help="open the Dagster UI (dagster dev) on the CLI's instance")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(func=cmd_ui)
    return p


JOB_COMMANDS = {cmd_sweep, cmd_subscriptions_expire, cmd_queue_work, cmd_outbox_relay}


def _looks_like_job(argv: Sequence[str] | None) -> bool:
    words = [w for w in (sys.argv[1:] if argv is None else argv) if not w.startswith("-")]
    return words[:1] == ["sweep"] or words[:2] in (["subscriptions", "expire"], ["queue", "work"], ["outbox", "relay"])


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    func = None
    try:
        args = parser.parse_args(argv)
        func = args.func
        settings = load_settings()
        return func(args, settings)
    except BatchAssetsError as exc:
        err(f"error: {exc}")
        if func in JOB_COMMANDS or (func is None and _looks_like_job(argv)):
            status = "SKIPPED" if exc.exit_code == EXIT_SKIPPED else "FAILURE"
            emit(empty_summary(status, error=str(exc)))
        return exc.exit_code
    except KeyboardInterrupt:
        err("interrupted")
        if func in JOB_COMMANDS:
            emit(empty_summary("FAILURE", error="interrupted"))
        return EXIT_FAILED
    except Exception as exc:  # a defect: one line (no secrets: no locals, no values), JSON for job commands
        err(f"error: unexpected {type(exc).__name__}: {_first_line(str(exc))}")
        if func in JOB_COMMANDS:
            emit(empty_summary("FAILURE", error=f"unexpected {type(exc).__name__}"))
        return EXIT_FAILED


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
