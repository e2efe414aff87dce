"""The code location: only wiring (`dagster dev -w workspace.yaml`).

`defs` is built when Dagster loads the code location, not when this module is imported: the
schedules' time zone (BATCH_ASSETS_TIMEZONE) and whether automation starts RUNNING
(BATCH_ASSETS_AUTOMATION) are read from the environment at that moment.
"""

from __future__ import annotations

import dagster as dg

from batch_assets.orchestration.assets import ASSET_SPECS, SOURCE_ASSETS, SWEEP_ASSETS, business_tables_observation_job
from batch_assets.orchestration.checks import ASSET_CHECKS, asset_checks_job
from batch_assets.orchestration.jobs import ASSET_JOBS, JOBS
from batch_assets.orchestration.resources import default_resources
from batch_assets.orchestration.schedules import build_schedules
from batch_assets.orchestration.sensors import build_sensors
from batch_assets.settings import automation_enabled, load_settings


@dg.definitions
def defs() -> dg.Definitions:
    """Assets, checks, jobs, schedules, sensors and resources of batch_assets."""
    running = automation_enabled()
    return dg.Definitions(
        assets=[*SOURCE_ASSETS, *SWEEP_ASSETS, *ASSET_SPECS],
        asset_checks=ASSET_CHECKS,
        jobs=[*JOBS, *ASSET_JOBS, asset_checks_job, business_tables_observation_job],
        schedules=build_schedules(load_settings().timezone, running=running),
        sensors=build_sensors(running=running),
        resources=default_resources(),
    )
