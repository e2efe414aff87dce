"""`batch-assets sweep customer-status`: the customer-status sweep as a Dagster run."""

from __future__ import annotations

import argparse
from typing import Any

from batch_assets.cli.args import (
    DISTANT_HELP,
    add_setting,
    parse_run_date,
    today_in,
)
from batch_assets.cli.common import (
    build_config,
    job_spec,
    run_job,
)
from batch_assets.reference.customer_status.crypto import cipher_from_settings
from batch_assets.settings import Settings


def cmd_sweep(args: argparse.Namespace, settings: Settings) -> int:
    spec = job_spec("customer_status_sweep_job")
    run_date = parse_run_date(args.run_date) or today_in(settings.timezone)
    config, _ = build_config(
        spec.config,
        settings,
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
    # connection budget the server cannot give (launch_job, orchestration/budget.py).
    cipher_from_settings(settings)
    return run_job(spec, config, settings, {"mode": args.mode, "run_date": run_date})



def register(sub: Any) -> None:
    """sweep customer-status: its options derive from CustomerStatusSettings (type, bounds, choices, help)."""
    from batch_assets.reference.customer_status.job import CustomerStatusSettings as Model

    sweep = sub.add_parser("sweep", help="run a sweep").add_subparsers(dest="sweep_name", required=True)
    cs = sweep.add_parser("customer-status", help="the customer-status sweep (docs/reference/rules.md)")
    add_setting(cs, Model, "mode", required=True)
    cs.add_argument("--run-date", default=None, help="YYYY-MM-DD (default: today in BATCH_ASSETS_TIMEZONE)")
    for name in ("workers", "window", "page_size", "ranges", "lock_fail_open"):
        add_setting(cs, Model, name)
    cs.add_argument("--allow-distant-run-date", action="store_true", help=DISTANT_HELP)
    cs.set_defaults(func=cmd_sweep)
