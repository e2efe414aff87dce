"""Forward-only numbered SQL migrations.

Each `NNNN_name.sql` file under `migrations/` runs in its own transaction and
is recorded in `ba_schema_versions`. A session-level advisory lock serialises
concurrent `db migrate` calls, so two processes at once apply each file once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import sqlalchemy as sa

from batch_assets.errors import ConfigError

# Any constant works; it only has to be the same for every migrating process.
MIGRATION_LOCK_KEY = 0x62615F6D6967  # "ba_mig"
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
NEVER_SHIPPED = {3: "numbered by hand, the operations migration became 0004; no database has version 3"}
"""Numbers below the newest migration that have no file, and why (see the migrations package docstring)."""

VERSIONS_DDL = """
CREATE TABLE IF NOT EXISTS ba_schema_versions (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def label(self) -> str:
        """`0004_ops`: the file's name, what people read (a bare list of numbers looks like a gap to fix)."""
        return f"{self.version:04d}_{self.name}"


def labels(migrations: list[Migration]) -> str:
    """`0001_initial, 0002_queue, 0004_ops`, or `none pending`."""
    return ", ".join(m.label for m in migrations) or "none pending"


def load_migrations() -> list[Migration]:
    found = []
    for entry in resources.files("batch_assets.db.migrations").iterdir():
        match = _FILE_RE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions: {versions}")
    return found


def migrate(engine: sa.Engine) -> list[Migration]:
    """Apply every pending migration; return the ones applied by this call."""
    applied: list[Migration] = []
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        conn.commit()
        try:
            with conn.begin():
                conn.exec_driver_sql(VERSIONS_DDL)
            for migration in load_migrations():
                with conn.begin():
                    done = conn.execute(
                        sa.text("SELECT 1 FROM ba_schema_versions WHERE version = :v"), {"v": migration.version}
                    ).scalar()
                    if done:
                        continue
                    conn.exec_driver_sql(migration.sql)
                    conn.execute(
                        sa.text("INSERT INTO ba_schema_versions (version, name) VALUES (:v, :n)"),
                        {"v": migration.version, "n": migration.name},
                    )
                applied.append(migration)
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
            conn.commit()
    return applied


def applied_versions(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return versions_on(conn)


def versions_on(conn: sa.Connection) -> list[int]:
    """The versions recorded in `ba_schema_versions`, ascending (none when the table is absent)."""
    if not conn.execute(sa.text("SELECT to_regclass('ba_schema_versions')")).scalar():
        return []
    return list(conn.execute(sa.text("SELECT version FROM ba_schema_versions ORDER BY version")).scalars())


def pending_migrations(conn: sa.Connection) -> list[Migration]:
    """The migrations this database has not had (every one when `ba_schema_versions` is absent)."""
    done = set(versions_on(conn))
    return [m for m in load_migrations() if m.version not in done]


def pending_text(missing: list[Migration]) -> str:
    """`migrations pending (0001_initial, ...): run `batch-assets db migrate` first`."""
    return f"migrations pending ({labels(missing)}): run `batch-assets db migrate` first"


def require_migrated(engine: sa.Engine) -> None:
    """Refuse (ConfigError naming `database`, exit 2, nothing written) a database with migrations pending: a
    command would otherwise fail on its first statement with "relation ... does not exist"."""
    with engine.connect() as conn:
        missing = pending_migrations(conn)
    if missing:
        raise ConfigError(pending_text(missing), field="database")


def is_undefined_table(exc: BaseException) -> bool:
    """True for PostgreSQL's undefined_table (SQLSTATE 42P01), bare or wrapped by SQLAlchemy."""
    cause = getattr(exc, "orig", None) or exc
    return getattr(cause, "sqlstate", None) == "42P01"
