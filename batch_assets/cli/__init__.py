"""`batch-assets`: one module per command group; `main` parses and dispatches (cli/main.py).

`run` is the process's entry point (the `batch-assets` script, `python -m batch_assets.cli`): the command runs in
a process the resident launcher forks when BATCH_ASSETS_LAUNCHER names one that serves it (cli/launcher.py; its
client is cli/launcher_client.py), else here. Importing this package imports neither: `main` is imported on first use.
"""

from __future__ import annotations

import sys
from typing import Any

from batch_assets.cli.startup import pause_collector

pause_collector()  # before the command groups' imports (start-up, cli/startup.py)

__all__ = ["main", "run"]


def run() -> None:
    from batch_assets.cli.launcher_client import run_through_launcher

    code = run_through_launcher(sys.argv[1:])
    if code is None:
        from batch_assets.cli.main import main

        code = main()
    sys.exit(code)


def __getattr__(name: str) -> Any:
    if name == "main":
        from batch_assets.cli.main import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
