"""`batch-assets subscriptions expire`: the nightly expiry job as a Dagster run."""

from __future__ import annotations

import argparse
from typing import Any

from batch_assets.cli.args import (
    DISTANT_HELP,
    parse_run_date,
    today_in,
)
from batch_assets.cli.common import (
    build_config,
    job_spec,
    run_job,
)
from batch_assets.db.engine import connected_engine
from batch_assets.settings import Settings


def cmd_subscriptions_expire(args: argparse.Namespace, settings: Settings) -> int:
    spec = job_spec("subscription_expiry_job")
    run_date = parse_run_date(args.run_date) or today_in(settings.timezone)
    config, _ = build_config(spec.config, settings, run_date=run_date.isoformat(),
                           retry_failed=args.retry_failed, allow_distant_run_date=args.allow_distant_run_date or None)
    connected_engine(settings)
    return run_job(spec, config, settings, {"run_date": run_date})



def register(sub: Any) -> None:
    """subscriptions expire"""
    subs = sub.add_parser("subscriptions", help="subscription jobs").add_subparsers(dest="subs_command", required=True)
    ex = subs.add_parser("expire", help="the nightly subscription-expiry job")
    ex.add_argument("--run-date", default=None)
    ex.add_argument("--retry-failed", action="store_true", help="retry FAILED rows under the retry maximum")
    ex.add_argument("--allow-distant-run-date", action="store_true", help=DISTANT_HELP)
    ex.set_defaults(func=cmd_subscriptions_expire)
