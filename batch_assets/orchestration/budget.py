"""The connection budget of a run: what it really opens on the application database, checked before it starts.

The arithmetic (README, "Connection budget"; confirmed by tests/dagster/test_connection_budget.py, which counts a
run's backends in pg_stat_activity by its application_name, `batch_assets run <run id>`):

* a range step holds `workers + prefetch + side effect + heartbeat` connections (`SweepSettings.connections_needed`)
  plus one of its own bookkeeping (run history, checkpoint, lease): `range_step_connections`;
* a run of R ranges runs P = min(R, parallel) of them at once: `parallel` is 1 in-process (the CLI's default) and
  the multiprocess executor's `max_concurrent` (0 = the CPU count) otherwise; the plan and summary steps run
  before and after the ranges, so the run's peak is P x range_step_connections (`run_connections`);
* the other jobs may start while it runs: `OTHER_JOBS` connections stay free for them.

A run whose peak plus that reserve exceeds what the server has free (max_connections - superuser_reserved -
in use) is refused before it starts with one line giving the numbers (ConfigError naming `workers`, exit 2), so
it never exhausts the server: by `launch_job` (the CLI, library callers) and, for the runs the UI, schedules and
sensors submit, by the run coordinator (`coordinator.budget_refusal`: the run is FAILURE at once with that line).

Across runs, the steps that do a job's work on the application database (a sweep's ranges, a declared sweep's
ranges, the queue drains and workers, the expiry, the outbox relay, retention) are in one Dagster pool,
`APP_DATABASE_POOL`: at most `concurrency: pools: default_limit` of them run at once on the instance, whatever
launched them (CLI, UI, schedules, sensors), and a step over the limit waits for a slot. The limit is a count of
steps, chosen from what one step holds at the defaults (`pool_limit`, README "Connection budget"):

    server   max_connections 100 (PostgreSQL's default) - superuser_reserved_connections 3 = 97
    a step   at most 8: a range at the default workers 4 (4 + prefetch + side effect + heartbeat + bookkeeping);
             the others hold less (OTHER_JOBS: drain 6, relay 3, expiry 3, retention 2)
    pool     10 slots x 8 = 80, so 17 stay for what is outside the pool: the plan, summary and report steps and
             the checks (one connection each, for well under a second), sensors, the code server, psql.

A step with more workers than the default counts as one slot all the same: a run's own peak is still checked
against what the server has free, above. A server with another max_connections sets its own limit
(`dagster instance concurrency set batch_assets_app_db N`, or default_limit in the instance file).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from batch_assets.errors import ConfigError

STEP_BOOKKEEPING_CONNECTIONS = 1
"""A step's own connection besides its workers': run history, checkpoint, lease."""

OTHER_JOBS: Mapping[str, int] = {
    "payment drain": 6,  # its bookkeeping pool (4) + the worker's own claim and result connections (2)
    "outbox relay": 3,  # bookkeeping + claim/mark + the job guard's heartbeat
    "subscription expiry": 3,  # bookkeeping + batches + the job guard's heartbeat
    "retention": 2,
    "asset checks": 2,
}
"""Connections kept free for the jobs that may start while a sweep runs (their peaks at the default config)."""

OTHER_JOBS_CONNECTIONS = sum(OTHER_JOBS.values())

APP_DATABASE_POOL = "batch_assets_app_db"
"""The Dagster pool of the steps that work on the application database (`@op(pool=...)`)."""
SERVER_CONNECTIONS = 100 - 3
"""What the pool limit is chosen for: PostgreSQL's default max_connections minus superuser_reserved_connections."""
OUTSIDE_THE_POOL = 17
"""Connections kept for what is not in the pool (plan/summary/report steps, checks, sensors, code server, psql)."""
ALL_AT_ONCE = 1_000_000
"""`parallel` of an executor that may run every step at once (celery workers)."""


def range_step_connections(engine_settings: Any) -> int:
    """Backends one range step holds at most: the engine's connections_needed + its bookkeeping connection."""
    return int(engine_settings.connections_needed) + STEP_BOOKKEEPING_CONNECTIONS


def run_connections(engine_settings: Any, *, ranges: int, parallel: int) -> int:
    """Backends a run of `ranges` ranges holds at its peak when `parallel` steps may run at once."""
    return max(1, min(ranges, parallel)) * range_step_connections(engine_settings)


def parallel_steps(run_config: Mapping[str, Any] | None) -> int:
    """How many steps of a run execute at once under its executor config (in_process: 1)."""
    execution = ((run_config or {}).get("execution") or {}).get("config") or {}
    if "in_process" in execution:
        return 1
    if execution and "multiprocess" not in execution:
        return ALL_AT_ONCE  # celery and the like: every range may run at once, on as many workers
    multiprocess = execution.get("multiprocess") or {}  # also Dagster's default executor (multiprocess)
    return int(multiprocess.get("max_concurrent") or 0) or (os.cpu_count() or 1)


def check_run_budget(engine: sa.Engine, plan: Any, *, parallel: int) -> int:
    """Refuse (ConfigError naming `workers`, exit 2) a run whose peak, plus OTHER_JOBS, exceeds the server's free
    connections; returns the run's peak. A plan without an engine's SweepSettings (a single-op job) is within
    OTHER_JOBS already and passes."""
    from batch_assets.db.engine import free_connections

    engine_settings: Any = getattr(plan, "engine", None)
    if engine_settings is None or not hasattr(engine_settings, "connections_needed"):
        return 0
    ranges = int(getattr(plan, "ranges", 1) or 1)
    peak = run_connections(engine_settings, ranges=ranges, parallel=parallel)
    free = free_connections(engine)
    if peak + OTHER_JOBS_CONNECTIONS > free:
        at_once = max(1, min(ranges, parallel))
        raise ConfigError(
            f"a run needs {peak} connections ({at_once} range(s) at once x (workers {engine_settings.workers} + "
            f"prefetch + side effect + heartbeat + bookkeeping = {range_step_connections(engine_settings)})) and "
            f"{OTHER_JOBS_CONNECTIONS} stay free for the other jobs, but the server has {free} free "
            "(max_connections minus reserved and in use); lower --workers, --ranges or max_concurrent",
            field="workers",
        )
    return peak


def pool_limit(engine_settings: Any, *, server: int = SERVER_CONNECTIONS, outside: int = OUTSIDE_THE_POOL) -> int:
    """Slots of APP_DATABASE_POOL for a server of `server` usable connections when a step holds what a range step
    of `engine_settings` holds (the largest member at the defaults): the instance files' default_limit."""
    step = max(range_step_connections(engine_settings), *OTHER_JOBS.values())
    return max(1, (server - outside) // step)
