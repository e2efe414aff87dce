"""`python -m batch_assets.cli`."""

from batch_assets.cli import run

run()
