"""Declared jobs: the Dagster components a team writes a defs.yaml for, and their loader
(docs/reference/declarations.md).

`batch_assets.SweepComponent` (sweep_component.py) declares a sweep of the team's own table; `loader.py`
finds every defs.yaml under BATCH_ASSETS_DEFS_DIR. Nothing is imported here: `import batch_assets` stays cheap.
"""
