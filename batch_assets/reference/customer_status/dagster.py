"""The customer-status sweep in Dagster: its config, ops, graph, jobs, assets, checks, schedules and sensor.

plan_sweep         validates config, fixes the run date once, takes lock + lease as the run's
                   owner and maps one `RangeTask` per UUID cursor range (delta: one range);
sweep_range        (mapped) joins the run's lock and lease, runs the engine on its range
                   with its own checkpoint and progress, fails on FAILURE so a re-execution
                   from failure resumes exactly the unfinished ranges from their checkpoints;
summarise_sweep    merges the ranges, records the summary in run history, releases lock and
                   lease;
report_customer_status  reports customer_status, review_triggers and outbox_events.

Jobs: `customer_status_sweep_job` (what the CLI launches), its celery variant, and
`customer_status_asset_job`, the same graph as a graph-backed multi-asset (what schedules, the
rules sensor and "Materialize" in the UI start). Lineage:

    customers ─▶ customer_status ─▶ review_triggers
                                └─▶ outbox_events
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import date, datetime
from typing import Any, cast

import dagster as dg
import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.engine.definition import CursorRange
from batch_assets.engine.ranges import even_split
from batch_assets.engine.result import SKIPPED, SUCCESS
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import BatchAssetsError, ConfigError, LockNotAcquired, error_text
from batch_assets.locking.lock import make_job_lock
from batch_assets.locking.run_guard import (
    acquire_run_lock,
    joined_guard,
    release_failed_run,
    run_owner,
)
from batch_assets.orchestration.automation import IN_PROGRESS, schedule_timezone, tick_date
from batch_assets.orchestration.budget import APP_DATABASE_POOL
from batch_assets.orchestration.celery import celery_on_redis_executor
from batch_assets.orchestration.config import JobConfig, config_class
from batch_assets.orchestration.executors import in_one_process, ranges_executor
from batch_assets.orchestration.metadata import counts_table, observable_table, records_table, run_numbers
from batch_assets.orchestration.ops import (
    config_failure,
    empty_summary,
    finish,
    resolve_run_date,
    stop_on_interrupt,
    summary_metadata,
    utcnow,
    validated_plan,
)
from batch_assets.orchestration.progress import OpProgress
from batch_assets.orchestration.resources import (
    AlertsResource,
    CalendarResource,
    CheckpointsResource,
    DatabaseResource,
    JobLockResource,
)
from batch_assets.orchestration.spec import JobSpec
from batch_assets.orchestration.sweep_job import (
    RANGE_COLUMNS,
    merge_range_records,
    record_range,
    summarise_op,
)
from batch_assets.reference.customer_status import sql
from batch_assets.reference.customer_status.job import DEFAULT_RANGES, CustomerStatusSettings, checkpoint_fingerprint
from batch_assets.reference.customer_status.resources import EncryptionResource, encryption_resources
from batch_assets.reference.customer_status.rules_store import current_rules
from batch_assets.reference.customer_status.sweep import SWEEP_NAME
from batch_assets.shutdown import STOP

log = logging.getLogger(__name__)

SWEEP_JOB_KEY = "customer_status_sweep"
"""The lock and lease name shared by delta, full and config-change (they never overlap)."""
SWEEP_TAGS = {"batch_assets/kind": "sweep"}
GROUP = "customer_status"

# --- config ------------------------------------------------------------------------------


SweepConfig = config_class(
    CustomerStatusSettings, "SweepConfig",
    "Customer-status sweep (CONTRACT §2 `sweep customer-status`), derived from CustomerStatusSettings.",
)
"""The run config: launchpad fields, defaults and descriptions derived from CustomerStatusSettings, the mode a
config Enum (the launchpad refuses 'fulll'); `to_settings()` builds the settings model (every bound, one place)."""


@dataclass(frozen=True)
class RangeTask:
    """What plan_sweep hands each mapped sweep_range: typed, validated once in plan_sweep."""

    index: int
    count: int
    cursor_range: CursorRange
    mode: str
    run_date: date
    settings: SweepSettings
    owner: str
    started_at: datetime
    rules_fingerprint: str
    generation: str | None = None
    """The run's checkpoint generation (plan_sweep registered every range in it): a range that finished
    in it is not read again."""

    @property
    def label(self) -> str:
        return f"range {self.index + 1}/{self.count}" if self.count > 1 else "sweep"


# --- ops ---------------------------------------------------------------------------------


def split_key_space(count: int) -> list[CursorRange]:
    """`count` contiguous inclusive UUID ranges of equal width covering the whole key space (customer ids are
    random UUIDs, so equal widths hold about equal rows; the range keys of existing checkpoints stay the same)."""
    return even_split("uuid", count)


def _root_run_id(context: dg.OpExecutionContext) -> str:
    return context.run.root_run_id or context.run_id


SWEEP_GRAPH_NODE = "customer_status_sweep"
"""The graph-backed asset's node in customer_status_asset_job: its ops' config nests under it."""


def ranges_of(op_config: Mapping[str, Any]) -> int:
    """How many cursor ranges a run has, from plan_sweep's config: a delta is one range (`ranges_executor`)."""
    if op_config.get("mode") == "delta":
        return 1
    return int(op_config.get("ranges") or DEFAULT_RANGES)


def _in_process(context: dg.OpExecutionContext) -> bool:
    """Whether every op of this run executes in this process (`ranges_executor`'s rule for the two jobs that
    carry it; the celery variant's steps run on celery workers, never here)."""
    plan_op = {"customer_status_sweep_job": "plan_sweep",
               "customer_status_asset_job": f"{SWEEP_GRAPH_NODE}.plan_sweep"}.get(context.job_name)
    return plan_op is not None and in_one_process(context.run.run_config, plan_op, ranges_of)


def config_from_run(op_config: Any) -> JobConfig:
    """The run's SweepConfig from the op's config, checked like the CLI's (`from_values`, then `to_settings` in
    validated_plan): a value the launchpad's types let through (`workers: 100000`, `run_date: "tomorrow"`) fails
    the run with one line naming the field, not a pydantic trace."""
    try:
        return SweepConfig.from_values(dict(op_config or {}))
    except ConfigError as exc:
        raise config_failure(exc) from None


@dg.op(
    out=dg.DynamicOut(RangeTask, description="One task per cursor range."),
    tags={"kind": "sweep"},
    # The launchpad checks this schema (field types, the mode Enum) before the run starts; the bounds and
    # the run date are checked by config_from_run when it starts.
    config_schema=cast(Any, SweepConfig.to_config_schema()),
)
def plan_sweep(
    context: dg.OpExecutionContext,
    database: DatabaseResource,
    encryption: EncryptionResource,
    job_lock: JobLockResource,
    checkpoints: CheckpointsResource,
    calendar: CalendarResource,
) -> Iterator[dg.DynamicOutput[RangeTask]]:
    """Validate the run config, fix the run date, take the run's lock + lease, register the ranges' checkpoint
    generation (resuming an unfinished one) and map the cursor ranges."""
    started_at = utcnow()
    config = config_from_run(context.op_config)
    # A missing or malformed key stops the run here too, before any read.
    plan = validated_plan(config, encryption.cipher)
    run_date = resolve_run_date(plan, calendar)
    engine = database.get_engine()
    owner = run_owner(_root_run_id(context), single_process=_in_process(context))
    try:
        acquire_run_lock(
            engine, job_lock.lock_for(engine), job_key=SWEEP_JOB_KEY, owner=owner, settings=plan.engine
        )
    except LockNotAcquired as exc:
        summary = empty_summary(
            SKIPPED, context.run_id, reason=str(exc), mode=plan.mode, run_date=run_date.isoformat(), pages=0,
            decrypted=0, triggers=0, audit_events=0, conflicts=0, resumed_from=None,
        )
        finish(context, engine, summary=summary, started_at=started_at, mode=plan.mode, run_date=run_date,
               output_metadata=False)
        return
    with engine.connect() as conn:
        version, rules = current_rules(conn)
    ranges = [CursorRange()] if plan.ranges == 1 else split_key_space(plan.ranges)
    # Decided once, here, for every range: whatever order and timing the ranges then run in, a range that
    # finished in the generation this run resumes is not read again (CONTRACT §5).
    generation = checkpoints.store(engine).begin(
        SWEEP_NAME, plan.mode, [r.key for r in ranges], fingerprint=checkpoint_fingerprint(rules, run_date),
        run_id=context.run_id, run_date=run_date,
    )
    resumed = f"resumes generation {generation.id} ({len(generation.finished)} range(s) finished)" \
        if generation.resumed else f"checkpoint generation {generation.id}"
    context.log.info(
        f"sweep mode={plan.mode} run_date={run_date} ranges={len(ranges)} owner={owner} "
        f"rules v{version} ({rules.fingerprint}); {resumed}"
    )
    for index, cursor_range in enumerate(ranges):
        yield dg.DynamicOutput(
            RangeTask(
                index=index,
                count=len(ranges),
                cursor_range=cursor_range,
                mode=plan.mode,
                run_date=run_date,
                settings=plan.engine,
                owner=owner,
                started_at=started_at,
                rules_fingerprint=rules.fingerprint,
                generation=generation.id,
            ),
            mapping_key=f"r{index:03d}_of_{len(ranges):03d}",
        )


@dg.op(tags={"kind": "sweep"}, pool=APP_DATABASE_POOL)
def sweep_range(
    context: dg.OpExecutionContext,
    task: RangeTask,
    database: DatabaseResource,
    encryption: EncryptionResource,
    job_lock: JobLockResource,
    checkpoints: CheckpointsResource,
) -> dict:
    """Sweep one cursor range under the run's lock and lease, resuming from its checkpoint."""
    from batch_assets.reference.customer_status.job import run_customer_status_sweep

    settings, cursor_range, label = task.settings, task.cursor_range, task.label
    engine = database.get_engine(min_pool_size=settings.pool_size)
    progress = OpProgress(context, label=label, asset_key="customer_status", every_pages=settings.summary_every_pages)
    try:
        with stop_on_interrupt(), progress, joined_guard(
            engine, job_lock.lock_for(engine), job_key=SWEEP_JOB_KEY, owner=task.owner, settings=settings
        ) as guard:
            result = run_customer_status_sweep(
                engine,
                encryption.cipher(),
                mode=task.mode,
                run_date=task.run_date,
                settings=settings,
                run_id=context.run_id,
                guard=guard,
                checkpoints=checkpoints.store(engine).in_generation(task.generation),
                stop=STOP,
                cursor_range=cursor_range,
                progress=progress,
            )
    except LockNotAcquired as exc:
        raise dg.Failure(
            description=f"{label}: lost the run's lock to another run: {exc}", allow_retries=False
        ) from None
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        # The lock store or the database went away outside the engine's own retries (joining the
        # lock, loading rules or the checkpoint): the range did not run to its end. Fail the step
        # cleanly, resumable from its checkpoint; the launch counts it as an unfinished range.
        raise dg.Failure(
            description=f"{label} did not finish: {error_text(exc)}",
            metadata={"range": cursor_range.key, "resumable": "True", "error": error_text(exc)},
            allow_retries=False,
        ) from None
    except BaseException as exc:
        if not isinstance(exc, Exception):
            # Run termination (DagsterExecutionInterruptedError): the engine drained and recorded its
            # low watermark; give back the run's lock and lease now (the summary op will not run).
            try:
                release_failed_run(engine, job_lock.lock_for(engine), job_key=SWEEP_JOB_KEY,
                                   root_run_id=_root_run_id(context))
            finally:
                log_termination(context, engine, task, encryption, checkpoints)
        raise
    summary = result.to_summary()
    summary["range"] = cursor_range.key
    summary["owner"] = task.owner
    summary["started_at"] = task.started_at.isoformat()
    metadata = summary_metadata(summary)
    # Every range records its own numbers, so a run whose summary op never runs (a range failed)
    # still reports what every range did.
    try:
        record_range(context, engine, summary, task)
    except sa.exc.SQLAlchemyError as exc:
        # The step's own outcome (below) is what the run's outcome is made of; the record only
        # carries the numbers of a range whose run has no summary op.
        context.log.warning(f"{label}: summary not recorded in run history: {error_text(exc)}")
    if result.status != SUCCESS:
        # Fail the step (not just the run) so a re-execution from failure resumes this range.
        reason = summary.get("stopped_reason") or result.status
        raise dg.Failure(description=f"{label} ended {result.status}: {reason}", metadata=metadata,
                         allow_retries=False)
    context.add_output_metadata(metadata)
    return summary


def log_termination(
    context: dg.OpExecutionContext, engine: sa.Engine, task: RangeTask, encryption: EncryptionResource,
    checkpoints: CheckpointsResource,
) -> None:
    """One product log line when a run is terminated: what this range drained and where its checkpoint stands
    (the definition's display_cursor: ids only, never a date derived from a date of birth)."""
    from batch_assets.reference.customer_status.sweep import CustomerStatusSweep

    fingerprint = f"{task.rules_fingerprint}:{task.run_date}"
    try:
        saved = checkpoints.store(engine).in_generation(task.generation).load(
            SWEEP_NAME, task.mode, task.cursor_range.key, fingerprint)
        with engine.connect() as conn:
            _, rules = current_rules(conn)
        definition = CustomerStatusSweep(task.mode, cipher=encryption.cipher(), run_date=task.run_date, rules=rules)
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        context.log.warning(f"{task.label} terminated; its checkpoint could not be read: {error_text(exc)}")
        return
    if saved is None:
        context.log.warning(f"{task.label} terminated before its first checkpoint: the next run starts it over")
        return
    counters = saved.counters or {}
    done = ", ".join(f"{k} {int(counters.get(k) or 0):,}" for k in ("scanned", "changed", "failed", "pages"))
    shown = json.dumps(definition.reader.display_cursor(saved.cursor))
    context.log.warning(
        f"{task.label} terminated: the pages in flight were drained and written ({done}); checkpoint "
        f"{'finished' if saved.finished else 'at ' + shown}; "
        f"the next {task.mode} run for the same rules and run date resumes from it"
    )


summarise_sweep = summarise_op(
    "summarise_sweep", SWEEP_JOB_KEY,
    "Merge the ranges, record the run summary, release lock and lease (report_customer_status reports the assets).",
)



# --- assets --------------------------------------------------------------------------------

customers = observable_table(
    "customers",
    "SELECT status, count(*) AS n, max(updated_at)::text AS latest FROM customers GROUP BY status",
    "Customers (written by other services); ACTIVE rows are swept.",
)

SWEEP_ASSET_KEYS = [dg.AssetKey("customer_status"), dg.AssetKey("review_triggers"), dg.AssetKey("outbox_events")]


@dg.op(
    out={
        "customer_status": dg.Out(dg.Nothing, is_required=False),
        "review_triggers": dg.Out(dg.Nothing, is_required=False),
        "outbox_events": dg.Out(dg.Nothing, is_required=False),
    },
    ins={"customers": dg.In(dg.Nothing)},
    tags={"kind": "sweep"},
)
def report_customer_status(
    context: dg.OpExecutionContext, summary: dict, ranges: list, database: DatabaseResource
) -> Iterator[dg.Output]:
    """Report the sweep's three assets with numeric metadata (charted in Plots); nothing for a SKIPPED run.

    In the asset job these are the multi-asset's outputs (materializations of those assets); in the op
    jobs the CLI launches, the same metadata is logged as AssetMaterialization events.
    """
    if not summary:  # plan_sweep was skipped (another run held the lock): nothing was materialized
        context.log.info("the sweep was skipped: no materialization")
        return
    engine = database.get_engine()
    counts, categories = counts_table(engine, sql.CATEGORY_COUNTS, label="age_category")
    run_date, mode = str(summary.get("run_date")), str(summary.get("mode"))
    common = {"run_date": run_date, "mode": mode, **run_numbers(summary)}
    reports: dict[str, tuple[str, dict[str, Any]]] = {
        "customer_status": (f"{mode} sweep for {run_date}", {
            **common,
            "pages": int(summary.get("pages") or 0),
            "decrypted": int(summary.get("decrypted") or 0),
            "conflicts": int(summary.get("conflicts") or 0),
            "ranges": int(summary.get("ranges") or 0),
            "active_customers": sum(counts.values()),
            "failed_by_type": records_table(
                [{"kind": k, "rows": int(v)} for k, v in sorted((summary.get("failed_by_type") or {}).items())],
                ("kind", "rows"),
            ),
            "counts_by_category": categories,
            "cursor_ranges": records_table(ranges, RANGE_COLUMNS),
        }),
        "review_triggers": (f"review triggers written by the {mode} sweep for {run_date}",
                            {**common, "triggers": int(summary.get("triggers") or 0)}),
        "outbox_events": (f"age_category_changed events written by the {mode} sweep for {run_date}",
                          {**common, "events": int(summary.get("audit_events") or 0)}),
    }
    for key, (description, metadata) in reports.items():
        if context.has_assets_def:
            yield dg.Output(None, key, metadata=metadata)
        else:
            context.log_event(dg.AssetMaterialization(
                asset_key=key, description=description, metadata=metadata, tags={"mode": mode, "run_date": run_date}
            ))


SWEEP_ASSET_DESCRIPTIONS = {
    "customer_status": "age_category and next_review_date of ACTIVE customers (the customer-status sweep).",
    "review_triggers": "One review trigger per category change (unique per customer, category and effective date); "
    "written by the sweep in the page write of the status.",
    "outbox_events": "age_category_changed events, one per changed customer, written by the sweep with the status; "
    "relayed by outbox_relay_job.",
}


@dg.graph(
    name="customer_status_sweep",
    ins={"customers": dg.GraphIn()},
    out={name: dg.GraphOut() for name in SWEEP_ASSET_DESCRIPTIONS},
    description="The customer-status sweep: plan cursor ranges, sweep each (mapped), summarise, report.",
)
def customer_status_sweep_assets_graph(customers: Any) -> Any:  # a graph body: Dagster wires the nodes
    ranges = plan_sweep().map(sweep_range).collect()
    return report_customer_status(summarise_sweep(ranges), ranges, customers=customers)


customer_status_sweep = dg.AssetsDefinition.from_graph(
    customer_status_sweep_assets_graph,
    keys_by_input_name={"customers": dg.AssetKey("customers")},
    keys_by_output_name={name: dg.AssetKey(name) for name in SWEEP_ASSET_DESCRIPTIONS},
    # The lineage of what the sweep writes: the status from the customers, the triggers and the events from
    # the status (CONTRACT §5: a changed status writes one trigger and one event).
    internal_asset_deps={
        "customer_status": {dg.AssetKey("customers")},
        "review_triggers": {dg.AssetKey("customer_status")},
        "outbox_events": {dg.AssetKey("customer_status")},
    },
    group_name=GROUP,
    descriptions_by_output_name=SWEEP_ASSET_DESCRIPTIONS,
    tags_by_output_name={name: {"dagster/kind/postgres": ""} for name in SWEEP_ASSET_DESCRIPTIONS},
    can_subset=False,
)
"""customer_status, review_triggers and outbox_events: one graph-backed multi-asset over the sweep graph."""


# --- checks (they run inside every run that materializes their assets) ------------------------



@dg.asset_check(
    asset="customer_status",
    description="After the last successful delta, no ACTIVE customer is still due on or before its run date "
    "(rows the run could not evaluate are allowed, up to its failed count).",
)
def no_overdue_active_customers(database: DatabaseResource) -> dg.AssetCheckResult:
    with database.get_engine().connect() as conn:
        last = conn.execute(sql.LAST_DELTA_SQL).first()
        if last is None:
            return dg.AssetCheckResult(passed=True, metadata={"last_delta_run_date": "none yet"})
        run_date: date = last.run_date
        overdue = int(conn.execute(sql.OVERDUE_SQL, {"run_date": run_date}).scalar_one())
    return dg.AssetCheckResult(
        passed=overdue <= int(last.failed),
        metadata={"last_delta_run_date": str(run_date), "overdue": overdue, "failed_in_run": int(last.failed)},
    )


@dg.asset_check(asset="review_triggers", description="Review triggers are unique per customer, category and date.")
def review_triggers_unique(database: DatabaseResource) -> dg.AssetCheckResult:
    with database.get_engine().connect() as conn:
        duplicates = int(conn.execute(sql.DUPLICATE_TRIGGERS_SQL).scalar_one())
    return dg.AssetCheckResult(passed=duplicates == 0, metadata={"duplicate_keys": duplicates})


# --- jobs ----------------------------------------------------------------------------------


@dg.graph(description="Customer-status sweep: plan cursor ranges, sweep each (mapped), summarise, report.")
def customer_status_sweep_graph() -> None:
    ranges = plan_sweep().map(sweep_range).collect()
    report_customer_status(summarise_sweep(ranges), ranges)


customer_status_sweep_job = customer_status_sweep_graph.to_job(
    name="customer_status_sweep_job",
    description="Recompute age_category / next_review_date (delta, full or config-change) over cursor ranges "
    "(the job the CLI launches; customer_status_asset_job is the same sweep as assets).",
    tags=SWEEP_TAGS,
    # A delta (one range) runs in the run worker's own process; several ranges get a process per step.
    executor_def=ranges_executor("plan_sweep", ranges_of),
)

customer_status_asset_job = dg.define_asset_job(
    "customer_status_asset_job",
    selection=dg.AssetSelection.assets(*SWEEP_ASSET_KEYS),
    description="Materialize customer_status, review_triggers and outbox_events with the customer-status sweep "
    "(plan → cursor ranges → summary) and run their asset checks. Config: "
    "ops.customer_status_sweep.ops.plan_sweep.config (mode, run_date, ...).",
    tags=SWEEP_TAGS,
    executor_def=ranges_executor(f"{SWEEP_GRAPH_NODE}.plan_sweep", ranges_of),
)

customer_status_sweep_celery_job = customer_status_sweep_graph.to_job(
    name="customer_status_sweep_celery_job",
    description="The customer-status sweep with its cursor ranges executed on celery workers. Needs a running "
    "celery worker on queue 'dagster' (see README); without one the run fails after worker_wait_s (30 s).",
    executor_def=celery_on_redis_executor,
    tags=SWEEP_TAGS,
)


def release_after_failure(root_run_id: str, engine: sa.Engine, redis_url: str | None) -> None:
    """A failed sweep run (breaker, SIGTERM, lost lease, defect) gives back what it still holds.

    Best effort: with the database or the lock store down, lease and lock expire on their own
    (and a dead holder is taken over at once), and the run's outcome must still be reported.
    """
    try:
        release_failed_run(engine, make_job_lock(engine, redis_url), job_key=SWEEP_JOB_KEY, root_run_id=root_run_id)
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        log.warning("run %s: lock and lease not released, they will expire: %s", root_run_id, error_text(exc))


# --- schedules and the rules sensor -----------------------------------------------------------



def sweep_run_config(config: JobConfig) -> dict:
    """Run config of customer_status_asset_job for one sweep (plan_sweep's config, nested under the graph)."""
    return {"ops": {SWEEP_GRAPH_NODE: {"ops": {"plan_sweep": {"config": config.model_dump(mode="json")}}}}}


def _sweep_tick(mode: str, timezone: str) -> Callable[[dg.ScheduleEvaluationContext], dg.RunRequest]:
    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        run_date = tick_date(context, timezone)
        return dg.RunRequest(
            run_key=f"{mode}:{run_date or 'now'}",
            run_config=sweep_run_config(SweepConfig(mode=mode, run_date=run_date or None)),
            tags={"batch_assets/mode": mode, "batch_assets/run_date": run_date},
        )

    return evaluate


def build_schedules(timezone: str, status: dg.DefaultScheduleStatus) -> list[dg.ScheduleDefinition]:
    """Daily delta at 02:00 and weekly full on Sunday at 03:00; they target the assets, so the asset pages
    show their automation."""
    tz = schedule_timezone(timezone)
    return [
        dg.ScheduleDefinition(
            name="daily_delta_schedule",
            cron_schedule="0 2 * * *",
            job=customer_status_asset_job,
            execution_fn=_sweep_tick("delta", tz),
            execution_timezone=tz,
            default_status=status,
            description="Delta sweep every day at 02:00: customers due on the run date or not computed yet.",
        ),
        dg.ScheduleDefinition(
            name="weekly_full_schedule",
            cron_schedule="0 3 * * 0",
            job=customer_status_asset_job,
            execution_fn=_sweep_tick("full", tz),
            execution_timezone=tz,
            default_status=status,
            description="Full sweep every Sunday at 03:00 (every ACTIVE customer, in cursor ranges).",
        ),
    ]


def current_fingerprint(database: DatabaseResource) -> tuple[int, str, int | None]:
    """(current version, its fingerprint, the first version that ever had this fingerprint)."""
    with database.get_engine().connect() as conn:
        version, rules = current_rules(conn)
        first = conn.execute(sql.FIRST_VERSION_OF, {"fingerprint": rules.fingerprint}).scalar()
    return version, rules.fingerprint, first


def rules_run_key(version: int, fingerprint: str, first_version: int | None) -> str:
    """The run key of the config-change sweep for a rules version: its fingerprint.

    Dagster never starts a second run for a key a sensor already used, so a change *back* to
    earlier rules (A → B → A) gets the fingerprint qualified by its version: two changes, two sweeps.
    """
    if first_version is None or first_version == version:
        return fingerprint
    return f"{fingerprint}@v{version}"


RULES_KEY_TAG = "batch_assets/rules_key"
"""Tag of every config-change run the sensor starts: the rules key (fingerprint, or fingerprint@vN)."""


def _swept(database: DatabaseResource, run_id: str) -> bool:
    """Whether the run recorded a SUCCESS summary (a SKIPPED sweep also ends Dagster-SUCCESS)."""
    summary = run_history.latest(database.get_engine(), run_id)
    return summary is not None and summary.get("status") == "SUCCESS"


RULES_DEBOUNCE_S = 60.0
"""Rules changed again within this long are swept once, for the latest rules (CONTRACT §8)."""
RULES_RETRY_BASE_S = 60.0
"""After a config-change attempt that did not succeed, the next waits this long, doubling per failed attempt ..."""
RULES_RETRY_MAX_S = 3600.0
"""... up to this long."""


@dataclass
class RulesSensorState:
    """The rules sensor's cursor: the rules key swept last, and the keys already alerted on (one alert per key)."""

    swept: str | None = None
    alerted: list[str] = dataclass_field(default_factory=list)

    @classmethod
    def parse(cls, cursor: str | None) -> "RulesSensorState":
        if not cursor:
            return cls()
        try:
            raw = json.loads(cursor)
        except ValueError:  # the cursor of an earlier version: the swept key itself
            return cls(swept=cursor)
        if not isinstance(raw, dict):
            return cls(swept=cursor)
        return cls(swept=raw.get("swept"), alerted=[str(k) for k in raw.get("alerted") or []])

    def dump(self) -> str:
        return json.dumps({"swept": self.swept, "alerted": self.alerted[-20:]}, sort_keys=True)


def _rules_age_s(database: DatabaseResource) -> float | None:
    with database.get_engine().connect() as conn:
        value = conn.execute(sql.RULES_AGE_S).scalar()
    return None if value is None else float(value)


def retry_delay_s(failed_attempts: int) -> float:
    """The wait before the next attempt after `failed_attempts` that did not succeed: 60 s, 120 s, 240 s, ... 1 h."""
    return min(RULES_RETRY_BASE_S * 2 ** max(failed_attempts - 1, 0), RULES_RETRY_MAX_S)


def _alert_rules_attempt(context: dg.SensorEvaluationContext, alerts: AlertsResource, key: str, run: Any,
                         attempts: int) -> None:
    text = (f"batch_assets: the config-change sweep for rules {key} did not succeed (run {run.run_id} ended "
            f"{run.status.value}); rules_changed_sensor retries it with a growing delay until one succeeds")
    context.log.error(text)
    alerts.send(text, {"kind": "rules_sweep_not_done", "rules_key": key, "run_id": run.run_id,
                       "status": run.status.value, "attempts": attempts})


def rules_changed(context: dg.SensorEvaluationContext, database: DatabaseResource,
                  alerts: AlertsResource) -> dg.SensorResult:
    """One successful config-change sweep per rules change: re-request until a run for the key succeeds.

    The cursor (RulesSensorState) moves to a rules key only once a run tagged with it ended SUCCESS *and*
    recorded a SUCCESS summary. Rules set less than RULES_DEBOUNCE_S ago wait (edits within a minute are
    swept once, for the latest rules). A run that ended SKIPPED (a CLI run held the lock) or FAILED is
    followed by a new request (run key `<key>#<attempt>`, since Dagster never reuses a run key) once
    `retry_delay_s` passed since it ended; the first such run of a key raises one alert.
    """
    state = RulesSensorState.parse(context.cursor)
    version, fingerprint, first_version = current_fingerprint(database)
    key = rules_run_key(version, fingerprint, first_version)
    if state.swept == key:
        return dg.SensorResult(skip_reason=dg.SkipReason(f"rules unchanged (v{version}, {fingerprint})"))
    if state.swept is None and version == 0:
        # Never changed since install: the default rules need no config-change sweep; remember them.
        state.swept = key
        return dg.SensorResult(skip_reason=dg.SkipReason(f"default rules ({fingerprint}); nothing changed"),
                               cursor=state.dump())
    age = _rules_age_s(database)
    if age is not None and age < RULES_DEBOUNCE_S:
        return dg.SensorResult(skip_reason=dg.SkipReason(
            f"rules v{version} set {age:.0f}s ago; swept once they are {RULES_DEBOUNCE_S:.0f}s old"))
    records = context.instance.get_run_records(filters=dg.RunsFilter(tags={RULES_KEY_TAG: key}))
    runs = [record.dagster_run for record in records]
    running = [run for run in runs if run.status in IN_PROGRESS]
    if running:
        return dg.SensorResult(
            skip_reason=dg.SkipReason(f"config-change sweep {running[0].run_id} for {key} is {running[0].status.value}")
        )
    done = [run for run in runs if run.status == dg.DagsterRunStatus.SUCCESS and _swept(database, run.run_id)]
    if done:
        state.swept = key
        state.alerted = [k for k in state.alerted if k != key]
        return dg.SensorResult(
            skip_reason=dg.SkipReason(f"rules {key} swept by run {done[0].run_id}"), cursor=state.dump()
        )
    if records:
        latest = records[0]  # newest first
        if key not in state.alerted:
            _alert_rules_attempt(context, alerts, key, latest.dagster_run, len(records))
            state.alerted.append(key)
        ended = latest.end_time or (latest.update_timestamp.timestamp() if latest.update_timestamp else 0.0)
        wait_s = ended + retry_delay_s(len(records)) - time.time()
        if wait_s > 0:
            return dg.SensorResult(skip_reason=dg.SkipReason(
                f"attempt {len(records) + 1} for rules {key} in {wait_s:.0f}s (after {len(records)} that did not "
                "succeed)"), cursor=state.dump())
    attempt = len(runs) + 1
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=key if attempt == 1 else f"{key}#{attempt}",
                run_config=sweep_run_config(SweepConfig(mode="config-change")),
                tags={
                    "batch_assets/mode": "config-change",
                    RULES_KEY_TAG: key,
                    "batch_assets/rules_fingerprint": fingerprint,
                    "batch_assets/rules_version": str(version),
                    "batch_assets/attempt": str(attempt),
                },
            )
        ],
        cursor=state.dump(),
    )


def build_sensors(status: dg.DefaultSensorStatus) -> list[dg.SensorDefinition]:
    return [
        dg.sensor(
            name="rules_changed_sensor",
            job=customer_status_asset_job,
            minimum_interval_seconds=30,
            default_status=status,
            description="Starts the config-change sweep of a rules change (run key = its fingerprint) once the rules "
            f"are {RULES_DEBOUNCE_S:.0f}s old, and requests it again, with a doubling delay from "
            f"{RULES_RETRY_BASE_S:.0f}s, until one run for that fingerprint succeeds; alerts once per fingerprint.",
        )(rules_changed),
    ]


SPEC = JobSpec(
    job=customer_status_sweep_job,
    config=SweepConfig,
    config_op="plan_sweep",
    variants={"celery": customer_status_sweep_celery_job},
    asset_jobs=[customer_status_asset_job],
    assets=[customers, customer_status_sweep],
    asset_checks=[no_overdue_active_customers, review_triggers_unique],
    schedules=build_schedules,
    sensors=build_sensors,
    release_after_failure=release_after_failure,
    mapped_op="sweep_range",
    merge_records=merge_range_records,
    resources=encryption_resources,
)
