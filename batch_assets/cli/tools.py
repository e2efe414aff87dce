"""`batch-assets demo | bench | ui`."""

from __future__ import annotations

import argparse
from typing import Any

from batch_assets.cli.args import (
    at_least_one,
)
from batch_assets.cli.output import emit, err
from batch_assets.settings import Settings


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.demo import run_demo

    return run_demo(settings, rows=args.rows, emit=emit, err=err)


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.bench import run_bench

    return run_bench(args, settings, emit=emit, err=err)


def register(sub: Any) -> None:
    """demo, bench, ui"""
    demo = sub.add_parser("demo", help="the README's main job, end to end")
    demo.add_argument("--rows", type=at_least_one("rows"), default=100_000)
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="the benchmark suite (JSON report)")
    from batch_assets.bench import add_arguments

    add_arguments(bench)
    bench.set_defaults(func=cmd_bench)

    from batch_assets.cli import ui

    ui.register(sub)
