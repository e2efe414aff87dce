"""batch_assets: fast, safe "recompute something for every row" sweeps and PostgreSQL task queues, on Dagster.

This module is the public API: every name below, and nothing under it, is what a user imports (docs/reference/api.md
describes each group). Names are imported on first use, so `import batch_assets` stays cheap: a team's function that
imports `RowFailure` loads no Dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_PUBLIC: dict[str, tuple[str, str]] = {
    # Declarations (a defs.yaml) and what a team's function raises
    "SweepComponent": ("batch_assets.orchestration.components.sweep_component", "SweepComponent"),
    "TableQueueComponent": ("batch_assets.orchestration.components.table_queue", "TableQueueComponent"),
    "RowFailure": ("batch_assets.errors", "RowFailure"),
    "PermanentFailure": ("batch_assets.errors", "PermanentFailure"),
    "RetryAfter": ("batch_assets.errors", "RetryAfter"),
    # Errors
    "BatchAssetsError": ("batch_assets.errors", "BatchAssetsError"),
    "ConfigError": ("batch_assets.errors", "ConfigError"),
    "DecryptError": ("batch_assets.errors", "DecryptError"),
    "LeaseLost": ("batch_assets.errors", "LeaseLost"),
    "LockNotAcquired": ("batch_assets.errors", "LockNotAcquired"),
    "error_text": ("batch_assets.errors", "error_text"),
    "first_line": ("batch_assets.errors", "first_line"),
    # Settings
    "Settings": ("batch_assets.settings", "Settings"),
    "load_settings": ("batch_assets.settings", "load_settings"),
    "SettingsModel": ("batch_assets.settings_model", "SettingsModel"),
    "DatedSettings": ("batch_assets.settings_model", "DatedSettings"),
    "bounds": ("batch_assets.settings_model", "bounds"),
    "ENCRYPTION_KEY_VAR": ("batch_assets.settings", "ENCRYPTION_KEY_VAR"),
    "LIMITS_URL_VAR": ("batch_assets.settings", "LIMITS_URL_VAR"),
    "load_function": ("batch_assets.plugins", "load_function"),
    # A sweep in Python: the engine's plug-in API and its runner
    "Sweep": ("batch_assets.engine.definition", "Sweep"),
    "Reader": ("batch_assets.engine.definition", "Reader"),
    "SqlReader": ("batch_assets.engine.definition", "SqlReader"),
    "RowOutcome": ("batch_assets.engine.definition", "RowOutcome"),
    "UNCHANGED": ("batch_assets.engine.definition", "UNCHANGED"),
    "WriteCounts": ("batch_assets.engine.definition", "WriteCounts"),
    "WriteFailures": ("batch_assets.engine.definition", "WriteFailures"),
    "CursorRange": ("batch_assets.engine.ranges", "CursorRange"),
    "even_split": ("batch_assets.engine.ranges", "even_split"),
    "RunContext": ("batch_assets.engine.definition", "RunContext"),
    "SweepSettings": ("batch_assets.engine.settings", "SweepSettings"),
    "MAX_PAGE_SIZE": ("batch_assets.engine.settings", "MAX_PAGE_SIZE"),
    "check_page_size": ("batch_assets.engine.definition", "check_page_size"),
    "SweepResult": ("batch_assets.engine.result", "SweepResult"),
    "run_sweep": ("batch_assets.engine.runner", "run_sweep"),
    "ProgressCallback": ("batch_assets.engine.runner", "ProgressCallback"),
    "CheckpointStoreLike": ("batch_assets.engine.definition", "CheckpointStoreLike"),
    "RunGuardLike": ("batch_assets.engine.definition", "RunGuardLike"),
    "SUCCESS": ("batch_assets.engine.result", "SUCCESS"),
    "SKIPPED": ("batch_assets.engine.result", "SKIPPED"),
    "MISSING_DATA": ("batch_assets.engine.result", "MISSING_DATA"),
    "INVALID_VALUE": ("batch_assets.engine.result", "INVALID_VALUE"),
    "DECRYPT_FAILURE": ("batch_assets.engine.result", "DECRYPT_FAILURE"),
    "STOP": ("batch_assets.shutdown", "STOP"),
    # Locks and leases
    "JobLock": ("batch_assets.locking.lock", "JobLock"),
    "PostgresJobLock": ("batch_assets.locking.lock", "PostgresJobLock"),
    "RunGuard": ("batch_assets.locking.guard", "RunGuard"),
    "job_guard": ("batch_assets.locking.guard", "job_guard"),
    # A queue in Python
    "QueueDeclaration": ("batch_assets.queue.declaration", "QueueDeclaration"),
    "Backoff": ("batch_assets.queue.declaration", "Backoff"),
    "QueueSpec": ("batch_assets.queue.spec", "QueueSpec"),
    "QueueStore": ("batch_assets.queue.store", "QueueStore"),
    "QueueSettings": ("batch_assets.queue.settings", "QueueSettings"),
    "Handler": ("batch_assets.queue.handler", "Handler"),
    "KwargsHandler": ("batch_assets.queue.handler", "KwargsHandler"),
    "handler_factory": ("batch_assets.queue.declaration", "handler_factory"),
    "Outcome": ("batch_assets.queue.handler", "Outcome"),
    "Claim": ("batch_assets.queue.claims", "Claim"),
    "Refusal": ("batch_assets.queue.executor", "Refusal"),
    "ReplayCount": ("batch_assets.queue.store", "ReplayCount"),
    "STATUSES": ("batch_assets.queue.store", "STATUSES"),
    "QueueResult": ("batch_assets.queue.result", "QueueResult"),
    "BREAKER_CODES": ("batch_assets.queue.breaker", "BREAKER_CODES"),
    "run_queue_worker": ("batch_assets.queue.worker", "run_worker"),
    # The database
    "MigrationSet": ("batch_assets.db.migrate", "MigrationSet"),
    "driver_connection": ("batch_assets.db.engine", "driver_connection"),
    "is_transient": ("batch_assets.db.engine", "is_transient"),
    "translated_error": ("batch_assets.db.engine", "translated_error"),
    "Privilege": ("batch_assets.db.privileges", "Privilege"),
    "table_privileges": ("batch_assets.db.privileges", "table"),
    "GUARDED_PRIVILEGES": ("batch_assets.db.privileges", "GUARDED"),
    # Dagster: the job builders and a code location
    "SweepJob": ("batch_assets.orchestration.sweep_job", "SweepJob"),
    "SweepNames": ("batch_assets.orchestration.sweep_job", "SweepNames"),
    "SweepSchedule": ("batch_assets.orchestration.sweep_job", "SweepSchedule"),
    "ExtraAsset": ("batch_assets.orchestration.sweep_job", "ExtraAsset"),
    "ResourceKeys": ("batch_assets.orchestration.sweep_job", "ResourceKeys"),
    "PrepareContext": ("batch_assets.orchestration.sweep_job", "PrepareContext"),
    "Prepared": ("batch_assets.orchestration.sweep_job", "Prepared"),
    "build_sweep_job": ("batch_assets.orchestration.sweep_job", "build_sweep_job"),
    "asset_job_run_config": ("batch_assets.orchestration.sweep_job", "asset_job_run_config"),
    "QueueJob": ("batch_assets.orchestration.queue_job", "QueueJob"),
    "QueueWorkConfig": ("batch_assets.orchestration.queue_job", "QueueWorkConfig"),
    "build_queue_job": ("batch_assets.orchestration.queue_job", "build_queue_job"),
    "JobSpec": ("batch_assets.orchestration.spec", "JobSpec"),
    "Project": ("batch_assets.orchestration.project", "Project"),
    "LIBRARY_JOB_MODULES": ("batch_assets.orchestration.project", "LIBRARY_JOB_MODULES"),
    "REPOSITORY": ("batch_assets.orchestration.defaults", "REPOSITORY"),
    "load_declarations": ("batch_assets.orchestration.components.loader", "load_declarations"),
    "celery_on_redis_executor": ("batch_assets.orchestration.celery", "celery_on_redis_executor"),
    # Dagster: resources
    "DatabaseResource": ("batch_assets.orchestration.resources", "DatabaseResource"),
    "JobLockResource": ("batch_assets.orchestration.resources", "JobLockResource"),
    "AlertsResource": ("batch_assets.orchestration.resources", "AlertsResource"),
    "CalendarResource": ("batch_assets.orchestration.resources", "CalendarResource"),
    "env_if_set": ("batch_assets.orchestration.resources", "env_if_set"),
    "APP_DATABASE_POOL": ("batch_assets.orchestration.budget", "APP_DATABASE_POOL"),
    # Dagster: what a job's ops share
    "config_class": ("batch_assets.orchestration.config", "config_class"),
    "config_of": ("batch_assets.orchestration.ops", "config_of"),
    "config_schema_of": ("batch_assets.orchestration.ops", "config_schema_of"),
    "validated_plan": ("batch_assets.orchestration.ops", "validated_plan"),
    "resolve_run_date": ("batch_assets.orchestration.ops", "resolve_run_date"),
    "empty_summary": ("batch_assets.orchestration.ops", "empty_summary"),
    "finish": ("batch_assets.orchestration.ops", "finish"),
    "stop_on_interrupt": ("batch_assets.orchestration.ops", "stop_on_interrupt"),
    "utcnow": ("batch_assets.orchestration.ops", "utcnow"),
    "OpProgress": ("batch_assets.orchestration.progress", "OpProgress"),
    "latest_run_summary": ("batch_assets.run_history", "latest"),
    "fail_if_dead": ("batch_assets.orchestration.watchdog", "fail_if_dead"),
    "IN_PROGRESS": ("batch_assets.orchestration.automation", "IN_PROGRESS"),
    "schedule_timezone": ("batch_assets.orchestration.automation", "schedule_timezone"),
    "tick_date": ("batch_assets.orchestration.automation", "tick_date"),
    # Dagster: metadata
    "observable_table": ("batch_assets.orchestration.metadata", "observable_table"),
    "counts_table": ("batch_assets.orchestration.metadata", "counts_table"),
    "records_table": ("batch_assets.orchestration.metadata", "records_table"),
    "markdown_table": ("batch_assets.orchestration.metadata", "markdown_table"),
    "run_numbers": ("batch_assets.orchestration.metadata", "run_numbers"),
}
"""Public name → (module, name in that module)."""

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'batch_assets' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # what type checkers see: the same names, imported eagerly
    from batch_assets.db.engine import driver_connection, is_transient, translated_error
    from batch_assets.db.migrate import MigrationSet
    from batch_assets.db.privileges import GUARDED as GUARDED_PRIVILEGES
    from batch_assets.db.privileges import Privilege
    from batch_assets.db.privileges import table as table_privileges
    from batch_assets.engine.definition import (
        UNCHANGED,
        CheckpointStoreLike,
        Reader,
        RowOutcome,
        RunContext,
        RunGuardLike,
        SqlReader,
        Sweep,
        WriteCounts,
        WriteFailures,
        check_page_size,
    )
    from batch_assets.engine.ranges import CursorRange, even_split
    from batch_assets.engine.result import DECRYPT_FAILURE, INVALID_VALUE, MISSING_DATA, SKIPPED, SUCCESS, SweepResult
    from batch_assets.engine.runner import ProgressCallback, run_sweep
    from batch_assets.engine.settings import MAX_PAGE_SIZE, SweepSettings
    from batch_assets.errors import (
        BatchAssetsError,
        ConfigError,
        DecryptError,
        LeaseLost,
        LockNotAcquired,
        PermanentFailure,
        RetryAfter,
        RowFailure,
        error_text,
        first_line,
    )
    from batch_assets.locking.guard import RunGuard, job_guard
    from batch_assets.locking.lock import JobLock, PostgresJobLock
    from batch_assets.orchestration.automation import IN_PROGRESS, schedule_timezone, tick_date
    from batch_assets.orchestration.budget import APP_DATABASE_POOL
    from batch_assets.orchestration.celery import celery_on_redis_executor
    from batch_assets.orchestration.components.loader import load_declarations
    from batch_assets.orchestration.components.sweep_component import SweepComponent
    from batch_assets.orchestration.components.table_queue import TableQueueComponent
    from batch_assets.orchestration.config import config_class
    from batch_assets.orchestration.defaults import REPOSITORY
    from batch_assets.orchestration.metadata import (
        counts_table,
        markdown_table,
        observable_table,
        records_table,
        run_numbers,
    )
    from batch_assets.orchestration.ops import (
        config_of,
        config_schema_of,
        empty_summary,
        finish,
        resolve_run_date,
        stop_on_interrupt,
        utcnow,
        validated_plan,
    )
    from batch_assets.orchestration.progress import OpProgress
    from batch_assets.orchestration.project import LIBRARY_JOB_MODULES, Project
    from batch_assets.orchestration.queue_job import QueueJob, QueueWorkConfig, build_queue_job
    from batch_assets.orchestration.resources import (
        AlertsResource,
        CalendarResource,
        DatabaseResource,
        JobLockResource,
        env_if_set,
    )
    from batch_assets.orchestration.spec import JobSpec
    from batch_assets.orchestration.sweep_job import (
        ExtraAsset,
        PrepareContext,
        Prepared,
        ResourceKeys,
        SweepJob,
        SweepNames,
        SweepSchedule,
        asset_job_run_config,
        build_sweep_job,
    )
    from batch_assets.orchestration.watchdog import fail_if_dead
    from batch_assets.plugins import load_function
    from batch_assets.queue.breaker import BREAKER_CODES
    from batch_assets.queue.claims import Claim
    from batch_assets.queue.declaration import Backoff, QueueDeclaration, handler_factory
    from batch_assets.queue.executor import Refusal
    from batch_assets.queue.handler import Handler, KwargsHandler, Outcome
    from batch_assets.queue.result import QueueResult
    from batch_assets.queue.settings import QueueSettings
    from batch_assets.queue.spec import QueueSpec
    from batch_assets.queue.store import STATUSES, QueueStore, ReplayCount
    from batch_assets.queue.worker import run_worker as run_queue_worker
    from batch_assets.run_history import latest as latest_run_summary
    from batch_assets.settings import ENCRYPTION_KEY_VAR, LIMITS_URL_VAR, Settings, load_settings
    from batch_assets.settings_model import DatedSettings, SettingsModel, bounds
    from batch_assets.shutdown import STOP
