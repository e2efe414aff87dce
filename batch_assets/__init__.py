"""batch_assets: fast, safe batch sweeps, a PostgreSQL task queue and nightly jobs, on Dagster."""

from __future__ import annotations

from batch_assets.errors import PermanentFailure, RetryAfter

__version__ = "0.1.0"
__all__ = ["PermanentFailure", "RetryAfter", "RowFailure", "SweepComponent", "TableQueueComponent", "__version__"]

# Declared jobs (CONTRACT §9, §10), imported on first use so `import batch_assets` stays cheap:
# name -> the module that defines it.
_LAZY = {
    "RowFailure": "batch_assets.errors",
    "SweepComponent": "batch_assets.orchestration.components.sweep_component",
    "TableQueueComponent": "batch_assets.orchestration.components.table_queue",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'batch_assets' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
