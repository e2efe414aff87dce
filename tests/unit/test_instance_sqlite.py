"""Start-up: while a CLI launch runs, the instance's SQLite files are written without an fsync and a
WAL checkpoint per event (`instance_home.quick_commits`); outside it, SQLite's defaults."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from batch_assets.orchestration import instance_home

pytestmark = pytest.mark.unit

FULL, NORMAL = 2, 1


def _wal_database(path: Path) -> sa.Engine:
    """A database in WAL mode written as Dagster's SQLite storage writes: a new connection per statement."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, body TEXT)")
    conn.close()  # (a sqlite3 connection's `with` commits, it does not close)
    return sa.create_engine(f"sqlite:///{path}", poolclass=NullPool)


def _store(engine: sa.Engine) -> int:
    """One event stored; the connection's synchronous setting."""
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO events (body) VALUES ('x')")
        return int(conn.exec_driver_sql("PRAGMA synchronous").scalar_one())


def test_commits_are_not_synced_and_the_wal_is_checkpointed_once(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    wal = Path(f"{db}-wal")
    engine = _wal_database(db)
    assert _store(engine) == FULL and not wal.exists()  # the default: the last close checkpoints, removes the WAL
    with instance_home.quick_commits():
        assert [_store(engine) for _ in range(5)] == [NORMAL] * 5
        assert wal.exists()  # Dagster's connection closed, the process's idle one kept the log open
    assert not wal.exists()  # the block's end: the one checkpoint
    assert instance_home._ANCHORS == {}
    assert _store(engine) == FULL
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM events").fetchone() == (7,)
    conn.close()
    engine.dispose()


def test_a_database_is_switched_to_wal_after_its_first_connection(tmp_path: Path) -> None:
    """Dagster creates a run's event-log shard on its first connection and switches it to WAL then: the idle
    connection attaches to the log on the next one."""
    db = tmp_path / "shard.db"
    engine = sa.create_engine(f"sqlite:///{db}", poolclass=NullPool)
    with instance_home.quick_commits():
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE events (id INTEGER PRIMARY KEY, body TEXT)")
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        for _ in range(3):
            assert _store(engine) == NORMAL
        assert Path(f"{db}-wal").exists()
    assert not Path(f"{db}-wal").exists()
    engine.dispose()


def test_postgresql_connections_are_not_touched() -> None:
    """Only sqlite3 connections get the pragma (the listener sees every engine's connections)."""
    class NotSqlite:
        def execute(self, *_: object) -> None:
            raise AssertionError("a non-SQLite connection was given a pragma")

    with instance_home.quick_commits():
        instance_home._on_connect(NotSqlite(), None)
