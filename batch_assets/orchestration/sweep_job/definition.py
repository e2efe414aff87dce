"""What a sweep gives the one sweep-job builder: `SweepJob`, and what the builder hands between its ops.

Required: a name, a description, the table it reads (`source`) and `prepare`, which checks the sweep against the
database and builds its engine plug-in. Everything else has a default a declared sweep uses as it is; the
reference project's customer-status sweep sets the optional hooks (its own names, a third mode, a per-run
resource, extra assets, its own checks and schedules).
"""

# No `from __future__ import annotations`: Dagster reads the settings and task annotations at runtime.

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Literal

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from batch_assets.engine.definition import Sweep
from batch_assets.engine.ranges import CursorRange
from batch_assets.engine.settings import SweepSettings
from batch_assets.settings_model import DatedSettings

DEFAULT_RANGES = 4
MAX_RANGES = 256
SWEEP_TAGS = {"batch_assets/kind": "sweep"}


@dataclass(frozen=True)
class PrepareContext:
    """What `SweepJob.prepare` gets, at plan time and in every range op."""

    engine: sa.Engine
    resources: Any
    """The op's resources: a sweep's own ones (`SweepJob.resource_keys`) by their key, e.g. `resources.encryption`."""


@dataclass(frozen=True)
class Prepared:
    """A sweep checked against the database for one run: its engine plug-in and how its key space splits."""

    definition: Callable[[str, date], Sweep]
    """(mode, run date) → the engine plug-in (one per range op)."""
    plan_ranges: Callable[[sa.Connection, int], list[CursorRange]]
    """(connection, wanted count) → contiguous ranges covering the key space."""
    fingerprint: str
    """What a checkpoint must match to be resumed, besides the run date (e.g. the declaration's or the rules' hash)."""
    overdue: Callable[[sa.Connection, date], int] | None = None
    """Rows still due on or before a run date (the rows-overdue check); None when the sweep has no due date."""
    describe: str = ""
    """One line the plan op adds to its log line (e.g. the rules' version); nothing sensitive."""


@dataclass(frozen=True)
class SweepNames:
    """Every name the builder gives: derived from the sweep's name unless a sweep keeps names of its own."""

    job: str
    """The op job the CLI launches."""
    asset: str
    """The asset the sweep materializes (its main output)."""
    lock: str
    """The job lock's and the lease's name (every mode of the sweep shares it)."""
    checkpoint: str
    """The sweep's name in the checkpoint table."""
    graph: str
    """The graph-backed asset's node: its ops' config nests under it in the asset job."""
    plan_op: str
    range_op: str
    summarise_op: str
    report_op: str
    asset_job: str
    variant_base: str
    """`<variant_base>_<executor>_job` names an executor variant."""

    @classmethod
    def of(cls, name: str) -> "SweepNames":
        return cls(job=name, asset=name, lock=name, checkpoint=name, graph=name, plan_op=f"{name}__plan",
                   range_op=f"{name}__sweep_range", summarise_op=f"{name}__summarise", report_op=f"{name}__report",
                   asset_job=f"{name}_asset_job", variant_base=name)

    def variant(self, executor: str) -> str:
        return f"{self.variant_base}_{executor}_job"


@dataclass(frozen=True)
class ResourceKeys:
    """The resource keys the sweep's ops use: the code location's shared ones, or a declaration's own (prefixed with
    its name, so two declarations with different databases never clash in one code location)."""

    database: str = "database"
    job_lock: str = "job_lock"
    checkpoints: str = "checkpoints"
    calendar: str = "calendar"

    @classmethod
    def prefixed(cls, prefix: str) -> "ResourceKeys":
        return cls(**{role: f"{prefix}{key}" for role, key in dataclasses.asdict(cls()).items()})

    def all(self) -> set[str]:
        return set(dataclasses.asdict(self).values())


@dataclass(frozen=True)
class SweepSchedule:
    """One schedule of a sweep: a mode on a cron (in the sweep's time zone)."""

    mode: str
    cron: str
    name: str | None = None
    """Default `<sweep>_<mode>_schedule`."""
    description: str | None = None


@dataclass(frozen=True)
class ExtraAsset:
    """Another asset a sweep writes in its page transactions (e.g. the triggers and events it inserts)."""

    key: str
    description: str
    metadata: Callable[[Mapping[str, Any]], dict[str, Any]]
    """The run's summary → the asset's metadata for that run."""
    materialization: str = "written by the {mode} sweep for {run_date}"
    """The materialization's description; {mode} and {run_date} are filled in."""


@dataclass(frozen=True)
class SweepJob:
    """One sweep's particulars; `build_sweep_job` makes its ops, graph, jobs, asset, checks and schedules."""

    name: str
    description: str
    prepare: Callable[[PrepareContext], Prepared]
    """Checks the sweep against the database (ConfigError naming the attribute) and builds what it runs."""
    source: dg.AssetKey
    """The table it reads (an upstream asset in the lineage)."""
    modes: tuple[str, ...] = ("delta", "full")
    settings: type[DatedSettings] | None = None
    """The run's settings model (mode, run date, ranges and every engine knob); default from `modes`."""
    config_name: str | None = None
    """The run config class's name (what `jobs list` shows); default `<CamelName>Config`."""
    names: SweepNames | None = None
    """Default `SweepNames.of(name)`."""
    group: str = "declared"
    asset_key: dg.AssetKey | None = None
    """The asset's key; default the asset name."""
    source_asset: Any = None
    """The source table's own asset definition (e.g. an observable source asset); default an AssetSpec."""
    declare_source: bool = True
    """Whether the job defines its source's asset at all. In a team's project it does not: the dependency alone gives
    the lineage an external asset that every sweep of the table shares (or the team's own asset of that key)."""
    keys: ResourceKeys = ResourceKeys()
    """The keys of the resources every sweep uses."""
    resource_keys: tuple[str, ...] = ()
    """The sweep's own resources, handed to `prepare` (their definitions come from `resources`)."""
    resources: Callable[[Any], Mapping[str, Any]] | None = None
    """(settings of the environment) → the sweep's own resources by key (the JobSpec's `resources`)."""
    database_url: Callable[[], str] | None = None
    """Where the sweep's database is when it is not the code location's (a declaration's `database_url`)."""
    report_metadata: Callable[[Mapping[str, Any], sa.Engine], dict[str, Any]] | None = None
    """Extra metadata of the main asset's materialization: (summary, engine) → metadata."""
    extra_assets: tuple[ExtraAsset, ...] = ()
    checks: Callable[[dg.AssetKey], Sequence[dg.AssetChecksDefinition]] | None = None
    """The sweep's asset checks (given the main asset's key); default rows overdue and failures by kind."""
    schedules: tuple[SweepSchedule, ...] = ()
    timezone: str | None = None
    """The schedules' time zone (None = the code location's)."""
    schedule_status: dg.DefaultScheduleStatus | None = None
    """The schedules' default status (None = the code location's automation setting)."""
    variants: Mapping[str, dg.ExecutorDefinition] = field(default_factory=dict)
    """Executor name → the same graph on that executor (e.g. celery)."""


class DeltaFullSettings(DatedSettings, SweepSettings):
    """A ranged sweep with a due date: delta (the due rows, one range) or full (cursor ranges)."""

    mode: Literal["delta", "full"] = Field(default="delta", description="delta | full.")
    ranges: int = Field(default=DEFAULT_RANGES, ge=1, le=MAX_RANGES,
                        description="Cursor ranges (one mapped op each) of a full run; a delta is always one range.")


class FullSettings(DatedSettings, SweepSettings):
    """A ranged sweep without a due date: full only."""

    mode: Literal["full"] = Field(default="full", description="full (the sweep has no due date).")
    ranges: int = Field(default=DEFAULT_RANGES, ge=1, le=MAX_RANGES,
                        description="Cursor ranges (one mapped op each).")


def settings_class(job: SweepJob) -> type[DatedSettings]:
    if job.settings is not None:
        return job.settings
    return DeltaFullSettings if "delta" in job.modes else FullSettings


def ranges_of(op_config: Mapping[str, Any]) -> int:
    """How many cursor ranges a run has, from its plan op's config: a delta is one range."""
    mode = str(op_config.get("mode") or "full")
    if mode == "delta":
        return 1
    return int(op_config.get("ranges") or DEFAULT_RANGES)


@dataclass(frozen=True)
class RangeTask:
    """What the plan op hands each mapped range op (plain data: it may travel to another process)."""

    index: int
    count: int
    cursor_range: CursorRange
    mode: str
    run_date: date
    settings: SweepSettings
    owner: str
    started_at: datetime
    fingerprint: str
    generation: str | None = None
    """The run's checkpoint generation (the plan registered every range in it): a range that finished in it is
    not read again."""

    @property
    def label(self) -> str:
        return f"range {self.index + 1}/{self.count}" if self.count > 1 else "sweep"
