"""The one builder of a ranged sweep's Dagster job: what a sweep gives it (`SweepJob`), and `build_sweep_job`.

A declared sweep (`SweepComponent`) and the reference project's customer-status sweep are both built here.
"""

from batch_assets.orchestration.sweep_job.build import asset_job_run_config, build_sweep_job
from batch_assets.orchestration.sweep_job.definition import (
    ExtraAsset,
    PrepareContext,
    Prepared,
    RangeTask,
    ResourceKeys,
    SweepJob,
    SweepNames,
    SweepSchedule,
)
from batch_assets.orchestration.sweep_job.summaries import merge_range_records, merge_summaries

__all__ = ["ExtraAsset", "PrepareContext", "Prepared", "RangeTask", "ResourceKeys", "SweepJob", "SweepNames",
           "SweepSchedule", "asset_job_run_config", "build_sweep_job", "merge_range_records", "merge_summaries"]
