"""`batch-assets retention run [--older-than-days N]`: prune what the product itself keeps (docs/reference/cli.md,
docs/production/operations.md)."""

from __future__ import annotations

import argparse
from typing import Any

from batch_assets.cli.args import add_setting
from batch_assets.cli.common import build_config, job_spec, run_job
from batch_assets.settings import Settings


def cmd_retention_run(args: argparse.Namespace, settings: Settings) -> int:
    spec = job_spec("retention_job")
    config, _ = build_config(spec.config, settings, older_than_days=args.older_than_days,
                             batch_size=args.batch_size)
    return run_job(spec, config, settings)


def register(sub: Any) -> None:
    """retention run: its options derive from RetentionSettings (type, bounds, help)."""
    from batch_assets.retention.prune import RetentionSettings

    group = sub.add_parser("retention", help="prune what the product itself keeps").add_subparsers(
        dest="retention_command", required=True)
    run = group.add_parser("run", help="delete SENT outbox events, run history and finished checkpoints older "
                           "than N days; prints the count per table")
    add_setting(run, RetentionSettings, "older_than_days")
    add_setting(run, RetentionSettings, "batch_size")
    run.set_defaults(func=cmd_retention_run)
