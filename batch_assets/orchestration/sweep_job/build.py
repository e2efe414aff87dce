"""`build_sweep_job`: the one builder of a ranged sweep's Dagster definitions, as a `JobSpec`.

Jobs: the op job the CLI launches, one per executor variant, and the asset job (the same graph as a graph-backed
asset: what schedules, sensors and "Materialize" start). Checks: by default rows still overdue after the last
delta and failures by kind of the last run.
"""

# No `from __future__ import annotations`: Dagster reads the check and schedule annotations at runtime.

from collections.abc import Callable
from datetime import date
from typing import Any

import dagster as dg
import sqlalchemy as sa

from batch_assets.db.privileges import SWEEP_BOOKKEEPING
from batch_assets.errors import ConfigError
from batch_assets.orchestration.automation import schedule_timezone, tick_date
from batch_assets.orchestration.config import config_class
from batch_assets.orchestration.executors import ranges_executor
from batch_assets.orchestration.metadata import records_table
from batch_assets.orchestration.resources import DatabaseResource
from batch_assets.orchestration.spec import JobSpec
from batch_assets.orchestration.sweep_job.definition import (
    SWEEP_TAGS,
    PrepareContext,
    SweepJob,
    SweepNames,
    ranges_of,
    settings_class,
)
from batch_assets.orchestration.sweep_job.ops import plan_op, range_op, report_op, summarise_op
from batch_assets.orchestration.sweep_job.summaries import merge_range_records, release_job_lock


def build_sweep_job(job: SweepJob) -> JobSpec:
    """The sweep's ops, graph, op job (and variants), graph-backed asset, asset job, checks and schedules."""
    names = job.names or SweepNames.of(job.name)
    camel = "".join(part.title() for part in job.name.split("_"))
    config = config_class(settings_class(job), job.config_name or f"{camel}Config", f"{job.name}: {job.description}")
    asset_key = job.asset_key or dg.AssetKey(names.asset)
    plan, sweep_range = plan_op(job, names, config), range_op(job, names)
    summarise, report = summarise_op(job, names), report_op(job, names, asset_key)
    outputs = [names.asset, *(extra.key for extra in job.extra_assets)]

    @dg.graph(name=f"{names.graph}_graph", description=job.description)
    def op_graph() -> None:
        ranges = plan().map(sweep_range).collect()
        report(summarise(ranges), ranges)

    @dg.graph(name=names.graph, ins={"source": dg.GraphIn()}, out={key: dg.GraphOut() for key in outputs},
              description=job.description)
    def asset_graph(source: Any) -> Any:  # a graph body: Dagster wires the nodes
        ranges = plan().map(sweep_range).collect()
        return report(summarise(ranges), ranges, source=source)

    keys = {names.asset: asset_key, **{extra.key: dg.AssetKey(extra.key) for extra in job.extra_assets}}
    asset = dg.AssetsDefinition.from_graph(
        asset_graph, keys_by_input_name={"source": job.source}, keys_by_output_name=keys,
        # What the sweep writes: its asset from the table it reads, the extra assets from its asset.
        internal_asset_deps={names.asset: {job.source}, **{e.key: {asset_key} for e in job.extra_assets}}
        if job.extra_assets else None,
        group_name=job.group,
        descriptions_by_output_name={names.asset: job.description,
                                     **{e.key: e.description for e in job.extra_assets}},
        tags_by_output_name={key: {"dagster/kind/postgres": ""} for key in outputs}, can_subset=False,
    )
    described = f"{job.description} (the job the CLI launches; {names.asset_job} is the same sweep as an asset)."
    op_job = op_graph.to_job(name=names.job, description=described, tags=SWEEP_TAGS,
                             # A delta (one range) runs in the run worker's own process; several ranges get a
                             # process per step.
                             executor_def=ranges_executor(names.plan_op, ranges_of))
    variants = {executor: op_graph.to_job(name=names.variant(executor), executor_def=definition, tags=SWEEP_TAGS,
                                          description=f"{described} Its cursor ranges run on the {executor} "
                                          "executor.")
                for executor, definition in job.variants.items()}
    asset_job = dg.define_asset_job(
        names.asset_job, selection=dg.AssetSelection.assets(*keys.values()), tags=SWEEP_TAGS,
        description=f"Materialize {names.asset} (plan → cursor ranges → summary) and run its checks. Config: "
        f"ops.{names.graph}.ops.{names.plan_op}.config.",
        executor_def=ranges_executor(f"{names.graph}.{names.plan_op}", ranges_of),
    )
    source = job.source_asset if job.source_asset is not None else dg.AssetSpec(
        job.source, description=f"The table {job.name} sweeps (written by other services).", group_name=job.group)
    assets = [asset, source] if job.declare_source else [asset]
    checks = list(job.checks(asset_key)) if job.checks is not None else default_checks(job, names, asset_key)
    return JobSpec(
        job=op_job, config=config, config_op=names.plan_op, variants=variants, asset_jobs=[asset_job],
        assets=assets, asset_checks=checks,
        schedules=schedule_builder(job, names, asset_job) if job.schedules else None,
        release_after_failure=release_job_lock(names.lock), mapped_op=names.range_op,
        merge_records=merge_range_records, resources=job.resources, database_url=job.database_url,
        privileges=SWEEP_BOOKKEEPING,
    )


def default_checks(job: SweepJob, names: SweepNames, asset_key: dg.AssetKey) -> list[dg.AssetChecksDefinition]:
    name = job.name

    key = job.keys.database

    @dg.asset_check(asset=asset_key, name=f"{name}_rows_overdue", required_resource_keys={key},
                    description="After the last successful delta, no row is still due on or before its run date "
                    "(rows the run could not compute are allowed, up to its failed count).")
    def rows_overdue(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        database = getattr(context.resources, key)
        last = last_run(database, names, "delta")
        if last is None:
            return dg.AssetCheckResult(passed=True, metadata={"last_delta_run_date": "none yet"})
        engine = database.get_engine()
        try:
            prepared = job.prepare(PrepareContext(engine=engine, resources=None))
        except ConfigError as exc:
            return dg.AssetCheckResult(passed=False, metadata={"error": str(exc)})
        if prepared.overdue is None:
            return dg.AssetCheckResult(passed=True, metadata={"due": "none (full only)"})
        with engine.connect() as conn:
            overdue = prepared.overdue(conn, date.fromisoformat(str(last["run_date"])))
        failed = int(last.get("failed") or 0)
        return dg.AssetCheckResult(passed=overdue <= failed, metadata={
            "last_delta_run_date": str(last["run_date"]), "overdue": overdue, "failed_in_run": failed})

    @dg.asset_check(asset=asset_key, name=f"{name}_failures_by_kind", required_resource_keys={key},
                    description="The last run's failures by kind; fails when any was systemic (compute_error, "
                    "write_error): the team's function or the table needs a look.")
    def failures_by_kind(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        last = last_run(getattr(context.resources, key), names, None)
        if last is None:
            return dg.AssetCheckResult(passed=True, metadata={"last_run": "none yet"})
        kinds = {k: int(v) for k, v in (last.get("failed_by_type") or {}).items() if int(v)}
        systemic = sum(v for k, v in kinds.items() if k in ("compute_error", "write_error"))
        return dg.AssetCheckResult(passed=systemic == 0, metadata={
            "failed_by_type": records_table([{"kind": k, "rows": v} for k, v in sorted(kinds.items())],
                                            ("kind", "rows")),
            "systemic": systemic})

    return [rows_overdue, failures_by_kind]


LAST_RUN_SQL = sa.text("""
SELECT summary FROM ba_run_history
 WHERE job IN (:job, :asset_job) AND status = 'SUCCESS' AND NOT (summary ? 'range')
   AND (CAST(:mode AS text) IS NULL OR mode = :mode)
 ORDER BY finished_at DESC LIMIT 1
""")


def last_run(database: DatabaseResource, names: SweepNames, mode: str | None) -> dict[str, Any] | None:
    """The summary of the sweep's last successful run (of `mode`, when given), or None."""
    with database.get_engine().connect() as conn:
        summary = conn.execute(LAST_RUN_SQL, {"job": names.job, "asset_job": names.asset_job, "mode": mode}).scalar()
    return dict(summary) if summary else None


def asset_job_run_config(names: SweepNames, values: dict[str, Any]) -> dict[str, Any]:
    """The asset job's run config for one sweep: the plan op's config, nested under the graph asset's node."""
    return {"ops": {names.graph: {"ops": {names.plan_op: {"config": values}}}}}


def schedule_builder(job: SweepJob, names: SweepNames, asset_job: Any) -> Any:
    def build(timezone: str, status: dg.DefaultScheduleStatus) -> list[dg.ScheduleDefinition]:
        tz = schedule_timezone(job.timezone or timezone)
        return [
            dg.ScheduleDefinition(
                name=schedule.name or f"{job.name}_{schedule.mode}_schedule", cron_schedule=schedule.cron,
                job=asset_job, execution_fn=_tick(names, schedule.mode, tz), execution_timezone=tz,
                default_status=job.schedule_status or status,
                description=schedule.description or f"{schedule.mode} sweep of {job.name} ({schedule.cron}, {tz}).",
            )
            for schedule in job.schedules
        ]

    return build


def _tick(names: SweepNames, mode: str, timezone: str) -> Callable[[dg.ScheduleEvaluationContext], dg.RunRequest]:
    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        run_date = tick_date(context, timezone)
        values = {"mode": mode, **({"run_date": run_date} if run_date else {})}
        return dg.RunRequest(
            run_key=f"{mode}:{run_date or 'now'}",
            run_config=asset_job_run_config(names, values),
            tags={"batch_assets/mode": mode, "batch_assets/run_date": run_date},
        )

    return evaluate
