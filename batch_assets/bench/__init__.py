"""`batch-assets bench`: the benchmark suite, as a report people can read.

One command measures the product's sweep beside two references written from
the contract (the naive job of seed 000 and a single-stream floor), Dagster's
run start-up on its own, the payment queue, and the checks (statements per
page, EXPLAIN plans, peak RSS against table size, writes of a second run);
it writes a JSON report, a markdown table and PNG charts.

Modules, one per part: `options` (command line), `scratch` (the dedicated
database and table states), `sweeps` (the product), `references` (naive job
and floor), `startup`, `plans`, `queue`, `memory`, `render` and `charts` (the
readable report), `outputs` (the files written), `check` (`python -m batch_assets.bench.check REPORT.json`),
and `suite` (the order of a run).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from batch_assets.bench.options import add_arguments
from batch_assets.settings import Settings

__all__ = ["add_arguments", "run_bench"]


def run_bench(
    args: argparse.Namespace,
    settings: Settings,
    *,
    emit: Callable[[dict[str, Any]], None],
    err: Callable[[str], None],
) -> int:
    """Run the suite (imported here: building the CLI parser must not pay for the bench's imports).

    The charts need the `bench` extra (matplotlib), which the product's runtime install does not carry:
    without it the bench stops at once with exit 2 and the command that installs it, before measuring.
    """
    from batch_assets.extras import installed, missing_extra_error

    if not installed("matplotlib"):
        raise missing_extra_error("matplotlib")
    from batch_assets.bench.suite import run_bench as run

    return run(args, settings, emit=emit, err=err)
