"""batch_assets: fast, safe batch sweeps, a PostgreSQL task queue and nightly jobs, on Dagster."""

from __future__ import annotations

__version__ = "0.1.0"
