"""A declared queue in Dagster (CONTRACT §10): its worker's run config, op and job.

`queue_job_spec(declaration)` gives the job `<name>_queue_job` whose op runs the queue worker on
the declared table (`queue work --queue NAME` launches it, as `queue work` launches the payments'
`payment_queue_drain_job`). The run config is the payments' (`QueueWorkConfig`): concurrency,
max_seconds, batch_size, drain, db_outage_s; 0 or missing = the declaration's value.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource annotations at runtime.

from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg
from pydantic import Field

from batch_assets.domains.queue.declaration import QueueDeclaration
from batch_assets.domains.queue.settings import MAX_BATCH, MAX_CONCURRENCY, MAX_DB_OUTAGE_S, QueueSettings
from batch_assets.domains.queue.worker import run_worker
from batch_assets.errors import ConfigError
from batch_assets.orchestration.config import JobConfig, count_field, seconds_field
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
from batch_assets.shutdown import STOP


@dataclass(frozen=True)
class QueueDrainPlan:
    """The validated run config."""

    max_seconds: float | None
    drain: bool
    engine: QueueSettings


class QueueWorkConfig(JobConfig):
    """A queue worker (CONTRACT §7, §10): a drain, or the resident worker. 0 or missing = the default."""

    concurrency: int = count_field("8", maximum=MAX_CONCURRENCY, description="Handler calls in flight.")
    max_seconds: float = seconds_field("no limit", description="Stop claiming new work after this many seconds.")
    batch_size: int = count_field("50", maximum=MAX_BATCH, description="First claim batch (it adapts within 1..1000).")
    drain: bool = Field(
        default=True,
        description="Exit once nothing is due. False = the resident worker: it waits for notifications "
        "and runs until stopped (SIGTERM, run termination) or max_seconds.",
    )
    db_outage_s: float = seconds_field(
        "60", maximum=MAX_DB_OUTAGE_S,
        description="Seconds a lost database connection is retried (backoff) before the worker fails.",
    )

    def to_settings(self) -> QueueDrainPlan:
        """Validate everything (ConfigError naming the field) and return the plan + queue settings."""
        return self.plan(QueueSettings.build)

    def plan(self, build: Callable[..., QueueSettings]) -> QueueDrainPlan:
        """The plan with the settings `build(**run config overrides)` makes (a declaration's own defaults)."""
        self.check_fields()
        engine = build(concurrency=self.concurrency or None, batch_size=self.batch_size or None,
                       db_outage_s=self.db_outage_s or None)
        return QueueDrainPlan(max_seconds=self.max_seconds or None, drain=self.drain, engine=engine)


def job_name(queue: str) -> str:
    """The job of a declared queue."""
    return f"{queue}_queue_job"


def queue_job_spec(declaration: QueueDeclaration, *, source: str = "") -> JobSpec:
    """The op and job of one declared queue."""
    name = declaration.name

    @dg.op(name=f"work_{name}_queue", tags={"kind": "queue"}, config_schema=config_schema_of(QueueWorkConfig))
    def work(context: dg.OpExecutionContext, database: DatabaseResource) -> dict:
        """Process due rows: until nothing is due (drain), or resident until stopped or max_seconds."""
        started_at = utcnow()
        engine = database.get_engine(min_pool_size=4)
        try:  # a bad field, a table lacking a column, a handler that cannot be imported: failed before any claim
            plan = config_of(QueueWorkConfig, context).plan(declaration.settings)
            store = declaration.checked_store(engine, source=source)
            handler = declaration.make_handler(plan.engine)
        except ConfigError as exc:
            raise config_failure(exc) from None
        progress = OpProgress(context, label=f"{name} queue")
        with stop_on_interrupt(), progress:
            result = run_in_thread(
                lambda: run_worker(engine, store, plan.engine, handler=handler, stop=STOP,
                                   max_seconds=plan.max_seconds, drain=plan.drain, progress=progress),
                name=f"{name}-worker", grace_s=plan.engine.drain_timeout_s + 30,
            )
        summary = {**result.to_summary(context.run_id), "queue": name}
        return finish(context, engine, summary=summary, started_at=started_at)

    @dg.job(name=job_name(name), tags={"batch_assets/kind": "queue"},
            description=f"The {name} queue worker ({declaration.table}): drain once (drain=True) or stay resident; "
            f"claim due rows, call {declaration.handler}, record results in bulk.")
    def queue_job() -> None:
        work()

    return JobSpec(job=queue_job, config=QueueWorkConfig, config_op=f"work_{name}_queue")
