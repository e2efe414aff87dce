"""`batch-assets`: one module per command group; `main` parses and dispatches (cli/main.py)."""

from __future__ import annotations

from batch_assets.cli.main import main, run

__all__ = ["main", "run"]
