"""The Dagster instance directory of batch_assets and its dagster.yaml, without importing Dagster.

Every `batch-assets` command (DAGSTER_HOME, docs/production/index.md) calls
`write_instance_config` first, so that following the README literally (`db migrate` in a fresh
DAGSTER_HOME) leaves the instance file the webserver and the daemon then read: PostgreSQL storage
when BATCH_ASSETS_DAGSTER_PG_URL is set, the run limits, run monitoring, telemetry and the
onboarding dialog off. Kept free of Dagster so `rules show` or `queue stats` stay quick.

Also how a CLI launch writes the instance's SQLite files (`quick_commits`: no fsync per event) and what it
leaves out of the storage's imports (`no_template_highlighting`), both for start-up.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from batch_assets.errors import ConfigError
from batch_assets.extras import installed, missing_extra_error
from batch_assets.settings import DAGSTER_PG_URL_VAR, Settings

SQLITE_TEMPLATE = "dagster.yaml"
POSTGRES_TEMPLATE = "dagster.postgres.yaml"
TEMPLATES = (SQLITE_TEMPLATE, POSTGRES_TEMPLATE)
"""The instance files of batch_assets, package data in `orchestration/templates/` (installed with the wheel)."""


def instance_template(name: str) -> bytes:
    """The instance file `name` (one of TEMPLATES) as the package ships it."""
    if name not in TEMPLATES:
        raise ValueError(f"no instance template {name!r}")
    return (resources.files("batch_assets.orchestration") / "templates" / name).read_bytes()


def repo_root() -> Path:
    """This checkout, when the package is installed editable: where workspace.yaml lives. Nothing the installed
    package needs at run time is read from here."""
    return Path(__file__).resolve().parents[2]  # .../batch_assets/orchestration/instance_home.py; not via
    # `import batch_assets`, whose __init__ exports the whole public API


def write_instance_config(settings: Settings) -> Path:
    """The Dagster instance directory, given our dagster.yaml when it has none; sets DAGSTER_HOME for this process.

    The file is written when missing, or switched when it is our other template verbatim (the storage
    choice changed); a dagster.yaml someone edited is left alone. A directory that cannot be written is
    a ConfigError naming DAGSTER_HOME.
    """
    configured = os.environ.get("DAGSTER_HOME", "").strip()
    home = Path(configured).expanduser().resolve() if configured else settings.dagster_home
    wanted = POSTGRES_TEMPLATE if os.environ.get(DAGSTER_PG_URL_VAR, "").strip() else SQLITE_TEMPLATE
    other = SQLITE_TEMPLATE if wanted == POSTGRES_TEMPLATE else POSTGRES_TEMPLATE
    target = home / "dagster.yaml"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_bytes() == instance_template(other):
            if wanted == POSTGRES_TEMPLATE and not installed("dagster_postgres"):  # the instance could not load
                raise missing_extra_error("dagster_postgres")
            target.write_bytes(instance_template(wanted))
    except OSError as exc:
        raise ConfigError(f"cannot write the Dagster instance file {target}: {exc.strerror}",
                          field="DAGSTER_HOME") from None
    os.environ["DAGSTER_HOME"] = str(home)
    return home


# --- how a CLI launch writes the instance's SQLite files (start-up) -----------------------------------

_ANCHORS: dict[str, sqlite3.Connection] = {}
"""One idle connection per SQLite file of the instance this process wrote while a launch ran (see quick_commits)."""
_ANCHOR_LOCK = threading.Lock()
_LAUNCHES = [0]
"""How many `quick_commits` blocks are open in this process (anchors are kept while one is)."""
_LISTENING = [False]


@contextmanager
def quick_commits() -> Iterator[None]:
    """While a CLI launch runs: the Dagster instance's SQLite files (runs.db, the run's event-log shard, index.db)
    are written without an fsync and a WAL checkpoint per event.

    Dagster's SQLite storage opens a new connection for every event it stores (NullPool) and closes it after the
    commit; the last connection to close checkpoints the write-ahead log into the database file, with an fsync,
    and the commit itself fsyncs at SQLite's default `synchronous=FULL`. A CLI delta with nothing due stores about
    35 events, and each paid that: 20-35 ms apiece on this (shared) machine's disk, most of the run's own wall.
    Here every SQLite connection this process opens gets `synchronous=NORMAL`, which the SQLite manual gives as
    the setting for WAL mode (no fsync at commit; the database cannot be corrupted by a crash or a power loss, the
    last commits before a power loss may be lost), and the process keeps one idle connection open to each file,
    so closing Dagster's own is never the last close: the checkpoint happens once, when the block ends. The idle
    connection holds no lock and no transaction. PostgreSQL storage (production) is not touched, nor the files'
    settings for the webserver and the daemon (a pragma lasts for its connection).
    """
    import sqlalchemy as sa

    with _ANCHOR_LOCK:
        if not _LISTENING[0]:
            sa.event.listen(sa.engine.Engine, "connect", _on_connect)  # every engine's pool, Dagster's included
            _LISTENING[0] = True
        _LAUNCHES[0] += 1
    try:
        yield
    finally:
        with _ANCHOR_LOCK:
            _LAUNCHES[0] -= 1
            if _LAUNCHES[0] == 0:
                for anchor in _ANCHORS.values():
                    anchor.close()  # the last close: SQLite checkpoints the WAL into the file, once per file
                _ANCHORS.clear()


def _on_connect(dbapi_connection: object, _record: object) -> None:
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return
    with _ANCHOR_LOCK:
        if not _LAUNCHES[0]:
            return
        try:
            dbapi_connection.execute("PRAGMA synchronous=NORMAL")
            path = next((row[2] for row in dbapi_connection.execute("PRAGMA database_list") if row[1] == "main"), "")
            if not path:  # an in-memory database
                return
            anchor = _ANCHORS.get(path)
            if anchor is None:
                anchor = _ANCHORS[path] = sqlite3.connect(path, timeout=0, check_same_thread=False)
            # A read attaches the idle connection to the file's WAL (again on each connect: a new event-log shard
            # is switched to WAL by Dagster after its first connection). It ends at once: no snapshot is kept.
            anchor.execute("SELECT count(*) FROM sqlite_master").fetchall()
        except sqlite3.Error:  # best effort: a busy file is written the default way
            return


def no_template_highlighting() -> None:
    """Leave out Pygments, which Dagster's SQLite storage would import for nothing (start-up).

    The storage checks its schema with Alembic, Alembic imports Mako's exceptions module, and that module
    imports Pygments' lexers (a tenth of a second of CPU) to colour the HTML page of a template error if Pygments
    is installed (it is, for the dev tools). No template is rendered here: marking Mako's Pygments plugin as not
    importable makes Mako take its plain fallback. Only before Mako is imported, and only in this process.
    """
    if "mako.exceptions" not in sys.modules:
        sys.modules.setdefault("mako.ext.pygmentplugin", None)  # type: ignore[arg-type]


def reuse_alembic_scripts() -> None:
    """One Alembic script directory per configuration in this process, its revision map read once (start-up,
    start-up).

    Dagster's SQLite storage checks each file's schema revision with Alembic when it first opens it (runs.db,
    index.db, the new run's event-log shard, which it also stamps): each check builds a new `ScriptDirectory`
    from the same configuration (Dagster keeps one per storage) and reads every migration script of it again,
    about ninety files, five times in a CLI delta (a sixth of its CPU). The scripts are package files that do not
    change while the process runs, so the first directory built from a configuration object serves it from then
    on. Only in this process (the CLI's, or the launcher's and the commands it forks); idempotent.
    """
    from alembic.script import ScriptDirectory

    if getattr(ScriptDirectory.from_config, "batch_assets_reused", False):
        return
    build = ScriptDirectory.from_config.__func__  # type: ignore[attr-defined]
    built: dict[int, tuple[object, ScriptDirectory]] = {}

    def from_config(cls: type[ScriptDirectory], config: object) -> ScriptDirectory:
        hit = built.get(id(config))
        if hit is None or hit[0] is not config:
            hit = built[id(config)] = (config, build(cls, config))
        return hit[1]

    from_config.batch_assets_reused = True  # type: ignore[attr-defined]
    ScriptDirectory.from_config = classmethod(from_config)  # type: ignore[method-assign,assignment]


SQLITE_STORAGE_MODULES = (
    "dagster._core.storage.runs.sqlite.sqlite_run_storage",
    "dagster._core.storage.event_log.sqlite.sqlite_event_log",
    "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
)
"""The SQLite storages; each builds its Alembic configuration from its own file (`get_alembic_config(__file__)`)."""


def read_alembic_scripts() -> None:
    """Build the SQLite storages' script directories now (`reuse_alembic_scripts`): what the launcher does once
    for every command it forks (cli/launcher.py). Best effort, as `preload_instance_storage`."""
    import importlib

    reuse_alembic_scripts()
    try:
        from alembic.script import ScriptDirectory
        from dagster._core.storage.sql import get_alembic_config

        for module in SQLITE_STORAGE_MODULES:
            ScriptDirectory.from_config(get_alembic_config(importlib.import_module(module).__file__)).get_heads()
    except (ImportError, AttributeError, TypeError):
        return


INSTANCE_STORAGE_MODULES = (
    "dagster._core.storage.base_storage",  # the run, event-log and schedule storages' bases (and what they import)
    "dagster._core.storage.sql",  # Alembic, with which every SQL storage checks its schema
    "dagster._core.storage.sqlite_storage",  # the default storage of the instance file (dagster.yaml)
    "dagster._core.storage.local_compute_log_manager",
    "batch_assets.orchestration.compute_logs",  # the compute-log manager the instance files name
)
"""What `DagsterInstance.get()` imports when it builds the instance's storage (Dagster imports them lazily)."""


def preload_instance_storage() -> None:
    """Import the instance's storage modules now, while the CLI's collector is still paused (cli/startup.py):
    imported inside the launch, with collection on, they cost about a quarter more CPU. Best effort: a module a
    later Dagster moves is imported by the launch as usual."""
    import importlib

    for module in INSTANCE_STORAGE_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            continue
