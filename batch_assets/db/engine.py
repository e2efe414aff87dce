"""Engines and connection errors.

One engine per process and URL (psycopg 3), pool sized from settings. Driver
errors are translated here, in one place: about reachability into
`DatabaseUnavailable` with a one-line message naming the host and the cause, and
a missing grant (insufficient_privilege) into `PermissionDenied` (exit 2).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import sqlalchemy as sa
from psycopg.rows import TupleRow
from sqlalchemy.engine import make_url
from sqlalchemy.pool import PoolProxiedConnection

from batch_assets.db.privileges import is_insufficient_privilege, permission_denied
from batch_assets.db.timeouts import SESSION_TIMEOUTS_SQL, local_timeouts
from batch_assets.errors import ConfigError, DatabaseUnavailable, cause_line
from batch_assets.settings import DATABASE_URL_VAR, Settings

DEFAULT_POOL_SIZE = 10
APPLICATION_NAME = "batch_assets"
"""`application_name` of the product's connections (pg_stat_activity), outside a Dagster run."""
RUN_APPLICATION_PREFIX = "batch_assets run "
"""`application_name` of a run's connections: this prefix and the run id, so the backends one run holds can be
counted (`SELECT count(*) FROM pg_stat_activity WHERE application_name = 'batch_assets run <run id>'`)."""
DEFAULT_MAX_OVERFLOW = 2

# A dead client must not hold its locks for ever (a page transaction's lease fence blocks the takeover until it
# ends). Sent by every connection of the product's engines in its startup packet (`options`, no round trip):
IDLE_IN_TRANSACTION_TIMEOUT_S = 120
"""The server ends a session idle inside a transaction this long (SQLSTATE 25P03, transient: the work is retried on a
fresh connection). Far above any pause between the statements of one of the product's transactions (they are sent
back to back; compute happens outside them), far below the lock-at-most-for of a job (120 s) plus its lease."""
SERVER_KEEPALIVE_S = (30, 10, 3)
"""Server-side TCP keepalives (tcp_keepalives_idle, _interval, _count): a client host that vanished (power off, a
cut network: no FIN, no RST) is found out after 30 + 3 x 10 = 60 s of silence, its session ended and its locks freed."""
CLIENT_KEEPALIVE_S = (30, 10, 3)
"""libpq keepalives (keepalives_idle, _interval, _count): a client blocked on a server that vanished gets an error
after about 60 s instead of the kernel's two hours."""

_engines: dict[tuple[str, int], sa.Engine] = {}
_engines_lock = threading.Lock()


def resolve_database_url(settings: Settings) -> str:
    """The variable's URL when it is set, else the embedded server's (this repository's location only: in a team's
    project no URL is a ConfigError naming the declaration's `database_url`)."""
    if settings.database_url is None:
        if not settings.embedded_allowed:
            raise ConfigError(f"no database: set {DATABASE_URL_VAR}, or a declaration's database_url",
                              field="database_url")
        from batch_assets.db import embedded

        return embedded.ensure_running(settings.home)
    return normalize_url(settings.database_url)


def normalize_url(url: str, *, field: str = DATABASE_URL_VAR) -> str:
    """Check a URL names PostgreSQL and use psycopg 3 as the driver (a ConfigError naming `field`, the variable or
    the attribute the URL came from; the message never repeats the URL)."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy.exc.ArgumentError and friends
        raise ConfigError(f"not a valid database URL ({type(exc).__name__})", field=field) from None
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError(f"must be a PostgreSQL URL, got backend {parsed.get_backend_name()!r}", field=field)
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def describe_target(url: str | sa.URL) -> str:
    """Host/socket and database of a URL, without the password."""
    parsed = make_url(url) if isinstance(url, str) else url
    host = parsed.host or parsed.query.get("host") or "localhost"
    if isinstance(host, tuple):
        host = host[0]
    port = f":{parsed.port}" if parsed.port else ""
    return f"{host}{port}/{parsed.database or ''}"


def run_application_name(run_id: str | None) -> str:
    """The `application_name` of the connections opened for run `run_id` (None: outside a run)."""
    return f"{RUN_APPLICATION_PREFIX}{run_id}"[:63] if run_id else APPLICATION_NAME


def create_engine(
    url: str,
    *,
    pool_size: int = DEFAULT_POOL_SIZE,
    max_overflow: int = DEFAULT_MAX_OVERFLOW,
    application_name: str = APPLICATION_NAME,
) -> sa.Engine:
    """A new engine; prefer `get_engine` so a process holds one per URL. Its connections carry the idle-in-transaction
    timeout and TCP keepalives above."""
    return sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        connect_args={"connect_timeout": 10, "application_name": application_name, **session_args(url)},
    )


def session_args(url: str | sa.URL) -> dict[str, object]:
    """libpq keepalives and the server-side session settings; `options` given in the URL are kept, ours appended."""
    idle, interval, count = CLIENT_KEEPALIVE_S
    s_idle, s_interval, s_count = SERVER_KEEPALIVE_S
    ours = (f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_S * 1000} "
            f"-c tcp_keepalives_idle={s_idle} -c tcp_keepalives_interval={s_interval} "
            f"-c tcp_keepalives_count={s_count}")
    given = make_url(url).query.get("options")
    options = " ".join([*([given] if isinstance(given, str) else list(given or ())), ours])
    return {"keepalives": 1, "keepalives_idle": idle, "keepalives_interval": interval, "keepalives_count": count,
            "options": options}


def session_conninfo(engine: sa.Engine, *, options: str = "") -> str:
    """A libpq conninfo for a connection opened with psycopg directly, outside the engines (the queue worker's claim,
    listener and side connections): the server, database and credentials as the engine's dialect reads them from its
    URL, with the keepalives and session settings every pooled connection has (`session_args`) and `options` appended
    to the server settings. A keyword given to `psycopg.connect` beside a conninfo replaces the conninfo's own, so the
    settings go into the conninfo and the caller passes no `options` of its own."""
    _args, params = engine.dialect.create_connect_args(engine.url)
    params.pop("context", None)  # the dialect's type adapters: not a libpq parameter
    params.update(session_args(engine.url))
    if options:
        params["options"] = f"{params['options']} {options}"
    return psycopg.conninfo.make_conninfo("", **params)


def dedicated_engine(engine: sa.Engine, *, statement_s: float, lock_s: float) -> sa.Engine:
    """An engine beside `engine` with a pool of its own (same server, database and connect arguments), in autocommit,
    with a session statement_timeout and lock_timeout: for work that must never wait for a connection the pool's
    users hold, nor hold a row lock between two round trips (a lease renewal is one autocommit statement), nor wait
    for a lock longer than `lock_s`. The caller uses one connection at a time and disposes it."""
    dedicated = sa.create_engine(engine.url, pool=engine.pool.recreate(), isolation_level="AUTOCOMMIT")
    timeouts = local_timeouts(statement_s, lock_s)

    @sa.event.listens_for(dedicated, "connect")
    def _set_timeouts(dbapi_connection: psycopg.Connection[TupleRow], _record: object) -> None:
        with dbapi_connection.cursor() as cur:
            cur.execute(SESSION_TIMEOUTS_SQL, (timeouts["statement_timeout"], timeouts["lock_timeout"]))
        if not dbapi_connection.autocommit:
            dbapi_connection.commit()  # a session setting made in a transaction that is rolled back is undone

    return dedicated


def get_engine(url: str, *, pool_size: int = DEFAULT_POOL_SIZE) -> sa.Engine:
    """The process's engine for `url` (created on first use)."""
    key = (url, pool_size)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = create_engine(url, pool_size=pool_size)
        return engine


def connected_engine(settings: Settings) -> sa.Engine:
    """The process's engine for the configured database, after checking it answers (one-line error if not)."""
    engine = get_engine(resolve_database_url(settings))
    check_connection(engine)
    return engine


@contextmanager
def one_off_engine(settings: Settings) -> Iterator[sa.Engine]:
    """A one-connection engine for a short piece of work outside a run (reading a run's summary, giving
    back a failed run's lock), disposed afterwards so nothing lingers in the calling process."""
    engine = create_engine(resolve_database_url(settings), pool_size=1, max_overflow=0)
    try:
        yield engine
    finally:
        engine.dispose()


def dispose_engines() -> None:
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def driver_connection(raw: PoolProxiedConnection) -> psycopg.Connection[TupleRow]:
    """The psycopg connection under a pooled one (COPY, LISTEN/NOTIFY); every engine here uses psycopg 3."""
    driver = raw.driver_connection  # typed `Any | None` by SQLAlchemy: None once the connection is closed
    if not isinstance(driver, psycopg.Connection):
        raise TypeError(f"expected an open psycopg connection, got {type(driver).__name__}")
    return driver


def unavailable(url: str | sa.URL, exc: BaseException) -> DatabaseUnavailable:
    """Translate a driver error into a one-line `DatabaseUnavailable`."""
    return DatabaseUnavailable(f"cannot reach database at {describe_target(url)}: {cause_line(exc)}")


def check_connection(engine: sa.Engine) -> None:
    """Raise `DatabaseUnavailable` unless a trivial query succeeds."""
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
        raise unavailable(engine.url, exc) from None


@contextmanager
def translate_errors(engine: sa.Engine) -> Iterator[None]:
    """Turn connection-level driver errors into `DatabaseUnavailable`, and a missing grant into `PermissionDenied`."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        translated = translated_error(engine.url, exc)
        if translated is exc:
            raise
        raise translated from None


def translated_error(url: str | sa.URL, exc: BaseException) -> BaseException:
    """`exc` as `translate_errors` raises it: a one-line `DatabaseUnavailable` when it is about reachability, a
    `PermissionDenied` (exit 2, naming the object) when the role lacks a grant, else `exc` itself."""
    if is_insufficient_privilege(exc):
        return permission_denied(exc)
    if not isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
        return exc
    if isinstance(exc, sa.exc.OperationalError) and _is_query_error(exc):
        return exc
    return unavailable(url, exc)


def _is_query_error(exc: sa.exc.OperationalError) -> bool:
    # Timeouts and lock-timeouts are per-statement failures, not reachability.
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None) or ""
    return sqlstate.startswith("57014") or sqlstate == "55P03" or sqlstate.startswith("40")


# SQLSTATE classes of failures that say nothing about the statement or the row: the connection or
# the server went away, is restarting or overloaded, or the statement hit a timeout, a lock timeout,
# a deadlock or a serialization conflict. Retrying the same transaction later can succeed.
TRANSIENT_SQLSTATE_CLASSES = ("08", "53", "57", "40", "58")
TRANSIENT_SQLSTATES = frozenset({"55P03", "25P03", "25006"})


def is_transient(exc: BaseException) -> bool:
    """True for a failure of the connection, the server or a timeout; False for one caused by the statement's data
    or by the code.

    Transient: connection loss and server restarts (whatever SQLAlchemy layer reports them:
    `OperationalError`, `InterfaceError`, a DBAPI error that invalidated the connection, a
    `DisconnectionError`, and the two states a connection is left in after one, see
    `_lost_connection_state`), `statement_timeout`, `lock_timeout`, deadlocks and
    `DatabaseUnavailable`. Not transient: a constraint violation, bad data, a trigger that raised for
    the row, and every programming error (bad SQL, a column a result does not have, a result used
    after it closed, a transaction misused): a retry would fail the same way.

    psycopg's own errors (code on a bare psycopg connection, such as the payment worker) are
    classified the same way: the classes SQLAlchemy would wrap as `OperationalError` /
    `InterfaceError` (connection lost, "the connection is closed", an aborted pipeline, a refused
    connection), plus the same SQLSTATEs.
    """
    if isinstance(exc, DatabaseUnavailable):
        return True
    if isinstance(exc, psycopg.Error):
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return True
        return _transient_sqlstate(exc.sqlstate)
    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
            return True
        return _transient_sqlstate(getattr(exc.orig, "sqlstate", None))
    return isinstance(exc, sa.exc.DisconnectionError) or _lost_connection_state(exc)


# SQLAlchemy's code of the PendingRollbackError a Connection raises when it was invalidated inside a
# transaction ("Can't reconnect until invalid transaction is rolled back").
_INVALIDATED_IN_TRANSACTION = "8s2b"
_CONNECTION_CLOSED = "This Connection is closed"


def _lost_connection_state(exc: BaseException) -> bool:
    """The state SQLAlchemy reports on a connection whose link died: invalidated inside a transaction, or closed.

    Every other `InvalidRequestError` (NoSuchColumnError, "This result object does not return rows",
    "This transaction is inactive", ...) is a programming error, which a retry cannot fix.
    """
    if isinstance(exc, sa.exc.PendingRollbackError):
        return exc.code == _INVALIDATED_IN_TRANSACTION
    if isinstance(exc, sa.exc.ResourceClosedError):
        return bool(exc.args) and str(exc.args[0]) == _CONNECTION_CLOSED
    return False


def _transient_sqlstate(sqlstate: str | None) -> bool:
    sqlstate = sqlstate or ""
    return sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES or sqlstate in TRANSIENT_SQLSTATES


# How many more connections a non-superuser client can open now.
FREE_CONNECTIONS_SQL = sa.text(
    """
    SELECT current_setting('max_connections')::int
         - current_setting('superuser_reserved_connections')::int
         - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')
    """
)


def free_connections(engine: sa.Engine) -> int:
    """Connections the server can still give a client (one-line DatabaseUnavailable if it does not answer)."""
    with translate_errors(engine), engine.connect() as conn:
        return int(conn.execute(FREE_CONNECTIONS_SQL).scalar_one())
