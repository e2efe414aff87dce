"""The one builder of a queue's Dagster job: one op that runs the queue worker, as a drain or resident.

`build_queue_job(QueueJob(declaration))` gives the job `<name>_queue_job` whose op runs the worker on the declared
table (`queue work --queue NAME` launches it). The reference project's payments queue is built here too, with its
own names, its handler resource and its payment_status report. The run config is `QueueWorkConfig`:
concurrency, max_seconds, batch_size, drain, db_outage_s (unset = the declaration's value).
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

from batch_assets.db.privileges import QUEUE_BOOKKEEPING, queue_table
from batch_assets.errors import ConfigError
from batch_assets.orchestration.budget import APP_DATABASE_POOL
from batch_assets.orchestration.config import config_class
from batch_assets.orchestration.ops import (
    config_failure,
    config_of,
    config_schema_of,
    finish,
    run_in_thread,
    stop_on_interrupt,
    utcnow,
)
from batch_assets.orchestration.progress import OpProgress
from batch_assets.orchestration.spec import JobSpec
from batch_assets.queue.declaration import QueueDeclaration
from batch_assets.queue.handler import Handler
from batch_assets.queue.result import QueueResult
from batch_assets.queue.settings import QueueRunSettings, QueueSettings
from batch_assets.queue.worker import run_worker
from batch_assets.shutdown import STOP

QueueWorkConfig = config_class(
    QueueRunSettings, "QueueWorkConfig",
    "A queue worker: a drain, or the resident worker. Unset = the queue's declared value.",
)


def job_name(queue: str) -> str:
    """The job of a declared queue."""
    return f"{queue}_queue_job"


@dataclass(frozen=True)
class QueueJob:
    """One queue's particulars; `build_queue_job` makes its op and job. Only the declaration is required."""

    declaration: QueueDeclaration
    job: str | None = None
    """The job's name; default `<name>_queue_job`."""
    op: str | None = None
    """The op's name; default `work_<name>_queue`."""
    config: type[Any] = QueueWorkConfig
    description: str | None = None
    database_key: str = "database"
    resource_keys: tuple[str, ...] = ()
    """The job's own resources (their definitions come from `resources`)."""
    handler: Callable[[Any, QueueSettings], Handler] | None = None
    """(the op's resources, the run's settings) → the handler; default the declaration's `handler`."""
    report: Callable[[dg.OpExecutionContext, Any, dict[str, Any], QueueResult, Any], None] | None = None
    """After a run: (context, engine, summary, result, run settings) → log what the queue's assets say."""
    progress_asset: str | None = None
    resources: Callable[[Any], Mapping[str, Any]] | None = None
    database_url: Callable[[], str] | None = None
    source: str = ""
    """Where the declaration comes from (its file), named by a refusal of its table."""


def build_queue_job(job: QueueJob) -> JobSpec:
    """The op and job of one queue."""
    declaration = job.declaration
    name = declaration.name
    op_name = job.op or f"work_{name}_queue"
    config = job.config

    @dg.op(name=op_name, tags={"kind": "queue"}, pool=APP_DATABASE_POOL, config_schema=config_schema_of(config),
           required_resource_keys={job.database_key, *job.resource_keys},
           description="Process due rows: until nothing is due (drain), or resident until stopped or max_seconds.")
    def work(context: dg.OpExecutionContext) -> dict:
        started_at = utcnow()
        resources = context.resources
        # The worker runs on connections of its own; the pool serves the bookkeeping around it.
        engine = getattr(resources, job.database_key).get_engine(min_pool_size=4)
        try:  # a bad field, a table lacking a column, a handler that cannot be imported: failed before any claim
            run = config_of(config, context).to_settings()
            settings = run.worker_settings(declaration.settings)
            store = declaration.checked_store(engine, source=job.source)
            handler = job.handler(resources, settings) if job.handler is not None \
                else declaration.make_handler(settings)
        except ConfigError as exc:
            raise config_failure(exc) from None
        progress = OpProgress(context, label=f"{name} queue", asset_key=job.progress_asset)
        with stop_on_interrupt(), progress:
            # The worker runs in a thread of its own: a run termination lands in this op's wait, sets STOP, and the
            # worker gives back its claims and writes its results before the interruption goes on.
            result = run_in_thread(
                lambda: run_worker(engine, store, settings, handler=handler, stop=STOP, max_seconds=run.max_seconds,
                                   drain=run.drain, progress=progress, refuse=declaration.refusal()),
                name=f"{name}-worker", grace_s=settings.drain_timeout_s + 30,
            )
        summary = finish(context, engine, summary={**result.to_summary(context.run_id), "queue": name},
                         started_at=started_at)
        if job.report is not None:
            job.report(context, engine, summary, result, run)
        return summary

    @dg.job(name=job.job or job_name(name), tags={"batch_assets/kind": "queue"},
            description=job.description or f"The {name} queue worker ({declaration.table}): drain once (drain=True) "
            f"or stay resident; claim due rows, call {declaration.handler}, record results in bulk.")
    def queue_job() -> None:
        work()

    return JobSpec(job=queue_job, config=config, config_op=op_name, resources=job.resources,
                   database_url=job.database_url,
                   privileges=(*queue_table(declaration.table), *QUEUE_BOOKKEEPING))
