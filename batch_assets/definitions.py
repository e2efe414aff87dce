"""This repository's code location (`dg dev`, `dagster dev -w workspace.yaml`): the reference project on the
library, plus the declarations under BATCH_ASSETS_DEFS_DIR. Only wiring.

`defs` is built when Dagster loads the code location, not when this module is imported: the schedules' time zone
(BATCH_ASSETS_TIMEZONE) and whether automation starts RUNNING (BATCH_ASSETS_AUTOMATION) are read then.
"""

from __future__ import annotations

import dagster as dg

from batch_assets.orchestration import location
from batch_assets.reference.project import PROJECT
from batch_assets.settings import automation_enabled, load_settings

__all__ = ["PROJECT", "defs"]


@dg.definitions
def defs() -> dg.Definitions:
    """Assets, checks, jobs, schedules, sensors and resources of every job of the code location."""
    return location.definitions(PROJECT, load_settings(), running=automation_enabled())
