"""`batch_assets.TableQueueComponent`: a queue of a team's own table, declared in a defs.yaml (CONTRACT §10).

    type: batch_assets.TableQueueComponent
    attributes: {name, table, key, columns, handler, max_attempts?, backoff?: {base_s, max_s},
                 rate_limit_per_s?, concurrency?, priority?}

The attributes are `domains.queue.declaration.QueueDeclaration` (the payments queue is declared with
the same model); checked in two steps, each failure a ConfigError naming the file and the attribute
(exit 2): when the file is loaded (names, lists, bounds, the handler imports), and against the database
(`check_database`: the table holds every column the queue needs; `db migrate` refuses it the same way).

`build_defs` / `job_specs` give the job `<name>_queue_job` (`queue work --queue NAME`).
"""

# No `from __future__ import annotations`: pydantic and Dagster read the annotations at runtime.

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from batch_assets.orchestration.queue_job import job_name, queue_job_spec
from batch_assets.orchestration.spec import JobSpec
from batch_assets.queue.declaration import Backoff, QueueDeclaration


class QueueBackoff(Backoff, dg.Model):
    """`backoff: {base_s, max_s}` as Dagster's resolution reads it (the same model)."""


class TableQueueComponent(dg.Component, dg.Resolvable, QueueDeclaration):
    """A PostgreSQL task queue over a table holding the payments' queue columns (CONTRACT §3, §7, §10)."""

    backoff: QueueBackoff = Field(default_factory=QueueBackoff)

    @property
    def job_name(self) -> str:
        return job_name(self.name)

    def check_database(self, engine: sa.Engine) -> None:
        """What `jobs list`, `queue work|stats|dlq` and `db migrate` check first: the table and its columns."""
        self.checked_store(engine)

    def job_specs(self) -> list[JobSpec]:
        return [queue_job_spec(self)]

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from batch_assets.orchestration.sweep_job import definitions_of

        return definitions_of(self.job_specs())
