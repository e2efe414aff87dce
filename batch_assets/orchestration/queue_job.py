"""A declared queue in Dagster (CONTRACT §10): its worker's run config, op and job.

`queue_job_spec(declaration)` gives the job `<name>_queue_job` whose op runs the queue worker on
the declared table (`queue work --queue NAME` launches it, as `queue work` launches the payments'
`payment_queue_drain_job`). The run config is the payments' (`QueueWorkConfig`): concurrency,
max_seconds, batch_size, drain, db_outage_s (QueueRunSettings); unset = the declaration's value.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

import dagster as dg

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
from batch_assets.orchestration.resources import DatabaseResource
from batch_assets.orchestration.spec import JobSpec
from batch_assets.queue.declaration import QueueDeclaration
from batch_assets.queue.settings import QueueRunSettings
from batch_assets.queue.worker import run_worker
from batch_assets.shutdown import STOP

QueueWorkConfig = config_class(
    QueueRunSettings, "QueueWorkConfig",
    "A queue worker (CONTRACT §7, §10): a drain, or the resident worker. Unset = the queue's declared value.",
)


def job_name(queue: str) -> str:
    """The job of a declared queue."""
    return f"{queue}_queue_job"


def queue_job_spec(declaration: QueueDeclaration, *, source: str = "") -> JobSpec:
    """The op and job of one declared queue."""
    name = declaration.name

    @dg.op(name=f"work_{name}_queue", tags={"kind": "queue"}, pool=APP_DATABASE_POOL,
           config_schema=config_schema_of(QueueWorkConfig))
    def work(context: dg.OpExecutionContext, database: DatabaseResource) -> dict:
        """Process due rows: until nothing is due (drain), or resident until stopped or max_seconds."""
        started_at = utcnow()
        engine = database.get_engine(min_pool_size=4)
        try:  # a bad field, a table lacking a column, a handler that cannot be imported: failed before any claim
            run = config_of(QueueWorkConfig, context).to_settings()
            settings = run.worker_settings(declaration.settings)
            store = declaration.checked_store(engine, source=source)
            handler = declaration.make_handler(settings)
        except ConfigError as exc:
            raise config_failure(exc) from None
        progress = OpProgress(context, label=f"{name} queue")
        with stop_on_interrupt(), progress:
            result = run_in_thread(
                lambda: run_worker(engine, store, settings, handler=handler, stop=STOP,
                                   max_seconds=run.max_seconds, drain=run.drain, progress=progress),
                name=f"{name}-worker", grace_s=settings.drain_timeout_s + 30,
            )
        summary = {**result.to_summary(context.run_id), "queue": name}
        return finish(context, engine, summary=summary, started_at=started_at)

    @dg.job(name=job_name(name), tags={"batch_assets/kind": "queue"},
            description=f"The {name} queue worker ({declaration.table}): drain once (drain=True) or stay resident; "
            f"claim due rows, call {declaration.handler}, record results in bulk.")
    def queue_job() -> None:
        work()

    return JobSpec(job=queue_job, config=QueueWorkConfig, config_op=f"work_{name}_queue")
