"""`batch-assets sweep customer-status`: the customer-status sweep as a Dagster run."""

from __future__ import annotations

import argparse
from typing import Any

from batch_assets.cli.args import (
    DISTANT_HELP,
    parse_run_date,
    positive,
    today_in,
)
from batch_assets.cli.common import (
    build_config,
    check_connection_budget,
    run_job,
)
from batch_assets.crypto import cipher_from_settings
from batch_assets.db.engine import connected_engine
from batch_assets.settings import Settings


def cmd_sweep(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.customer_status.dagster import SweepConfig

    run_date = parse_run_date(args.run_date) or today_in(settings.timezone)
    config, plan = build_config(
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
    cipher_from_settings(settings)
    check_connection_budget(connected_engine(settings), plan.engine.connections_needed)
    return run_job("customer_status_sweep_job", config, settings, {"mode": args.mode, "run_date": run_date})



def register(sub: Any) -> None:
    """sweep customer-status"""
    from batch_assets.domains.customer_status.job import MAX_RANGES
    from batch_assets.engine.settings import MAXIMA

    sweep = sub.add_parser("sweep", help="run a sweep").add_subparsers(dest="sweep_name", required=True)
    cs = sweep.add_parser("customer-status", help="the customer-status sweep (CONTRACT §5)")
    cs.add_argument("--mode", choices=["delta", "full", "config-change"], required=True)
    cs.add_argument("--run-date", default=None, help="YYYY-MM-DD (default: today in BATCH_ASSETS_TIMEZONE)")
    cs.add_argument("--workers", type=positive("workers", int(MAXIMA["workers"])), default=None)
    cs.add_argument("--window", type=positive("window", int(MAXIMA["window"])), default=None)
    cs.add_argument("--page-size", type=positive("page_size", int(MAXIMA["page_size"])), default=None)
    cs.add_argument("--ranges", type=positive("ranges", MAX_RANGES), default=None,
                    help="cursor ranges for full/config-change (one mapped op each)")
    cs.add_argument("--lock-fail-open", action="store_true",
                    help="run even when the lock store is unreachable (the lease still fences writes)")
    cs.add_argument("--allow-distant-run-date", action="store_true", help=DISTANT_HELP)
    cs.set_defaults(func=cmd_sweep)
