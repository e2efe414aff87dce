"""`batch-assets`: one module per command group; `main` parses and dispatches (cli/main.py)."""

from __future__ import annotations

from batch_assets.cli.startup import pause_collector

pause_collector()  # before the command groups' imports (start-up, cli/startup.py)

from batch_assets.cli.main import main, run  # noqa: E402

__all__ = ["main", "run"]
