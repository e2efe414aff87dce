"""Declared jobs: the Dagster components a team writes a defs.yaml for (CONTRACT §9, §10), and their loader.

`batch_assets.SweepComponent` (sweep_component.py) declares a sweep of the team's own table; `loader.py`
finds every defs.yaml under BATCH_ASSETS_DEFS_DIR. Nothing is imported here: `import batch_assets` stays cheap.
"""
