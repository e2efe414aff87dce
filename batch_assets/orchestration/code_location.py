"""Where a CLI run executes and shows: the job reconstructed from the project's code location, and the run created
under that location's origin, so it shows under its job in the UI like a run launched there ("one view").

This repository's location reconstructs one job with only its own resources (`get_job`, start-up: not every job's
module); a team's project reconstructs the job from its own definitions module, with the resources its
declarations bring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from batch_assets.orchestration.project import Project, current

REPOSITORY_NAME = "__repository__"
"""The repository name Dagster gives a code location's `Definitions` (what `dg dev` shows)."""


def get_job(job_name: str) -> dg.JobDefinition:
    """One job of this repository's location with its resources bound as in the code location (the reconstructable
    target). Resources are built at call time, so they follow this process's environment; only that job's module is
    imported and only its spec's resources are built."""
    from batch_assets.orchestration.location import resources_of
    from batch_assets.settings import load_settings

    spec = current().spec_for(job_name)
    jobs = [job for job in spec.op_jobs if job.name == job_name]
    if not jobs:
        from batch_assets.errors import ConfigError

        raise ConfigError(f"unknown job {job_name!r}", field="job")
    return dg.Definitions(jobs=jobs, resources=resources_of((spec,), load_settings())).resolve_job_def(job_name)


def reconstructable_job(project: Project, job_name: str) -> Any:
    """The reconstructable job, its definition built from this process's environment now.

    Dagster caches `ReconstructableJob.get_definition()` and `get_repository_definition()` (`lru_cache`s keyed by
    module, function and args, not by the environment), so a second launch of the same job in one process would
    reuse the first one's resources: a variable bound by EnvVar then and unset since fails the run's config, and one
    set since is ignored. Both caches are cleared before each launch.
    """
    if project.is_team:
        from dagster._core.definitions.reconstruct import ReconstructableRepository

        repository = ReconstructableRepository.for_module(project.module, project.attribute,
                                                          working_directory=str(project.root))
        recon = repository.get_reconstructable_job(job_name)
    else:
        recon = dg.build_reconstructable_job(__name__, "get_job", reconstructable_args=(job_name,))
    type(recon).get_definition.cache_clear()
    type(recon).get_repository_definition.cache_clear()
    return recon


def job_origin(project: Project, job_name: str) -> Any:
    """The job's origin in the project's code location (its location and repository name): a run that carries it
    shows under its job in the UI (the job's Runs tab, the sparklines, the timeline), and the location's run-status
    sensors see it as one of theirs."""
    # Dagster has no public constructor of a job's remote origin outside a workspace process; these are the classes
    # `dagster job launch` builds it from.
    from dagster._core.remote_origin import (
        ManagedGrpcPythonEnvCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    target = LoadableTargetOrigin(module_name=project.module,
                                  working_directory=str(project.root) if project.root is not None else None)
    location = ManagedGrpcPythonEnvCodeLocationOrigin(loadable_target_origin=target, location_name=project.name)
    return RemoteJobOrigin(repository_origin=RemoteRepositoryOrigin(location, REPOSITORY_NAME), job_name=job_name)


def execute_in_code_location(project: Project, job_name: str, instance: dg.DagsterInstance, *,
                             run_config: Mapping[str, Any], tags: Mapping[str, str]) -> Any:
    """`dg.execute_job` on the reconstructable job, with the run created under the job's location origin: the same
    steps (create the run, execute it), with `remote_job_origin` and `job_code_origin` set as a run launched from the
    UI has them."""
    from dagster._core.execution.api import execute_run

    recon = reconstructable_job(project, job_name)
    job_def = recon.get_definition()
    run = instance.create_run_for_job(
        job_def=job_def,
        run_config=run_config,
        tags={**job_def.run_tags, **tags},
        remote_job_origin=job_origin(project, job_name),
        job_code_origin=recon.get_python_origin(),
    )
    return execute_run(recon, run, instance, raise_on_error=False)


def reexecute_in_code_location(project: Project, parent: Any, instance: dg.DagsterInstance, *,
                               run_config: Mapping[str, Any], tags: Mapping[str, str]) -> Any:
    """Re-execute `parent` from failure (its failed and not-run steps, the others' outputs reused), the new run
    created under the job's location origin like `execute_in_code_location`: without it the re-executed run is
    missing from its job's Runs tab, sparkline and timeline, though its parent is there."""
    from dagster._core.execution.api import create_execution_plan, execute_run
    from dagster._core.execution.plan.state import KnownExecutionState

    recon = reconstructable_job(project, parent.job_name)
    job_def = recon.get_definition()
    step_keys, known_state = KnownExecutionState.build_resume_retry_reexecution(instance=instance, parent_run=parent)
    plan = create_execution_plan(recon, run_config, step_keys_to_execute=step_keys, known_state=known_state,
                                 tags=parent.tags)
    run = instance.create_run_for_job(
        job_def=job_def,
        execution_plan=plan,
        run_config=run_config,
        tags={**job_def.run_tags, **tags},
        op_selection=parent.op_selection,
        resolved_op_selection=parent.resolved_op_selection,
        root_run_id=parent.root_run_id or parent.run_id,
        parent_run_id=parent.run_id,
        remote_job_origin=job_origin(project, parent.job_name),
        job_code_origin=recon.get_python_origin(),
    )
    return execute_run(recon, run, instance, raise_on_error=False)
