"""`JobSpec`: everything a code location and the CLI need to know about one job.

Each job's module declares one `SPEC` (the one sweep-job and queue-job builders make them); a `Project` lists them.
Nothing here knows any particular job.
"""

# No `from __future__ import annotations`: the dataclass is read at runtime by the code location only,
# but keeping the annotations real keeps mypy and readers honest.

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import sqlalchemy as sa

from batch_assets.db.privileges import Privilege
from batch_assets.orchestration.config import JobConfig
from batch_assets.settings import Settings

ScheduleBuilder = Callable[[str, dg.DefaultScheduleStatus], Sequence[dg.ScheduleDefinition]]
"""(execution time zone, default status) → the job's schedules; called when the code location loads."""
SensorBuilder = Callable[[dg.DefaultSensorStatus], Sequence[dg.SensorDefinition]]
"""(default status) → the job's sensors; called when the code location loads."""


@dataclass(frozen=True)
class JobSpec:
    """One job of the code location."""

    job: dg.JobDefinition
    """The op job the CLI launches (by `job.name`)."""
    config: type[JobConfig]
    """Its run config; `config_op` carries it in the run config."""
    config_op: str
    variants: Mapping[str, dg.JobDefinition] = field(default_factory=dict)
    """Executor name → the same graph on that executor (e.g. "celery")."""
    asset_jobs: Sequence[Any] = ()
    """Asset jobs that materialize this job's assets (schedules and sensors may target them)."""
    assets: Sequence[Any] = ()
    """Its assets, source assets and asset specs (lineage in the UI)."""
    asset_checks: Sequence[Any] = ()
    schedules: ScheduleBuilder | None = None
    sensors: SensorBuilder | None = None
    release_after_failure: Callable[[str, sa.Engine, str | None], None] | None = None
    """(root run id, engine, Redis URL of the lock store or None) → give back the lock and lease a failed run of this
    job still holds (the failure sensor passes its database and job_lock resources; the CLI its own)."""
    mapped_op: str | None = None
    """The op mapped over cursor ranges: an unfinished step of it is an unfinished range."""
    merge_records: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None
    """Merges the per-range summaries of a run whose summary op never ran."""
    resources: Callable[[Settings], Mapping[str, Any]] | None = None
    """(settings) → the job's own resources, chosen by the environment when the code location loads
    (e.g. the outbox sink); keyed by the op parameter names."""
    database_url: Callable[[], str] | None = None
    """The job's database when it is not the code location's (a declaration's `database_url`): where the CLI
    checks migrations and reads the run's summary. A secret: never printed."""
    privileges: tuple[Privilege, ...] = ()
    """The grants a run of the job needs (the library's bookkeeping, the queue's table): checked before the CLI
    launches it, so a role that lacks one is refused with one line naming it (docs/production/privileges.md)."""

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def job_names(self) -> tuple[str, ...]:
        """Every job name this spec answers for: the op job, its variants and its asset jobs."""
        return (self.job.name, *(j.name for j in self.variants.values()), *(j.name for j in self.asset_jobs))

    @property
    def op_jobs(self) -> tuple[dg.JobDefinition, ...]:
        """The op jobs a launch may target: the job and its executor variants."""
        return (self.job, *self.variants.values())
