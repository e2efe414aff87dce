"""Dead runs (docs/production/operations.md): a STARTED run whose process died is marked failed, and gives back its
lock and lease.

Dagster's run monitoring (dagster.yaml `run_monitoring`) fails a run that never starts or never
finishes canceling, but in Dagster 1.13 the default run launcher cannot see a run worker die
(`supports_check_run_worker_health` is False), so a run whose worker was killed (kill -9, its host
lost, the daemon and its code server restarted) would stay STARTED for ever: the failure alert never
fires and the `batch_assets/kind: sweep` tag limit keeps counting it, so every sweep queues behind it.

The product's own heartbeats tell. Every guarded job renews its lease (ba_leases) every 10 s, and a
run that cannot renew stops writing before the lease lapses (locking.heartbeat). So a STARTED run is
judged dead (`dead_reason`) when

1. a lease or lock naming the run is held by a process of this host and pid namespace that no longer
   exists (locking.owner.provably_dead): at once;
2. no live lease names the run and one that does lapsed more than `LAPSE_GRACE_S` ago, after the run
   started: its heartbeats stopped (a run-level owner, whose ops run in several processes). Not while a step
   of the run waits for a slot of the application database's pool (`waiting_for_slot`): between its plan step
   and a range that waits, nothing of the run renews the lease, and a wait is not a death;
3. it holds nothing and its run worker is provably dead: the process named by the run's
   `batch_assets/process` tag (CLI runs) or by Dagster's "Started process for run (pid: N)" event of a
   worker launched by a code server on this host (daemon runs). A live lease or lock not provably dead
   always means alive, so ops that outlive their run worker finish first.

Such a run is reported failed (`instance.report_run_failed`, so `run_failure_alert_sensor` alerts), and
what it held is released at that moment (owner-filtered), so the queued runs start and the next run
resumes from the checkpoints instead of ending SKIPPED on a dead holder. Its slots in Dagster's pools
(budget.APP_DATABASE_POOL) are freed at that moment too (`free_pool_slots`): Dagster frees a step's slot when
the step ends, and the daemon frees a finished run's only after run_monitoring.free_slots_after_run_end_seconds,
so a killed run's slot would keep the next run's step waiting until then.

`dead_run_watchdog_sensor` does this every `WATCHDOG_INTERVAL_S`. It starts no runs, so like the
failure alert it is RUNNING whatever BATCH_ASSETS_AUTOMATION says (CLI runs die too). The bound:
rule 1 and 3 within one interval (30 s); rule 2 within lease TTL (60 s) + `LAPSE_GRACE_S` (15 s) + one
interval = 105 s after the last heartbeat; a run that never started is failed by run monitoring after
start_timeout_seconds (180 s) + its poll interval (30 s). All under the 5 minutes a dead run may take to be
failed (docs/production/operations.md).
"""

# No `from __future__ import annotations`: Dagster reads the sensor's resource annotation at runtime.

import json
import logging
import re
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import dagster as dg
import psutil
import sqlalchemy as sa
from dagster._core.storage.tags import GRPC_INFO_TAG

from batch_assets.errors import BatchAssetsError, error_text
from batch_assets.locking.lease import Lease
from batch_assets.locking.lock import make_job_lock
from batch_assets.locking.owner import make_owner, provably_dead
from batch_assets.orchestration.budget import APP_DATABASE_POOL
from batch_assets.orchestration.resources import DatabaseResource, JobLockResource

log = logging.getLogger(__name__)

WATCHDOG_INTERVAL_S = 30
LAPSE_GRACE_S = 15.0
"""A lease must have lapsed this long before its run is judged dead (a margin over clock and tick jitter)."""
PROCESS_TAG = "batch_assets/process"
"""On CLI runs: the owner string (locking.owner) of the process that executes the run."""

# HOLDINGS_SQL — the leases and job locks that name a run. :prefixes (text[]: '<run id>@' of the run and of its
# root run). `lapsed_s` is how long ago it expired (negative while live); `renewed_at` the epoch of its last
# renewal (leases: heartbeat_at; locks: locked_at). A lock kept for its lock-at-least-for time after a finished
# run ('#released') names no running process and is left out.
HOLDINGS_SQL = sa.text(
    """
    SELECT 'lease' AS kind, name, owner, extract(epoch FROM now() - expires_at)::float8 AS lapsed_s,
           extract(epoch FROM heartbeat_at)::float8 AS renewed_at
      FROM ba_leases
     WHERE split_part(owner, '@', 1) || '@' = ANY(:prefixes)
    UNION ALL
    SELECT 'lock', name, owner, extract(epoch FROM now() - lock_until)::float8, extract(epoch FROM locked_at)::float8
      FROM ba_job_locks
     WHERE split_part(owner, '@', 1) || '@' = ANY(:prefixes) AND owner NOT LIKE '%#released'
    """
)

_STARTED_PROCESS = re.compile(r"^Started process for run \(pid: (\d+)\)\.$")
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", ""})


@dataclass(frozen=True)
class Holding:
    """A lease or a job lock row naming a run."""

    kind: str
    name: str
    owner: str
    lapsed_s: float
    renewed_at: float

    @property
    def live(self) -> bool:
        return self.lapsed_s < 0


def cli_process_tags() -> dict[str, str]:
    """The tag a CLI launch puts on its run: the process that executes it (judged by rule 3 when it dies)."""
    return {PROCESS_TAG: make_owner("cli")}


def holdings(engine: sa.Engine, run: dg.DagsterRun) -> list[Holding]:
    prefixes = sorted({f"{run.run_id}@", f"{run.root_run_id or run.run_id}@"})
    with engine.connect() as conn:
        rows = conn.execute(HOLDINGS_SQL, {"prefixes": prefixes}).all()
    return [Holding(r.kind, r.name, r.owner, float(r.lapsed_s), float(r.renewed_at)) for r in rows]


def worker_gone(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str | None:
    """The run worker's process when this host can tell it is gone, else None (alive, or not judged from here)."""
    tagged = run.tags.get(PROCESS_TAG)
    if tagged:
        return tagged if provably_dead(tagged) else None
    grpc_info = run.tags.get(GRPC_INFO_TAG)
    if grpc_info is None or not _launched_here(grpc_info):
        return None
    records = instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT, limit=50
    ).records
    for record in records:
        match = _STARTED_PROCESS.match(record.event_log_entry.user_message or "")
        if match:
            pid = int(match[1])
            return f"pid {pid}" if _process_gone(pid, record.event_log_entry.timestamp) else None
    return None


def _launched_here(grpc_info: str) -> bool:
    """Whether the code server that launched the run (the run worker's parent) is on this host."""
    try:
        info = json.loads(grpc_info)
    except ValueError:
        return False
    host = str(info.get("host") or "")
    return host in _LOCAL_HOSTS or host == socket.gethostname()


def _process_gone(pid: int, seen_at: float) -> bool:
    """No process `pid` runs here, or it is a zombie, or it started after `seen_at` (the pid was reused)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return True
        return process.create_time() > seen_at + 1
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return True


def free_pool_slots(instance: dg.DagsterInstance, run_id: str) -> None:
    """Free every pool slot the run holds and drop its steps waiting for one (a run judged dead or refused). A
    storage without pools (supports_global_concurrency_limits) has none."""
    storage = instance.event_log_storage
    if storage.supports_global_concurrency_limits:
        storage.free_concurrency_slots_for_run(run_id)  # every pool, not only ours: the run is over


def waiting_for_slot(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """The run's steps waiting for a slot of APP_DATABASE_POOL (pending, no slot claimed yet)."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return []
    info = storage.get_concurrency_info(APP_DATABASE_POOL)
    holding = {slot.step_key for slot in info.claimed_slots if slot.run_id == run_id}
    return [step.step_key for step in info.pending_steps if step.run_id == run_id and step.step_key not in holding]


def dead_reason(run_start: float | None, held: Sequence[Holding], worker_gone: str | None,
                waiting: bool = False) -> str | None:
    """Why a STARTED run is dead, or None when it may be alive (rules 1-3 of the module docstring); `waiting`: a
    step of the run waits for a pool slot, so a lapsed lease alone (rule 2) does not make it dead."""
    for kind in ("lease", "lock"):
        of_kind = [h for h in held if h.kind == kind]
        live = [h for h in of_kind if h.live]
        if any(not provably_dead(h.owner) for h in live):
            return None
        if live:
            return f"its {kind} {live[0].name!r} is held by a process that is gone ({live[0].owner})"
        started = run_start or 0.0
        lapsed = [h for h in of_kind if h.lapsed_s > LAPSE_GRACE_S and h.renewed_at >= started - 1]
        if kind == "lease" and lapsed and not waiting:
            return f"its lease {lapsed[0].name!r} lapsed {lapsed[0].lapsed_s:.0f}s ago (no heartbeat)"
    if worker_gone is not None:
        return f"its run worker process is gone ({worker_gone})"
    return None


def release_holdings(engine: sa.Engine, held: Iterable[Holding], redis_url: str | None) -> None:
    """Give back a dead run's leases and locks (owner-filtered), so the next run takes them at once."""
    lock = make_job_lock(engine, redis_url)
    try:
        for holding in held:
            if holding.kind == "lease":
                Lease(engine, holding.name, holding.owner, 1).release()
            # The lock of a lease has the same name and owner (job_guard, run_guard), also in Redis.
            lock.release(holding.name, holding.owner, failed=True)
    finally:
        close = getattr(lock, "close", None)
        if close is not None:
            close()


def fail_if_dead(instance: dg.DagsterInstance, engine: sa.Engine, record: dg.RunRecord,
                 redis_url: str | None) -> str | None:
    """Judge one STARTED run; when dead, report it failed and release what it held. Returns the reason or None."""
    run = record.dagster_run
    if run.status != dg.DagsterRunStatus.STARTED:
        return None
    held = holdings(engine, run)
    reason = dead_reason(record.start_time, held, worker_gone(instance, run),
                         waiting=bool(held) and bool(waiting_for_slot(instance, run.run_id)))
    if reason is None:
        return None
    current = instance.get_run_by_id(run.run_id)
    if current is None or current.status != dg.DagsterRunStatus.STARTED:  # it ended meanwhile: nothing to do
        return None
    message = (f"batch_assets watchdog: run {run.run_id} of {run.job_name} is dead: {reason}. Marked failed so "
               "the runs queued behind it start; its lock and lease are released and the next run resumes.")
    log.error(message)
    instance.report_run_failed(current, message)
    release_holdings(engine, held, redis_url)
    free_pool_slots(instance, run.run_id)  # now, not after the daemon's free_slots_after_run_end_seconds
    return reason


def dead_run_watchdog(context: dg.SensorEvaluationContext, database: DatabaseResource, job_lock: JobLockResource,
                      job_names: frozenset[str]) -> dg.SkipReason:
    """One watchdog tick over every STARTED run of our jobs."""
    records = context.instance.get_run_records(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
    ours = [r for r in records if r.dagster_run.job_name in job_names]
    if not ours:
        return dg.SkipReason("no run in progress")
    failed: list[str] = []
    try:
        engine = database.get_engine()
        redis_url = job_lock.redis_url  # the lock store the jobs use: the same resource, never the environment
        for record in ours:
            reason = fail_if_dead(context.instance, engine, record, redis_url)
            if reason is not None:
                failed.append(f"{record.dagster_run.run_id}: {reason}")
    except (BatchAssetsError, sa.exc.SQLAlchemyError) as exc:
        # The database is down: leases cannot be read, so nothing is judged (the next tick tries again).
        return dg.SkipReason(f"leases unreadable, nothing judged: {error_text(exc)}")
    if failed:
        context.log.error("marked failed: " + "; ".join(failed))
        return dg.SkipReason(f"{len(failed)} dead run(s) marked failed: " + "; ".join(failed))
    return dg.SkipReason(f"{len(ours)} run(s) in progress, all alive ({time.strftime('%H:%M:%S')})")


def build_watchdog_sensor(job_names: Iterable[str]) -> dg.SensorDefinition:
    """The watchdog over `job_names`; RUNNING always: it starts no runs (BATCH_ASSETS_AUTOMATION does not stop it)."""
    names = frozenset(job_names)

    def evaluate(context: dg.SensorEvaluationContext, database: DatabaseResource,
                 job_lock: JobLockResource) -> dg.SkipReason:
        return dead_run_watchdog(context, database, job_lock, names)

    return dg.sensor(
        name="dead_run_watchdog_sensor",
        minimum_interval_seconds=WATCHDOG_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Marks failed a STARTED run whose process died (its lease lapsed, or its holder or run worker "
        "process is gone on this host) and gives back its lock and lease, so the queued runs start and the next "
        "run resumes. Starts no runs: always on.",
    )(evaluate)


__all__ = ["PROCESS_TAG", "Holding", "build_watchdog_sensor", "cli_process_tags", "dead_reason", "fail_if_dead",
           "free_pool_slots", "holdings", "release_holdings", "waiting_for_slot", "worker_gone"]
