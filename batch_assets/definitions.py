"""The code location: only wiring (`dagster dev -w workspace.yaml`)."""

from __future__ import annotations

import dagster as dg

from batch_assets.orchestration.assets import ASSET_SPECS, SOURCE_ASSETS, business_tables_observation_job
from batch_assets.orchestration.checks import ASSET_CHECKS, asset_checks_job
from batch_assets.orchestration.jobs import JOBS
from batch_assets.orchestration.resources import default_resources
from batch_assets.orchestration.schedules import SCHEDULES
from batch_assets.orchestration.sensors import SENSORS

defs = dg.Definitions(
    assets=[*SOURCE_ASSETS, *ASSET_SPECS],
    asset_checks=ASSET_CHECKS,
    jobs=[*JOBS, asset_checks_job, business_tables_observation_job],
    schedules=SCHEDULES,
    sensors=SENSORS,
    resources=default_resources(),
)
