"""Every queue of the code location, by name: its own (the reference project's payments) and the declared ones.

`queue work|stats|dlq --queue NAME` finds its queue here, and `db migrate` installs each one's trigger and indexes.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import sqlalchemy as sa

from batch_assets.errors import ConfigError
from batch_assets.orchestration.components.table_queue import TableQueueComponent
from batch_assets.queue.declaration import QueueDeclaration
from batch_assets.queue.store import QueueStore

LOCATION_QUEUES = ("batch_assets.reference.payments.declaration:PAYMENTS_QUEUE",)
"""The code location's own queues (not declared in a defs.yaml)."""


def location_queues() -> list[QueueDeclaration]:
    found = []
    for target in LOCATION_QUEUES:
        module, _, name = target.partition(":")
        found.append(getattr(importlib.import_module(module), name))
    return found


def declared_queues() -> dict[str, tuple[Path | None, QueueDeclaration]]:
    """Every queue by name: payments (the product's own, no file) and each TableQueueComponent under
    BATCH_ASSETS_DEFS_DIR with its file. A broken declaration is left out here (`find_queue` names it)."""
    from batch_assets.orchestration.components.loader import load_declarations

    queues: dict[str, tuple[Path | None, QueueDeclaration]] = {q.name: (None, q) for q in location_queues()}
    for loaded in load_declarations().of_type(TableQueueComponent):
        queues.setdefault(loaded.component.name, (loaded.path, loaded.component))
    return queues


def find_queue(name: str | None) -> tuple[Path | None, QueueDeclaration]:
    """The queue `--queue NAME` names (payments when None); a ConfigError naming the file and the attribute
    when its declaration cannot work, or naming `queue` when no queue has that name."""
    from batch_assets.orchestration.components.loader import load_declarations

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
    from batch_assets.orchestration.components.loader import from_config_error, load_declarations

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
