"""A second trigger of a lock group is refused at submission, not queued to run afterwards.

The run coordinator of this repository's instance (dagster.yaml) refuses a run of a job whose lock group (the
sweep's modes, its op and asset jobs, a Materialize of its assets) already has a run queued, starting or started:
the run is reported CANCELED with the reason, so nothing waits behind the one in progress. A CLI run is refused by
the job lock itself (exit 75)."""

from __future__ import annotations

import dagster as dg
import pytest

from batch_assets.definitions import PROJECT
from batch_assets.definitions import defs as load_defs
from batch_assets.orchestration.code_location import job_origin
from batch_assets.orchestration.spec import LOCK_TAG
from batch_assets.reference.customer_status.dagster import SWEEP_ASSET_KEYS

pytestmark = pytest.mark.dagster

LOCK = "customer_status_sweep"


def submit(instance: dg.DagsterInstance, job_name: str, **kwargs: object) -> dg.DagsterRun:
    defs = load_defs()
    job = defs.resolve_implicit_global_asset_job_def() if job_name == "__ASSET_JOB" else defs.resolve_job_def(job_name)
    run = instance.create_run_for_job(job_def=job, remote_job_origin=job_origin(PROJECT, job.name), **kwargs)
    instance.run_coordinator.submit_run(dg.SubmitRunContext(run, workspace=None))  # type: ignore[arg-type]
    stored = instance.get_run_by_id(run.run_id)
    assert stored is not None
    return stored


def reason(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    return " ".join(str(e.message or "") for e in instance.all_logs(run.run_id))


def test_a_second_run_of_the_sweep_is_refused_while_one_is_queued(project_instance: dg.DagsterInstance) -> None:
    """The asset job queued (a schedule tick): the op job, the asset job again and a Materialize of its assets are
    each CANCELED at once with the reason; another lock group's run and, once the first run ended, the next trigger
    are queued."""
    assert PROJECT.spec_for("customer_status_sweep_job").lock_key == LOCK
    with project_instance as instance:
        first = submit(instance, "customer_status_asset_job")
        assert first.status == dg.DagsterRunStatus.QUEUED and first.tags[LOCK_TAG] == LOCK

        for second in (submit(instance, "customer_status_sweep_job"), submit(instance, "customer_status_asset_job"),
                       submit(instance, "__ASSET_JOB", asset_selection=frozenset(SWEEP_ASSET_KEYS))):
            assert second.status == dg.DagsterRunStatus.CANCELED, second.job_name
            assert f"skipped: another run of {LOCK} is in progress" in reason(instance, second)

        other = submit(instance, "outbox_relay_job")
        assert other.status == dg.DagsterRunStatus.QUEUED, "another lock group is not held up"

        instance.report_run_canceled(first, "done")
        after = submit(instance, "customer_status_sweep_job")
        assert after.status == dg.DagsterRunStatus.QUEUED, "with no run in progress, a trigger is queued"


def test_a_run_in_progress_refuses_a_trigger_of_its_group(project_instance: dg.DagsterInstance) -> None:
    """A run that has started (a CLI run, or one the queue launched) refuses a schedule's tick of the same sweep."""
    with project_instance as instance:
        running = submit(instance, "customer_status_sweep_job")
        instance.handle_run_event(running.run_id, dg.DagsterEvent(
            event_type_value=dg.DagsterEventType.RUN_START.value, job_name=running.job_name, message="started"))
        assert instance.get_run_by_id(running.run_id).status == dg.DagsterRunStatus.STARTED  # type: ignore[union-attr]
        tick = submit(instance, "customer_status_asset_job")
        assert tick.status == dg.DagsterRunStatus.CANCELED
