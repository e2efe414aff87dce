"""`batch-assets retention run [--older-than-days N]`: prune what the product itself keeps (CONTRACT §2, §8)."""

from __future__ import annotations

import argparse
from typing import Any

from batch_assets.cli.args import at_least_one
from batch_assets.cli.common import build_config, run_job
from batch_assets.settings import Settings


def cmd_retention_run(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.retention.dagster import RetentionConfig, retention_job

    config, _ = build_config(RetentionConfig, older_than_days=args.older_than_days, batch_size=args.batch_size)
    return run_job(retention_job.name, config, settings)


def register(sub: Any) -> None:
    """retention run"""
    from batch_assets.domains.retention.retention import (
        DEFAULT_BATCH_SIZE,
        DEFAULT_OLDER_THAN_DAYS,
        MAX_BATCH_SIZE,
        MAX_OLDER_THAN_DAYS,
    )

    group = sub.add_parser("retention", help="prune what the product itself keeps").add_subparsers(
        dest="retention_command", required=True)
    run = group.add_parser("run", help="delete SENT outbox events, run history and finished checkpoints older "
                           f"than N days (default {DEFAULT_OLDER_THAN_DAYS}); prints the count per table")
    run.add_argument("--older-than-days", type=at_least_one("older_than_days", MAX_OLDER_THAN_DAYS), default=None,
                     help=f"default {DEFAULT_OLDER_THAN_DAYS}")
    run.add_argument("--batch-size", type=at_least_one("batch_size", MAX_BATCH_SIZE), default=None,
                     help=f"ids per delete transaction (default {DEFAULT_BATCH_SIZE})")
    run.set_defaults(func=cmd_retention_run)
