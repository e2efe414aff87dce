"""`python -m batch_assets.cli`."""

from batch_assets.cli.main import run

run()
