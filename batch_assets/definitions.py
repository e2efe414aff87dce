"""The code location: only wiring (`dagster dev -w workspace.yaml`), read from the job registry.

`defs` is built when Dagster loads the code location, not when this module is imported: the
schedules' time zone (BATCH_ASSETS_TIMEZONE) and whether automation starts RUNNING
(BATCH_ASSETS_AUTOMATION) are read from the environment at that moment.
"""

from __future__ import annotations

import logging

import dagster as dg

from batch_assets.orchestration import registry
from batch_assets.settings import automation_enabled, load_settings

log = logging.getLogger(__name__)


@dg.definitions
def defs() -> dg.Definitions:
    """Assets, checks, jobs, schedules, sensors and resources of every registered job."""
    running = automation_enabled()
    settings = load_settings()
    # A declaration that cannot work (CONTRACT §9) is left out, logged, and named in the code location's
    # metadata; every other job still loads. `batch-assets jobs list` refuses it with exit 2.
    broken = [str(error) for error in registry.declared()[1]]
    for line in broken:
        log.error("declared job not loaded: %s", line)
    return dg.Definitions(
        metadata={"declaration_errors": dg.MetadataValue.json(broken)} if broken else None,
        assets=registry.assets(),
        asset_checks=registry.asset_checks(),
        jobs=[*registry.op_jobs(), *registry.asset_jobs(), registry.asset_checks_job,
              registry.business_tables_observation_job],
        schedules=registry.schedules(settings.timezone, running=running),
        sensors=registry.sensors(running=running),
        resources=registry.resources(settings),
    )
