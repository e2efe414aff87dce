"""batch_assets: fast, safe batch sweeps, a PostgreSQL task queue and nightly jobs, on Dagster."""

from __future__ import annotations

from batch_assets.domains.payments.errors import PermanentFailure

__version__ = "0.1.0"
__all__ = ["PermanentFailure", "__version__"]
