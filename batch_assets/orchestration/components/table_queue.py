"""`batch_assets.TableQueueComponent`: a queue of a team's own table, declared in a defs.yaml.

    type: batch_assets.TableQueueComponent
    attributes: {name, table, key, columns, handler, max_attempts?, backoff?: {base_s, max_s},
                 rate_limit_per_s?, concurrency?, priority?, max_in_flight?, claim_lease_s?, database_url?}

The attributes are `queue.declaration.QueueDeclaration` (the payments queue is declared with the same model);
checked in two steps, each failure a ConfigError naming the file and the attribute (exit 2): when the file is
loaded (names, lists, bounds, the handler imports: beside the defs.yaml first), and against the database
(`check_database`: the table holds every column the queue needs; `db migrate` refuses it the same way).

`build_defs` is the one route to Dagster: the job `<name>_queue_job` (`queue work --queue NAME`) and, in a team's
project, the resources it needs.
"""

# No `from __future__ import annotations`: pydantic and Dagster read the annotations at runtime.

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import dagster as dg
import sqlalchemy as sa
from pydantic import Field, PrivateAttr

from batch_assets.orchestration.components.common import (
    DATABASE_URL_RESOLVER,
    DatabaseUrl,
    DeclaredComponent,
    url_getter,
)
from batch_assets.orchestration.components.scaffold import TableQueueScaffolder
from batch_assets.orchestration.defaults import LocationDefaults
from batch_assets.orchestration.queue_job import QueueJob, build_queue_job, job_name
from batch_assets.orchestration.spec import JobSpec
from batch_assets.plugins import load_function
from batch_assets.queue.declaration import Backoff, QueueDeclaration


class QueueBackoff(Backoff, dg.Model):
    """`backoff: {base_s, max_s}` as Dagster's resolution reads it (the same model)."""


@dg.scaffold_with(TableQueueScaffolder)
class TableQueueComponent(DeclaredComponent, dg.Component, dg.Resolvable, QueueDeclaration):
    """A PostgreSQL task queue over a table holding the payments' queue columns."""

    backoff: QueueBackoff = Field(default_factory=QueueBackoff)
    database_url: Annotated[DatabaseUrl | None, DATABASE_URL_RESOLVER] = None

    _folder: Path | None = PrivateAttr(default=None)
    _built: dict[LocationDefaults, list[JobSpec]] = PrivateAttr(default_factory=dict)

    @property
    def job_name(self) -> str:
        return job_name(self.name)

    def located(self, folder: Path | None) -> "TableQueueComponent":
        """Where the defs.yaml is: `handler` is looked for beside it first."""
        if folder is not None:
            self._folder = folder
        return self

    def function(self) -> Callable[..., Any]:
        """The handler: beside the defs.yaml first, then on the Python path (ConfigError naming `handler`)."""
        return load_function(self.handler, field="handler", beside=self._folder)

    def check_database(self, engine: sa.Engine) -> None:
        """What `jobs list`, `queue work|stats|dlq` and `db migrate` check first: the table and its columns."""
        self.checked_store(engine)

    def built_specs(self, defaults: LocationDefaults, folder: Path | None = None) -> list[JobSpec]:
        """The queue's job for a code location with `defaults` (built once per location kind)."""
        self.located(folder)
        built = self._built.get(defaults)
        if built is None:
            self.check_static()
            built = self._built[defaults] = [build_queue_job(QueueJob(
                self, database_key="database" if defaults.shared_resources else f"{self.name}__database",
                database_url=url_getter(self.name, self.database_url),
                source=str(folder / "defs.yaml") if folder is not None else "",
            ))]
        return built

