"""One view (docs/production/operations.md): a run the CLI launches carries its job's code-location origin, as a
UI-launched run does."""

from __future__ import annotations

import dagster as dg
import pytest

from batch_assets.orchestration.instance_home import repo_root
from batch_assets.orchestration.launch import launch_job
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

JOB = "payment_queue_drain_job"


def _workspace_origin(instance: dg.DagsterInstance) -> object:
    """The job's remote origin as `dagster dev -w workspace.yaml` loads it (its code server started here)."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    target = WorkspaceFileTarget(paths=[str(repo_root() / "workspace.yaml")])
    with WorkspaceProcessContext(instance, target) as process:
        [location] = process.create_request_context().code_locations
        [repository] = location.get_repositories().values()
        return repository.get_full_job(JOB).get_remote_origin()


def test_a_cli_run_carries_the_workspace_origin_and_the_job_view_finds_it(dagster_env: Settings) -> None:
    """The CLI's run has the origin dagster dev gives the job; the job page's query (job name + repository) finds it."""
    launched = launch_job(JOB, {"max_seconds": 2}, settings=dagster_env)
    assert launched.dagster_status == "SUCCESS"
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(launched.run_id)
        assert run is not None and run.remote_job_origin is not None
        assert run.remote_job_origin == _workspace_origin(instance)
        origin = run.remote_job_origin.repository_origin
        assert (origin.code_location_origin.location_name, origin.repository_name) == ("batch_assets", "__repository__")
        # What the job's Runs tab asks for (dagster_graphql GraphenePipeline.resolve_runs).
        label = origin.get_label()
        found = instance.get_runs(filters=dg.RunsFilter(job_name=JOB, tags={".dagster/repository": label}))
        assert [r.run_id for r in found] == [launched.run_id]


def test_a_run_reexecuted_from_failure_keeps_its_jobs_origin(dagster_env: Settings, engine) -> None:
    """A failed CLI run re-executed from failure (`reexecute_from_failure`): the new run carries the workspace origin
    too, so the job's Runs tab lists parent and child, and it is the parent's child (root_run_id)."""
    from batch_assets.orchestration.launch import reexecute_from_failure

    job = "subscription_expiry_job"
    with engine.begin() as conn:  # every batch fails with a connection-class error: the run ends FAILURE
        conn.exec_driver_sql("INSERT INTO subscriptions (id, expiry_date, status) VALUES (31, '2025-05-01', 'ACTIVE')")
        conn.exec_driver_sql(
            "CREATE FUNCTION test_conn() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'provoked' USING ERRCODE = '08006'; END; $$")
        conn.exec_driver_sql(
            "CREATE TRIGGER test_conn BEFORE UPDATE ON subscriptions FOR EACH STATEMENT EXECUTE FUNCTION test_conn()")
    failed = launch_job(job, {"run_date": "2025-06-01"}, settings=dagster_env)
    assert failed.dagster_status == "FAILURE", failed.summary
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER test_conn ON subscriptions")
    resumed = reexecute_from_failure(failed.run_id, settings=dagster_env)
    assert resumed.dagster_status == "SUCCESS", resumed.summary
    with dg.DagsterInstance.get() as instance:
        parent, child = instance.get_run_by_id(failed.run_id), instance.get_run_by_id(resumed.run_id)
        assert child is not None and parent is not None
        assert (child.root_run_id, child.parent_run_id) == (failed.run_id, failed.run_id)
        assert child.remote_job_origin is not None and child.remote_job_origin == parent.remote_job_origin
        label = child.remote_job_origin.repository_origin.get_label()
        found = instance.get_runs(filters=dg.RunsFilter(job_name=job, tags={".dagster/repository": label}))
        assert {r.run_id for r in found} == {failed.run_id, resumed.run_id}
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT status FROM subscriptions WHERE id = 31").scalar_one() == "EXPIRED"
