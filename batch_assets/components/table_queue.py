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

from pathlib import Path

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from batch_assets.domains.queue.dagster import job_name, queue_job_spec
from batch_assets.domains.queue.declaration import Backoff, QueueDeclaration
from batch_assets.domains.queue.store import QueueStore
from batch_assets.errors import ConfigError
from batch_assets.orchestration.spec import JobSpec


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


def declared_queues() -> dict[str, tuple[Path | None, QueueDeclaration]]:
    """Every queue by name: payments (the product's own, no file) and each TableQueueComponent under
    BATCH_ASSETS_DEFS_DIR with its file. A broken declaration is left out here (`find_queue` names it)."""
    from batch_assets.components.loader import load_declarations
    from batch_assets.domains.payments.declaration import PAYMENTS_QUEUE

    queues: dict[str, tuple[Path | None, QueueDeclaration]] = {PAYMENTS_QUEUE.name: (None, PAYMENTS_QUEUE)}
    for loaded in load_declarations().of_type(TableQueueComponent):
        queues.setdefault(loaded.component.name, (loaded.path, loaded.component))
    return queues


def find_queue(name: str | None) -> tuple[Path | None, QueueDeclaration]:
    """The queue `--queue NAME` names (payments when None); a ConfigError naming the file and the attribute
    when its declaration cannot work, or naming `queue` when no queue has that name."""
    from batch_assets.components.loader import load_declarations

    if name is None:
        name = "payments"
    queues = declared_queues()
    if name in queues:
        return queues[name]
    for error in load_declarations().errors:
        if getattr(error, "declares", None) in (name, None):
            raise error
    raise ConfigError(f"no queue named {name!r}; declared: {', '.join(sorted(queues))}", field="queue")


def checked_queues(engine: sa.Engine, *, with_payments: bool = True) -> list[tuple[Path | None, QueueStore]]:
    """Every declared queue's store, its table checked (key type read): what `db migrate` installs on.

    A broken TableQueueComponent file, or a table lacking a column the queue needs, is a ConfigError naming the
    file and the attribute (the column), before anything is written."""
    from batch_assets.components.loader import from_config_error, load_declarations

    for error in load_declarations().errors:
        if _declares_a_queue(error.path):
            raise error
    found: list[tuple[Path | None, QueueStore]] = []
    for _, (path, declaration) in sorted(declared_queues().items()):
        if path is None and not with_payments:
            continue
        try:
            found.append((path, declaration.checked_store(engine)))
        except ConfigError as exc:
            raise (from_config_error(path, exc) if path is not None else exc) from None
    return found


def _declares_a_queue(path: Path) -> bool:
    try:
        return "TableQueueComponent" in path.read_text(encoding="utf-8")
    except OSError:
        return False


def install_queues(engine: sa.Engine) -> list[str]:
    """`db migrate`'s part for the queues: on each declared queue's table its claim_token column, claim, processing
    and failed indexes and wake-up trigger (safe to run again), under the migration lock. Returns the queue names."""
    from batch_assets.db.migrate import MIGRATION_LOCK_KEY

    stores = checked_queues(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT pg_advisory_lock(%(k)s)", {"k": MIGRATION_LOCK_KEY})
        conn.commit()
        try:
            for _, store in stores:
                with conn.begin():
                    store.install(conn)
        finally:
            conn.exec_driver_sql("SELECT pg_advisory_unlock(%(k)s)", {"k": MIGRATION_LOCK_KEY})
            conn.commit()
    return [store.name for _, store in stores]
