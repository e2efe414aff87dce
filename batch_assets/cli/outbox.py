"""`batch-assets outbox relay [--follow]`: PENDING outbox events to the sink, as a Dagster run."""

from __future__ import annotations

import argparse
from typing import Any

from batch_assets.cli.args import add_setting
from batch_assets.cli.common import (
    build_config,
    job_spec,
    run_job,
)
from batch_assets.db.engine import connected_engine
from batch_assets.settings import Settings

RELAY_JOB = "outbox_relay_job"

NO_RELAY_HERE = ("this code location has no outbox relay: the relay sends this repository's outbox_events; in your "
                 "own project a declared sweep's events stay in ba_outbox_events for your consumer "
                 "(docs: guide/own-project#events)")
"""The refusal in a team's own project, before any sink is built (a file sink would be a folder of the team's)."""


def cmd_outbox_relay(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.errors import ConfigError
    from batch_assets.orchestration.project import current
    from batch_assets.outbox.sinks import make_sink
    from batch_assets.settings import check_outbox_sink

    if not any(RELAY_JOB in names for names in current().job_modules.values()):
        raise ConfigError(NO_RELAY_HERE)
    # A sink whose client library is not installed is refused here (exit 2 naming the variable and the extra to
    # install), before a run starts; building the sink opens no connection.
    make_sink(settings.outbox_sink or check_outbox_sink(None, settings.home)).close()
    spec = job_spec(RELAY_JOB)
    config, _ = build_config(
        spec.config, settings, batch_size=args.batch_size, follow=args.follow or None,
        follow_seconds=args.max_seconds,
    )
    connected_engine(settings)
    return run_job(spec, config, settings)


def register(sub: Any) -> None:
    """outbox relay"""
    outbox = sub.add_parser("outbox", help="the outbox").add_subparsers(dest="outbox_command", required=True)
    rl = outbox.add_parser("relay", help="send PENDING outbox events to the sink")
    from batch_assets.outbox.settings import OutboxRelayJobSettings as relay

    add_setting(rl, relay, "batch_size")
    add_setting(rl, relay, "follow")
    add_setting(rl, relay, "follow_seconds", flag="--max-seconds", dest="max_seconds")
    rl.set_defaults(func=cmd_outbox_relay)
