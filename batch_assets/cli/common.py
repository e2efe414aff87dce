"""What the command groups share: the engine, the key, config and the job launch (which checks the connection
budget, orchestration/budget.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from batch_assets.cli.output import EXIT_BY_STATUS, SUMMARY_KEYS, emit, err
from batch_assets.errors import (
    EXIT_FAILED,
)
from batch_assets.settings import Settings
from batch_assets.settings_model import check_run_date

if TYPE_CHECKING:
    from batch_assets.orchestration.config import JobConfig
    from batch_assets.orchestration.spec import JobSpec

C = TypeVar("C", bound="JobConfig")


def build_config(cls: type[C], settings: Settings, /, **values: Any) -> tuple[C, Any]:
    """The job's run config from the command's options (None = not given), validated once: the config
    object and its settings (`to_settings()`, and a run date within the environment's window of today,
    `settings`); a bad value is a ConfigError naming the field (exit 2)."""
    config = cls.from_values(values)
    plan = config.to_settings()
    check_run_date(plan, window_days=settings.run_date_window_days, timezone=settings.timezone)
    return config, plan


def run_job(spec: JobSpec, config: Any, settings: Settings, extra: dict[str, Any] | None = None) -> int:
    """Launch the job (its spec resolved once by the command) as a Dagster run, print its summary, return the exit
    code."""
    from batch_assets.cli.startup import resume_collector
    from batch_assets.orchestration.instance_home import (
        no_template_highlighting,
        preload_instance_storage,
        quick_commits,
        reuse_alembic_scripts,
    )

    no_template_highlighting()
    from batch_assets.orchestration.launch import launch_job
    from batch_assets.shutdown import install_signal_handlers

    preload_instance_storage()
    reuse_alembic_scripts()
    resume_collector()  # the job's and the instance's modules are imported: collection on for the run (cli/startup.py)
    install_signal_handlers()
    job_name = spec.name
    with quick_commits():
        result = launch_job(spec, config, settings=settings)
    summary = dict(result.summary or {})
    summary.setdefault("status", "FAILURE")
    summary["run_id"] = result.run_id
    for key in SUMMARY_KEYS:
        summary.setdefault(key, {} if key == "failed_by_type" else 0)
    for key, value in (extra or {}).items():
        summary.setdefault(key, value)
    if summary["status"] == "SKIPPED":
        err(f"{job_name}: skipped, another run holds the lock")
    elif summary["status"] != "SUCCESS":
        err(f"{job_name}: run {result.run_id} ended {summary['status']}"
            + (f": {summary['error']}" if summary.get("error") else ""))
    emit(summary)
    return EXIT_BY_STATUS.get(summary["status"], EXIT_FAILED)



def job_spec(name: str) -> JobSpec:
    """The spec of a job of the code location in use, resolved once at the command's entrance."""
    from batch_assets.orchestration.project import current

    return current().spec_for(name)


def engine_of(declaration: Any, settings: Settings) -> Any:
    """This process's engine on a declaration's database (its `database_url`, else the location's), after checking
    it answers (one line if not)."""
    from batch_assets.db.engine import check_connection, connected_engine, get_engine, normalize_url

    url = declaration.database_url.resolve() if getattr(declaration, "database_url", None) is not None else None
    if url is None:
        return connected_engine(settings)
    engine = get_engine(normalize_url(url))
    check_connection(engine)
    return engine
