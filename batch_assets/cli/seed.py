"""`batch-assets seed customers | subscriptions | payments`: test data."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from batch_assets.cli.args import (
    at_least_one,
    fraction,
    parse_run_date,
    seed_value,
    today_in,
)
from batch_assets.cli.output import emit, err
from batch_assets.db.engine import connected_engine
from batch_assets.errors import (
    EXIT_OK,
)
from batch_assets.reference.customer_status.crypto import cipher_from_settings
from batch_assets.reference.customer_status.rules_store import rules_in_force
from batch_assets.settings import Settings


def cmd_seed_customers(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.reference.customer_status.seed import check_fraction, seed_customers

    check_fraction(args.due_fraction, "due_fraction")
    check_fraction(args.bad_fraction, "bad_fraction")
    run_date = parse_run_date(args.run_date) or today_in(settings.timezone)
    cipher = cipher_from_settings(settings)
    engine = connected_engine(settings)
    rules = rules_in_force(engine)
    report = seed_customers(
        engine,
        cipher,
        args.rows,
        run_date=run_date,
        due_fraction=args.due_fraction,
        bad_fraction=args.bad_fraction,
        seed=args.seed,
        rules=rules,
        # Rows sent so far; nothing is committed (nor "seeded") until the one transaction commits at the end.
        progress=lambda n: err(f"copying customers: {n:,} of {args.rows:,} sent (committed at the end)"),
    )
    summary = report.to_summary()
    summary["run_date"] = run_date.isoformat()
    err(f"seeded {report.rows:,} customers in {report.duration_s:.1f}s")
    emit(summary)
    return EXIT_OK


def cmd_seed_subscriptions(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.reference.subscriptions.seed import seed_subscriptions

    check = __import__("batch_assets.reference.customer_status.seed", fromlist=["check_fraction"]).check_fraction
    check(args.expired_fraction, "expired_fraction")
    run_date = parse_run_date(args.run_date) or today_in(settings.timezone)
    engine = connected_engine(settings)
    started = datetime.now()
    rows = seed_subscriptions(
        engine, args.rows, seed=args.seed, expired_fraction=args.expired_fraction, run_date=run_date
    )
    emit({"status": "SUCCESS", "table": "subscriptions", "rows": rows,
          "duration_s": round((datetime.now() - started).total_seconds(), 3)})
    return EXIT_OK


def cmd_seed_payments(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.reference.payments.seed import seed_payments

    engine = connected_engine(settings)
    started = datetime.now()
    rows = seed_payments(engine, args.rows, seed=args.seed)
    emit({"status": "SUCCESS", "table": "payments", "rows": rows,
          "duration_s": round((datetime.now() - started).total_seconds(), 3)})
    return EXIT_OK



def register(sub: Any) -> None:
    """seed customers | subscriptions | payments"""
    seed = sub.add_parser("seed", help="insert test data").add_subparsers(dest="seed_command", required=True)
    sc = seed.add_parser("customers", help="ACTIVE customers with encrypted dates of birth")
    sc.add_argument("--rows", type=at_least_one("rows"), required=True)
    sc.add_argument("--due-fraction", type=fraction("due-fraction"), default=None,
                    help="settle the table and make this fraction due on the run date (default: all fresh)")
    sc.add_argument("--bad-fraction", type=fraction("bad-fraction"), default=0.0)
    sc.add_argument("--seed", type=seed_value, default=None)
    sc.add_argument("--run-date", default=None)
    sc.set_defaults(func=cmd_seed_customers)
    ss = seed.add_parser("subscriptions", help="subscriptions with enrollments")
    ss.add_argument("--rows", type=at_least_one("rows"), required=True)
    ss.add_argument("--expired-fraction", type=fraction("expired-fraction"), default=0.3)
    ss.add_argument("--seed", type=seed_value, default=None)
    ss.add_argument("--run-date", default=None)
    ss.set_defaults(func=cmd_seed_subscriptions)
    sp = seed.add_parser("payments", help="NEW payments")
    sp.add_argument("--rows", type=at_least_one("rows"), required=True)
    sp.add_argument("--seed", type=seed_value, default=None)
    sp.set_defaults(func=cmd_seed_payments)
