"""`batch-assets db migrate | url | stop`."""

from __future__ import annotations

import argparse
from typing import Any

from batch_assets.cli.output import emit, err
from batch_assets.db.engine import connected_engine
from batch_assets.errors import (
    EXIT_OK,
    ConfigError,
)
from batch_assets.settings import Settings


def cmd_db_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.db.migrate import applied_migrations, applied_versions, migrate
    from batch_assets.orchestration.project import current, install_queues

    project = current()
    applied: list[Any] = []
    queues: list[str] = []
    recorded: list[Any] = []
    sets: dict[str, list[int]] = {}
    for engine, declarations in databases(project, settings):
        # The code location's own database gets its migration sets (the library's first, then the reference
        # project's in this repository); a database only declarations name gets the library's own objects.
        migration_sets = project.migrations if None in declarations else ()
        # Every declared queue's table holds the queue's columns, or exit 2 naming the file and the column, before
        # anything is written; then the migrations, then each queue's trigger and indexes.
        project.checked_queues(engine, only=declarations - {None})
        done = migrate(engine, migration_sets)
        for m in done:
            err(f"applied migration {m.label}")
        applied.extend(done)
        stores = project.checked_queues(engine, only=declarations)
        queues.extend(install_queues(engine, stores))
        with engine.connect() as conn:
            recorded = applied_migrations(conn, migration_sets)
        sets = applied_versions(engine, migration_sets)
    # applied / applied_names: what this call applied; schema_versions: every file the database has had, both as
    # labels (`reference/0001_tables`); sets: each set's versions.
    emit({"status": "SUCCESS", "applied": [m.label for m in applied], "applied_names": [m.label for m in applied],
          "schema_versions": [m.label for m in recorded], "sets": sets, "queues": queues})
    return EXIT_OK


def databases(project: Any, settings: Settings) -> list[tuple[Any, set[Any]]]:
    """Each database the code location's jobs use, with the declarations (files; None for the location's own jobs
    and queues) that live there: the location's own, and each declaration's `database_url`. A team's project whose
    declarations all name their database needs no BATCH_ASSETS_DATABASE_URL."""
    from batch_assets.cli.common import engine_of

    groups: dict[str, tuple[Any, set[Any]]] = {}

    def add(engine: Any, path: Any) -> None:
        # Keyed by the whole URL, in memory only (never printed).
        groups.setdefault(engine.url.render_as_string(hide_password=False), (engine, set()))[1].add(path)

    if not project.is_team:
        add(connected_engine(settings), None)
    for loaded in project.declarations().components:
        add(engine_of(loaded.component, settings), loaded.path)
    if not groups:  # a project without declarations still gets the library's own objects
        add(connected_engine(settings), None)
    return list(groups.values())


def cmd_db_url(args: argparse.Namespace, settings: Settings) -> int:
    from sqlalchemy.engine import make_url

    from batch_assets.db.engine import resolve_database_url

    url = make_url(resolve_database_url(settings))
    print(url.render_as_string(hide_password=bool(url.password) and not args.show_password))
    return EXIT_OK


def cmd_db_stop(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.db import embedded

    if not settings.embedded:
        raise ConfigError("only the embedded server can be stopped; BATCH_ASSETS_DATABASE_URL is set")
    was_running = embedded.stop(settings.home)
    err("embedded PostgreSQL stopped" if was_running else "embedded PostgreSQL was not running")
    return EXIT_OK



def register(sub: Any) -> None:
    """db migrate | url | stop"""
    db = sub.add_parser("db", help="database: migrate, url, stop").add_subparsers(dest="db_command", required=True)
    db.add_parser("migrate", help="create or upgrade every table, index and trigger").set_defaults(func=cmd_db_migrate)
    url = db.add_parser("url", help="print the database URL (password hidden)")
    url.add_argument("--show-password", action="store_true")
    url.set_defaults(func=cmd_db_url)
    db.add_parser("stop", help="stop the embedded PostgreSQL").set_defaults(func=cmd_db_stop)
