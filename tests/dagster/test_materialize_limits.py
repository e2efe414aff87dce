"""Materialize in the UI (the implicit __ASSET_JOB) runs the sweep under the sweep job's tags and queue limit."""

from __future__ import annotations

import dagster as dg
import pytest

from batch_assets.definitions import PROJECT
from batch_assets.definitions import defs as load_defs
from batch_assets.orchestration.code_location import job_origin
from batch_assets.orchestration.coordinator import BatchAssetsRunCoordinator
from batch_assets.reference.customer_status.dagster import SWEEP_ASSET_KEYS, SWEEP_TAGS

pytestmark = pytest.mark.dagster

SWEEP_LIMIT = {"key": "batch_assets/kind", "value": "sweep", "limit": 1}


def test_the_instance_queues_with_the_batch_assets_coordinator_and_the_sweep_limit(
    project_instance: dg.DagsterInstance,
) -> None:
    """dagster.yaml names the coordinator, and the one-sweep limit of the concurrency section still applies."""
    with project_instance as instance:
        assert isinstance(instance.run_coordinator, BatchAssetsRunCoordinator)
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
        assert SWEEP_LIMIT in limits


def test_a_materialize_run_of_the_implicit_asset_job_is_queued_with_the_sweep_tag(
    project_instance: dg.DagsterInstance,
) -> None:
    """__ASSET_JOB with run config {} (what the UI's Materialize launches) is queued tagged batch_assets/kind: sweep."""
    implicit = load_defs().resolve_implicit_global_asset_job_def()
    with project_instance as instance:
        run = instance.create_run_for_job(
            job_def=implicit, run_config={}, asset_selection=frozenset(SWEEP_ASSET_KEYS),
            remote_job_origin=job_origin(PROJECT, implicit.name),
        )
        assert "batch_assets/kind" not in run.tags
        instance.run_coordinator.submit_run(dg.SubmitRunContext(run, workspace=None))  # type: ignore[arg-type]
        queued = instance.get_run_by_id(run.run_id)
        assert queued is not None and queued.status == dg.DagsterRunStatus.QUEUED
        assert {k: queued.tags[k] for k in SWEEP_TAGS} == SWEEP_TAGS
        limited = [limit for limit in instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
                   if queued.tags.get(limit["key"]) == limit.get("value")]
        assert limited == [SWEEP_LIMIT]


def test_runs_of_other_assets_or_of_the_jobs_themselves_get_no_extra_tag(
    project_instance: dg.DagsterInstance,
) -> None:
    """Observing business tables through __ASSET_JOB, or a run of the payment job, is queued with its own tags."""
    defs = load_defs()
    with project_instance as instance:
        implicit = defs.resolve_implicit_global_asset_job_def()
        observe = instance.create_run_for_job(
            job_def=implicit, asset_selection=frozenset({dg.AssetKey("customers")}),
            remote_job_origin=job_origin(PROJECT, implicit.name),
        )
        drain = instance.create_run_for_job(job_def=defs.resolve_job_def("payment_queue_drain_job"),
                                            remote_job_origin=job_origin(PROJECT, "payment_queue_drain_job"))
        for run in (observe, drain):
            instance.run_coordinator.submit_run(dg.SubmitRunContext(run, workspace=None))  # type: ignore[arg-type]
            stored = instance.get_run_by_id(run.run_id)
            assert stored is not None and stored.tags.get("batch_assets/kind") != "sweep"


@pytest.mark.integration
def test_a_run_over_the_connection_budget_is_failed_at_submit_with_the_reason(
    project_instance: dg.DagsterInstance,
) -> None:
    """A UI or schedule launch of 3 ranges at once with 32 workers each (108 connections and more than the server
    has free) is not queued: it is FAILURE at once with the one line of the budget; the same run in one process is
    queued."""
    job = load_defs().resolve_job_def("customer_status_sweep_job")
    plan = {"mode": "full", "run_date": "2025-06-01", "ranges": 3, "workers": 32}
    with project_instance as instance:
        over = instance.create_run_for_job(
            job_def=job, remote_job_origin=job_origin(PROJECT, job.name),
            run_config={"ops": {"plan_sweep": {"config": plan}},
                        "execution": {"config": {"multiprocess": {"max_concurrent": 3}}}},
        )
        instance.run_coordinator.submit_run(dg.SubmitRunContext(over, workspace=None))  # type: ignore[arg-type]
        refused = instance.get_run_by_id(over.run_id)
        assert refused is not None and refused.status == dg.DagsterRunStatus.FAILURE
        [failure] = instance.get_records_for_run(over.run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
        message = failure.event_log_entry.dagster_event.message or ""
        assert "refused before it started: workers: a run needs 108 connections" in message, message

        fits = instance.create_run_for_job(
            job_def=job, remote_job_origin=job_origin(PROJECT, job.name),
            run_config={"ops": {"plan_sweep": {"config": plan}}, "execution": {"config": {"in_process": {}}}},
        )
        instance.run_coordinator.submit_run(dg.SubmitRunContext(fits, workspace=None))  # type: ignore[arg-type]
        queued = instance.get_run_by_id(fits.run_id)
        assert queued is not None and queued.status == dg.DagsterRunStatus.QUEUED
