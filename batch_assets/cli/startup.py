"""The CLI process's start-up: no cyclic garbage collection while the command imports its modules.

A job command imports about 170,000 long-lived objects (Dagster, SQLAlchemy, pydantic, the job's module)
before its run starts. With the collector on, the allocations of those imports trigger collection after
collection, and every full one walks everything imported so far: about a third of a CLI delta's CPU time.
So the collector is off from the CLI's first import, and when the command has imported what it needs
(`resume_collector`, in `run_job` before the run; in `main` for every other command) what was imported is
moved out of the collector's reach (`gc.freeze`, the way Python's documentation gives for long-lived start-up
state) and collection is on again for the work itself: a resident queue worker collects as always. What the
imports left as cyclic garbage (about a thousand objects) is kept, once.

Only in a process started as the CLI (`batch-assets` or `python -m batch_assets.cli`): a test or a library
that imports `batch_assets.cli` keeps its collector as it is.
"""

from __future__ import annotations

import gc
import os
import sys


def started_as_cli() -> bool:
    """Whether this process is `batch-assets ...` or `python [options] -m batch_assets.cli ...`."""
    if sys.argv and os.path.basename(sys.argv[0]) == "batch-assets":
        return True
    argv = list(getattr(sys, "orig_argv", ()))
    return "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 2] == ["batch_assets.cli"]


def pause_collector() -> None:
    """Collection off for the CLI's imports (a process started as the CLI only)."""
    if started_as_cli():
        gc.disable()


def resume_collector() -> None:
    """What is imported by now leaves the collector's generations and collection is on again (if it was paused)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
