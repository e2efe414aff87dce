"""Forward-only numbered SQL migrations, in sets.

A `MigrationSet` is a package of `NNNN_name.sql` files: the library's own (`LIBRARY`: the `ba_*` tables and
functions every job needs) and one per project that brings tables of its own (this repository's reference
project brings `customers`, `payments`, ...). `migrate` applies the library's set first, then the others in
the order given; each file runs in its own transaction and is recorded in `ba_migrations` under its set's
name. A session-level advisory lock serialises concurrent `db migrate` calls (and each declared queue's
install), so two processes at once apply each file once.

The previous release kept one combined set and recorded it in `ba_schema_versions`. That table is left as it
is: every file of the new sets is guarded, so on such a database it adds only what is missing and is recorded
in `ba_migrations` like on a new one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

import sqlalchemy as sa

from batch_assets.db.privileges import LEDGER, Privilege, require_privileges
from batch_assets.errors import ConfigError

# Any constant works; it only has to be the same for every migrating process.
MIGRATION_LOCK_KEY = 0x62615F6D6967  # "ba_mig"
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_SET_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class MigrationSet:
    """A set of forward-only numbered `NNNN_name.sql` files in the importable package `package`, recorded
    in the ledger under `name` (so two sets may both have a `0001`)."""

    name: str
    package: str

    def __post_init__(self) -> None:
        if not _SET_NAME_RE.fullmatch(self.name):
            raise ValueError(f"a migration set's name must match {_SET_NAME_RE.pattern}, got {self.name!r}")

    def migrations(self) -> list[Migration]:
        """Every file of the set, by version; RuntimeError when two share a number."""
        found = []
        for entry in resources.files(self.package).iterdir():
            match = _FILE_RE.match(entry.name)
            if match:
                found.append(Migration(self.name, int(match.group(1)), match.group(2),
                                       entry.read_text(encoding="utf-8")))
        found.sort(key=lambda m: m.version)
        versions = [m.version for m in found]
        if len(set(versions)) != len(versions):
            raise RuntimeError(f"duplicate migration versions in {self.name}: {versions}")
        return found


LIBRARY = MigrationSet("batch_assets", "batch_assets.db.migrations")
"""The library's own objects, each named `ba_*`: applied first by every `migrate`, listed or not."""


@dataclass(frozen=True)
class Migration:
    migration_set: str
    version: int
    name: str
    sql: str

    @property
    def label(self) -> str:
        """`batch_assets/0001_library`: the set and the file's name, what people read."""
        return f"{self.migration_set}/{self.version:04d}_{self.name}"


def labels(migrations: Sequence[Migration]) -> str:
    """`batch_assets/0001_library, reference/0001_tables`, or `none pending`."""
    return ", ".join(m.label for m in migrations) or "none pending"


def with_library(sets: Sequence[MigrationSet]) -> list[MigrationSet]:
    """`sets` with the library's first (once), in the order they are applied; ValueError when two sets share a
    name (their versions would share the ledger's rows)."""
    ordered = [LIBRARY, *(s for s in sets if s != LIBRARY)]
    names = [s.name for s in ordered]
    if len(set(names)) != len(names):
        raise ValueError(f"two migration sets share a name: {names}")
    return ordered


def migrate(engine: sa.Engine, sets: Sequence[MigrationSet]) -> list[Migration]:
    """Apply every pending migration of the library's set and then of `sets`; return the ones this call applied."""
    ordered = with_library(sets)
    applied: list[Migration] = []
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        conn.commit()
        try:
            for migration_set in ordered:
                done = _recorded(conn).get(migration_set.name, {})
                conn.commit()
                for migration in migration_set.migrations():
                    if migration.version in done:
                        continue
                    with conn.begin():
                        conn.exec_driver_sql(migration.sql)
                        conn.execute(
                            sa.text("INSERT INTO ba_migrations (migration_set, version, name) VALUES (:s, :v, :n)"),
                            {"s": migration.migration_set, "v": migration.version, "n": migration.name},
                        )
                    applied.append(migration)
        finally:
            conn.rollback()
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
            conn.commit()
    return applied


def _recorded(conn: sa.Connection) -> dict[str, dict[int, str]]:
    """Set name → {version: name} of every file the ledger (`ba_migrations`) records; empty when the ledger does
    not exist yet (the library set's first file makes it)."""
    if not conn.execute(sa.text("SELECT to_regclass('ba_migrations')")).scalar():
        return {}
    found: dict[str, dict[int, str]] = {}
    rows = conn.execute(sa.text("SELECT migration_set, version, name FROM ba_migrations ORDER BY version"))
    for set_name, version, name in rows:
        found.setdefault(str(set_name), {})[int(version)] = str(name)
    return found


def applied_migrations(conn: sa.Connection, sets: Sequence[MigrationSet]) -> list[Migration]:
    """What the ledger records for the library's set and `sets`, in the order they apply (sql left empty: a
    recorded file may be one this release no longer has)."""
    recorded = _recorded(conn)
    return [Migration(s.name, version, name, "")
            for s in with_library(sets) for version, name in sorted(recorded.get(s.name, {}).items())]


def applied_versions(engine: sa.Engine, sets: Sequence[MigrationSet]) -> dict[str, list[int]]:
    """Set name → the versions the ledger records for it, ascending: the library's set and `sets`, each listed."""
    with engine.connect() as conn:
        recorded = _recorded(conn)
    return {s.name: sorted(recorded.get(s.name, {})) for s in with_library(sets)}


def pending_migrations(conn: sa.Connection, sets: Sequence[MigrationSet]) -> list[Migration]:
    """The migrations of the library's set and `sets` this database has not had (all when the ledger is absent)."""
    recorded = _recorded(conn)
    return [m for s in with_library(sets) for m in s.migrations() if m.version not in recorded.get(s.name, {})]


def pending_text(missing: Sequence[Migration]) -> str:
    """`migrations pending (batch_assets/0001_library, ...): run `batch-assets db migrate` first`."""
    return f"migrations pending ({labels(missing)}): run `batch-assets db migrate` first"


def require_migrated(engine: sa.Engine, sets: Sequence[MigrationSet], privileges: Iterable[Privilege] = ()) -> None:
    """Refuse (ConfigError naming `database`, exit 2, nothing written) a database with migrations of the library's
    set or of `sets` pending: a command would otherwise fail on its first statement with "relation ... does not
    exist", or on a database of the previous release with "column ... does not exist". Then refuse a role that lacks
    one of `privileges` (the grants the job needs: `db.privileges`), naming the first one missing, before the job
    writes anything. Both checks read the catalog only, in two round trips."""
    with engine.connect() as conn:
        require_privileges(conn, LEDGER)  # the ledger is read next
        missing = pending_migrations(conn, sets)
        if not missing:
            require_privileges(conn, privileges)
    if missing:
        raise ConfigError(pending_text(missing), field="database")


def is_undefined_table(exc: BaseException) -> bool:
    """True for PostgreSQL's undefined_table (SQLSTATE 42P01), bare or wrapped by SQLAlchemy."""
    cause = getattr(exc, "orig", None) or exc
    return getattr(cause, "sqlstate", None) == "42P01"
