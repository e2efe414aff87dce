"""`batch-assets bench`: placeholder until the benchmark suite lands (see issue 3)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from batch_assets.errors import ConfigError
from batch_assets.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--output", default="bench-results/bench.json")


def run_bench(args: argparse.Namespace, settings: Settings, *, emit: Callable[[dict[str, Any]], None],
              err: Callable[[str], None]) -> int:
    raise ConfigError("the benchmark suite is not built yet")
