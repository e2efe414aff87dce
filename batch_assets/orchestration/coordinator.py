"""The run coordinator of batch_assets' instance: Dagster's queue, plus each job's tags on the asset runs the UI starts.

"Materialize" in the Dagster UI (dagster 1.13) runs the implicit `__ASSET_JOB` with run config `{}` and the tags
of that job, which has none: a sweep started there would carry no `batch_assets/kind: sweep` tag, so the queue's
one-sweep-at-a-time limit (`concurrency: runs: tag_concurrency_limits` in dagster.yaml) would not count it
("Materialize" runs the sweep under the same limits, docs/production/operations.md). This coordinator gives a run
of an asset job other than the job's own (the implicit one, or an anonymous selection) the tags of the job whose
assets it materializes, before the run is queued, so the queue limits it like the job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg

from batch_assets.errors import BatchAssetsError, ConfigError
from batch_assets.orchestration.budget import check_run_budget, parallel_steps


def tags_for_run(job_name: str, asset_selection: Iterable[dg.AssetKey] | None) -> dict[str, str]:
    """The tags a run of `job_name` materializing `asset_selection` (None: every asset of the job) is owed.

    A run of one of a spec's own jobs has that job's tags already; a run of another asset job that
    materializes a spec's assets gets the spec's job tags (e.g. `batch_assets/kind: sweep`).
    """
    from batch_assets.orchestration.project import current  # when a run is submitted, not when the instance loads

    selected = None if asset_selection is None else set(asset_selection)
    owed: dict[str, str] = {}
    for spec in current().all_specs():
        if job_name in spec.job_names:
            return {}
        keys = {key for asset in spec.assets if isinstance(asset, dg.AssetsDefinition) and asset.is_materializable
                for key in asset.keys}
        if keys and (selected is None or keys & selected):
            owed.update(spec.job.tags)
    return owed


def budget_refusal(job_name: str, run_config: Mapping[str, Any] | None) -> str | None:
    """Why a run of one of the product's op jobs (a UI launch, a schedule, a sensor) would exceed the connection
    budget (orchestration/budget.py), or None. A config the plan op would refuse is left to it (its one line);
    a database that does not answer here is left to the run."""
    from batch_assets.db.engine import one_off_engine
    from batch_assets.orchestration.project import current
    from batch_assets.settings import load_settings

    spec = next((s for s in current().all_specs() if job_name in {j.name for j in s.op_jobs}), None)
    if spec is None:
        return None
    values = (((run_config or {}).get("ops") or {}).get(spec.config_op) or {}).get("config") or {}
    try:
        plan = spec.config.from_values(values).to_settings()
    except BatchAssetsError:
        return None
    try:
        with one_off_engine(load_settings()) as engine:
            check_run_budget(engine, plan, parallel=parallel_steps(run_config))
    except ConfigError as exc:
        return str(exc)
    except BatchAssetsError:
        return None
    return None


class BatchAssetsRunCoordinator(dg.QueuedRunCoordinator):
    """Dagster's QueuedRunCoordinator (limits from the `concurrency:` section); a run is queued with the tags
    of the job whose assets it materializes (`tags_for_run`); a run over the connection budget is failed at once
    with the reason (`budget_refusal`) instead of being queued."""

    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        run = context.dagster_run
        refusal = budget_refusal(run.job_name, run.run_config)
        if refusal is not None:  # it would exhaust the server: failed now, with the line (the failure alert quotes it)
            self._instance.report_run_failed(run, f"refused before it started: {refusal}")
            from batch_assets.orchestration.watchdog import free_pool_slots

            free_pool_slots(self._instance, run.run_id)  # a refused run holds nothing, nor waits for a slot
            return self._instance.get_run_by_id(run.run_id) or run
        owed = tags_for_run(run.job_name, run.asset_selection)
        missing: Mapping[str, str] = {key: value for key, value in owed.items() if key not in run.tags}
        if missing:
            self._instance.add_run_tags(run.run_id, missing)
            tagged = self._instance.get_run_by_id(run.run_id)
            if tagged is not None:
                context = dg.SubmitRunContext(tagged, context.workspace)
        return super().submit_run(context)
