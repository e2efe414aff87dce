"""Test databases on a real PostgreSQL.

The server is BATCH_ASSETS_TEST_DATABASE_URL when set, else the embedded one
(under .batch_assets/ of the repository). A session fixture builds a template
database with every migration applied; each test that asks for `db_url` /
`engine` gets its own database cloned from it, dropped (WITH FORCE) after.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import uuid
import weakref
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import sqlalchemy as sa
from helpers import SUITE_LAUNCHER
from sqlalchemy import event
from sqlalchemy.engine import make_url

from batch_assets.db.engine import create_engine
from batch_assets.db.migrate import LIBRARY, migrate
from batch_assets.locking.owner import make_owner, parse_owner, provably_dead
from batch_assets.reference.customer_status.crypto import DobCipher, generate_key_text
from batch_assets.reference.migrations import REFERENCE
from batch_assets.settings import TEST_DATABASE_URL_VAR, environ_without_product

REPO = Path(__file__).resolve().parent.parent


TEST_PHASE_VAR = "BATCH_ASSETS_TEST_PHASE"
"""`make test` runs the suite in two phases: `parallel` (every test but those marked `alone`, in TEST_PROCESSES
processes) and then `alone` (only those, in one process). Unset: every test."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phase = os.environ.get(TEST_PHASE_VAR, "")
    if phase not in {"parallel", "alone"}:
        return
    keep, drop = [], []
    for item in items:
        (keep if (item.get_closest_marker("alone") is not None) == (phase == "alone") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _server_url() -> str:
    url = os.environ.get(TEST_DATABASE_URL_VAR, "").strip()
    if url:
        return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    from batch_assets.db import embedded

    return embedded.ensure_running(REPO / ".batch_assets")


def _with_db(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


class _ClosedByCollector:
    """Pooled connections that no code closed, per database: the garbage collector gave them back.

    A Connection and its autobegun transaction reference each other, so a Connection nobody closes goes
    back to its pool only when the cycle collector runs, at no fixed time: a check of checked-out
    connections at a test's end sees it only if no collection happened first. This sees it always: each
    checkout keeps a weak reference to the pool's proxy, and a checkin whose proxy is already dead came
    from the collector, not from close() (which holds the proxy while it checks in)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._out: dict[int, tuple[weakref.ref[object], str]] = {}
        self._returned: Counter[str] = Counter()

    def checkout(self, dbapi_connection: object, record: object, proxy: object) -> None:
        if not isinstance(dbapi_connection, psycopg.Connection):
            return  # the product's driver only: not Dagster's storage (SQLite, or psycopg2 on PostgreSQL)
        database = str(dbapi_connection.info.dbname)
        with self._lock:
            self._out[id(record)] = (weakref.ref(proxy), database)

    def checkin(self, dbapi_connection: object, record: object) -> None:
        with self._lock:
            out = self._out.pop(id(record), None)
            if out is not None and out[0]() is None:
                self._returned[out[1]] += 1

    def collect(self, database: str) -> int:
        """Run the collector, then how many of `database`'s connections it (ever) gave back."""
        gc.collect()
        with self._lock:
            return self._returned.pop(database, 0)


CLOSED_BY_COLLECTOR = _ClosedByCollector()


@pytest.fixture(scope="session", autouse=True)
def _closed_by_collector() -> Iterator[None]:
    event.listen(sa.pool.Pool, "checkout", CLOSED_BY_COLLECTOR.checkout)
    event.listen(sa.pool.Pool, "checkin", CLOSED_BY_COLLECTOR.checkin)
    yield
    event.remove(sa.pool.Pool, "checkout", CLOSED_BY_COLLECTOR.checkout)
    event.remove(sa.pool.Pool, "checkin", CLOSED_BY_COLLECTOR.checkin)


@pytest.fixture(scope="session", autouse=True)
def _suite_launcher() -> Iterator[None]:
    """Stops this test process's resident launcher (helpers.SuiteLauncher), if a test started it."""
    yield
    SUITE_LAUNCHER.close()


@pytest.fixture(scope="session")
def server_url() -> str:
    """URL of a database on the test server (used for CREATE/DROP DATABASE)."""
    return _server_url()


@pytest.fixture(scope="session")
def admin_engine(server_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(
        _with_db(server_url, "postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
    )
    yield engine
    engine.dispose()


def _create_db(admin: sa.Engine, name: str, template: str | None = None) -> None:
    # Names are generated here from a fixed prefix and hex digits, never from input.
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        suffix = f' TEMPLATE "{template}"' if template else ""
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"{suffix}')


def _drop_db(admin: sa.Engine, name: str) -> None:
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def template_db(admin_engine: sa.Engine, server_url: str) -> Iterator[str]:
    """A database with every migration of this repository's code location applied (the library's set and the
    reference project's), used as the TEMPLATE of each test database."""
    name = f"ba_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    _create_db(admin_engine, name)
    engine = create_engine(_with_db(server_url, name), pool_size=1)
    try:
        migrate(engine, (LIBRARY, REFERENCE))
    finally:
        engine.dispose()
    yield name
    _drop_db(admin_engine, name)


@pytest.fixture
def empty_db_url(admin_engine: sa.Engine, server_url: str) -> Iterator[str]:
    """A brand-new database with no schema."""
    name = f"ba_e_{uuid.uuid4().hex[:12]}"
    _create_db(admin_engine, name)
    yield _with_db(server_url, name)
    _drop_db(admin_engine, name)


@pytest.fixture
def db_url(admin_engine: sa.Engine, server_url: str, template_db: str) -> Iterator[str]:
    """A database of this test's own, cloned from the migrated template."""
    name = f"ba_t_{uuid.uuid4().hex[:12]}"
    _create_db(admin_engine, name, template=template_db)
    try:
        yield _with_db(server_url, name)
        if leaked := CLOSED_BY_COLLECTOR.collect(name):
            pytest.fail(f"{leaked} pooled connection(s) of this test's database were never closed: only the "
                        "garbage collector gave them back (a connection leak)", pytrace=False)
    finally:
        _drop_db(admin_engine, name)


def _checked_out(database: str, *engines: sa.Engine) -> int:
    """Connections still checked out of `engines` and of the product's own engines (db.engine.get_engine)
    on `database`: at a test's end each is a connection some code forgot to give back."""
    from batch_assets.db import engine as db_engine

    with db_engine._engines_lock:
        product = [e for e in db_engine._engines.values() if e.url.database == database]
    return sum(e.pool.checkedout() for e in (*engines, *product) if isinstance(e.pool, sa.pool.QueuePool))


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    """The test database's engine. At teardown no connection of it (nor of the product's engines on this
    database) may still be checked out: a leaked connection fails the test that leaked it."""
    from helpers import wait_for

    engine = create_engine(db_url, pool_size=12)
    try:
        yield engine
        database = str(make_url(db_url).database)
        # Threads of a run that ended FAILURE may still be giving theirs back: allow them a few seconds.
        try:
            wait_for(lambda: _checked_out(database, engine) == 0, timeout=10, what="every connection given back")
        except AssertionError:
            pytest.fail(f"{_checked_out(database, engine)} pooled connection(s) still checked out at the end "
                        "of the test: a connection leak", pytrace=False)
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def key_text() -> str:
    return generate_key_text()


@pytest.fixture(scope="session")
def cipher(key_text: str) -> DobCipher:
    from batch_assets.reference.customer_status.crypto import decode_key

    return DobCipher(decode_key(key_text))


@pytest.fixture
def cli_env(db_url: str, key_text: str, tmp_path: Path) -> dict[str, str]:
    """Environment for running `batch-assets` against this test's database."""
    env = environ_without_product()
    env.update(
        BATCH_ASSETS_DATABASE_URL=db_url,
        BATCH_ASSETS_ENCRYPTION_KEY=key_text,
        BATCH_ASSETS_HOME=str(tmp_path / "home"),
    )
    return env


def redis_reachable(url: str = "redis://127.0.0.1:6379/0") -> bool:
    """Whether a Redis answers at `url` (a user's fresh machine may have none)."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.exceptions.RedisError:
        return False
    finally:
        client.close()


@pytest.fixture
def require_redis() -> None:
    """Skip (with the reason) when the local Redis is not there; CI always has one."""
    if not redis_reachable():
        pytest.skip("no Redis at 127.0.0.1:6379 (the Redis backends are optional)")


@pytest.fixture
def dead_owner() -> Iterator[str]:
    """The owner string (locking.owner) a process of this host had, after that process was killed."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        start = round(psutil.Process(proc.pid).create_time() * 100)
        mine = parse_owner(make_owner("x"))
        assert mine is not None
        owner = f"crashed-run@{mine.host}:{proc.pid}:s{start}:n{mine.pid_namespace}"
        assert not provably_dead(owner), "a live process must never be judged dead"
    finally:
        proc.kill()
        proc.wait(timeout=10)
    yield owner


@pytest.fixture(autouse=True)
def _no_inherited_defs_state_storage() -> Iterator[None]:
    """Each test starts with no current Dagster defs-state storage. Entering a DagsterInstance makes its storage
    the process's current one (a context variable); a test whose instance was entered and never exited leaves it
    current after the instance is gone, and the next test in that process that loads Definitions fails with
    "Attempted to resolve undefined DagsterInstance weakref" (seen when the suite runs in two processes: which
    tests share a process changes)."""
    if "dagster" not in sys.modules:  # nothing of Dagster imported yet: nothing can be current
        yield
        return
    from dagster._core.storage.defs_state.base import set_defs_state_storage

    with set_defs_state_storage(None):
        yield
