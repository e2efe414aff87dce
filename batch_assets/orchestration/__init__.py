"""The Dagster layer: config, resources, ops, jobs, schedules, sensors, assets, checks and the CLI launch path.

Everything here is a thin wiring of the engine (which knows nothing of Dagster).
"""
