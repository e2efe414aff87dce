"""The dead-run watchdog: a STARTED run whose process died is failed with the alert, and gives back lock and lease."""

from __future__ import annotations

import subprocess
import sys
import time

import dagster as dg
import pytest
import sqlalchemy as sa
from helpers import sensor_resources

from batch_assets.definitions import defs as load_defs
from batch_assets.locking.lease import Lease
from batch_assets.orchestration.budget import APP_DATABASE_POOL
from batch_assets.orchestration.watchdog import PROCESS_TAG
from batch_assets.reference.customer_status.dagster import SWEEP_JOB_KEY, customer_status_sweep_job
from batch_assets.reference.payments.dagster import payment_queue_drain_job
from batch_assets.settings import Settings

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

defs = load_defs()

# Rows as a run's heartbeats leave them: :name, :owner, :lease_in_s / :lock_in_s (negative: lapsed that long ago).
PUT_LEASE = sa.text(
    "INSERT INTO ba_leases (name, owner, acquired_at, heartbeat_at, expires_at) VALUES "
    "(:name, :owner, now() - interval '5 minutes', now() + make_interval(secs => :lease_in_s - 60), "
    " now() + make_interval(secs => :lease_in_s))"
)
PUT_LOCK = sa.text(
    "INSERT INTO ba_job_locks (name, owner, locked_at, lock_until, min_until) VALUES "
    "(:name, :owner, now() - interval '5 minutes', now() + make_interval(secs => :lock_in_s), now())"
)
HELD = sa.text("SELECT (SELECT count(*) FROM ba_leases) + (SELECT count(*) FROM ba_job_locks)")


def _tick(instance: dg.DagsterInstance, db_url: str) -> str:
    sensor = defs.resolve_sensor_def("dead_run_watchdog_sensor")
    with dg.build_sensor_context(instance=instance, resources=sensor_resources(db_url)) as context:
        result = sensor.evaluate_tick(context)
    assert result.run_requests == []
    return result.skip_message or ""


def _dead_owner(run_id: str) -> str:
    """The owner string a process of this host had, after that process exited (provably dead)."""
    code = f"from batch_assets.locking.owner import make_owner; print(make_owner({run_id!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


def _failure_message(instance: dg.DagsterInstance, run_id: str) -> str:
    [record] = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
    return record.event_log_entry.dagster_event.message or ""


def test_run_whose_lease_lapsed_is_failed_and_releases(dagster_env: Settings, engine: sa.Engine, db_url: str) -> None:
    """A STARTED sweep whose run-level lease lapsed 30 s ago is FAILURE at the next tick; lease and lock are gone."""
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(job_def=customer_status_sweep_job, status=dg.DagsterRunStatus.STARTED)
        owner = f"{run.run_id}@another-host:run"
        with engine.begin() as conn:
            conn.execute(PUT_LEASE, {"name": SWEEP_JOB_KEY, "owner": owner, "lease_in_s": -30.0})
            conn.execute(PUT_LOCK, {"name": SWEEP_JOB_KEY, "owner": owner, "lock_in_s": 30.0})  # lock TTL is longer
        message = _tick(instance, db_url)
        assert "1 dead run(s) marked failed" in message and "lapsed" in message
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
        assert "is dead: its lease 'customer_status_sweep' lapsed" in _failure_message(instance, run.run_id)
        with engine.connect() as conn:
            assert conn.execute(HELD).scalar_one() == 0
        # The next run takes the lock and lease at once instead of ending SKIPPED on the dead holder.
        assert Lease(engine, SWEEP_JOB_KEY, "next-run@h:run", 60).acquire()


def test_run_whose_holder_process_is_gone_is_failed_at_once(dagster_env: Settings, engine: sa.Engine,
                                                            db_url: str) -> None:
    """A STARTED run whose live lease names a process of this host that exited is FAILURE at once, lease released."""
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(job_def=customer_status_sweep_job, status=dg.DagsterRunStatus.STARTED)
        owner = _dead_owner(run.run_id)
        with engine.begin() as conn:
            conn.execute(PUT_LEASE, {"name": SWEEP_JOB_KEY, "owner": owner, "lease_in_s": 50.0})
            conn.execute(PUT_LOCK, {"name": SWEEP_JOB_KEY, "owner": owner, "lock_in_s": 110.0})
        assert "is held by a process that is gone" in _tick(instance, db_url)
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
        with engine.connect() as conn:
            assert conn.execute(HELD).scalar_one() == 0


def test_run_heartbeating_from_another_connection_stays_started(dagster_env: Settings, engine: sa.Engine,
                                                                db_url: str) -> None:
    """A run whose lease another connection keeps renewing (a run-level owner) is left alone, lease and lock kept."""
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(job_def=customer_status_sweep_job, status=dg.DagsterRunStatus.STARTED)
        owner = f"{run.run_id}@another-host:run"
        lease = Lease(engine, SWEEP_JOB_KEY, owner, 60)
        assert lease.acquire()
        with engine.begin() as conn:
            conn.execute(PUT_LOCK, {"name": SWEEP_JOB_KEY, "owner": owner, "lock_in_s": 110.0})
        for _ in range(3):
            assert lease.heartbeat()
            assert "all alive" in _tick(instance, db_url)
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
        with engine.connect() as conn:
            assert conn.execute(HELD).scalar_one() == 2


def test_run_waiting_for_a_pool_slot_is_not_dead_by_its_lapsed_lease(dagster_env: Settings, engine: sa.Engine,
                                                                      db_url: str) -> None:
    """A STARTED sweep whose range waits for a slot of the application database's pool stays STARTED though its lease
    lapsed (nothing of the run renews it while it waits); once it no longer waits, the lapse fails it as before."""
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(job_def=customer_status_sweep_job, status=dg.DagsterRunStatus.STARTED)
        owner = f"{run.run_id}@another-host:run"
        with engine.begin() as conn:
            conn.execute(PUT_LEASE, {"name": SWEEP_JOB_KEY, "owner": owner, "lease_in_s": -30.0})
            conn.execute(PUT_LOCK, {"name": SWEEP_JOB_KEY, "owner": owner, "lock_in_s": 30.0})
        storage = instance.event_log_storage
        storage.set_concurrency_slots(APP_DATABASE_POOL, 1)
        assert storage.claim_concurrency_slot(APP_DATABASE_POOL, "another-run", "sweep_range[r000_of_001]").is_claimed
        assert not storage.claim_concurrency_slot(APP_DATABASE_POOL, run.run_id, "sweep_range[r000_of_004]").is_claimed
        assert "all alive" in _tick(instance, db_url)
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
        storage.free_concurrency_slot_for_step(run.run_id, "sweep_range[r000_of_004]")  # no longer waiting
        assert "1 dead run(s) marked failed" in _tick(instance, db_url)


def test_lease_lapsed_before_the_run_started_is_not_its_death(dagster_env: Settings, engine: sa.Engine,
                                                              db_url: str) -> None:
    """A lapsed lease of the same root last renewed before this re-execution started does not fail the new run."""
    with dg.instance_for_test() as instance:
        parent = instance.create_run_for_job(job_def=customer_status_sweep_job, status=dg.DagsterRunStatus.FAILURE)
        with engine.begin() as conn:
            conn.execute(PUT_LEASE, {"name": SWEEP_JOB_KEY, "owner": f"{parent.run_id}@h:run", "lease_in_s": -600.0})
        child = instance.create_run_for_job(job_def=customer_status_sweep_job, status=dg.DagsterRunStatus.NOT_STARTED,
                                            root_run_id=parent.run_id, parent_run_id=parent.run_id)
        instance.handle_new_event(dg.EventLogEntry(
            error_info=None, level="DEBUG", user_message="", run_id=child.run_id, timestamp=time.time(),
            dagster_event=dg.DagsterEvent(dg.DagsterEventType.RUN_START.value, job_name=child.job_name),
        ))
        assert instance.get_run_by_id(child.run_id).status == dg.DagsterRunStatus.STARTED
        assert "all alive" in _tick(instance, db_url)
        assert instance.get_run_by_id(child.run_id).status == dg.DagsterRunStatus.STARTED


def test_cli_run_whose_process_is_gone_is_failed(dagster_env: Settings, db_url: str) -> None:
    """A STARTED CLI run holding nothing whose process tag names an exited process is FAILURE (e.g. a killed drain)."""
    with dg.instance_for_test() as instance:
        alive = instance.create_run_for_job(job_def=payment_queue_drain_job, status=dg.DagsterRunStatus.STARTED)
        run = instance.create_run_for_job(job_def=payment_queue_drain_job, status=dg.DagsterRunStatus.STARTED,
                                          tags={PROCESS_TAG: _dead_owner("cli")})
        assert "run worker process is gone" in _tick(instance, db_url)
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
        # A run with no evidence either way (no lease, no process this host can judge) is never failed.
        assert instance.get_run_by_id(alive.run_id).status == dg.DagsterRunStatus.STARTED


def test_drain_sensor_does_not_stall_behind_a_dead_drain(dagster_env: Settings, engine: sa.Engine,
                                                         db_url: str) -> None:
    """With payments due and the last drain STARTED but its process gone, the drain sensor fails it and starts one."""
    from batch_assets.reference.payments.queue import enqueue

    sensor = defs.resolve_sensor_def("payment_queue_drain_sensor")
    with dg.instance_for_test() as instance:
        enqueue(engine, 3)
        dead = instance.create_run_for_job(job_def=payment_queue_drain_job, status=dg.DagsterRunStatus.STARTED,
                                           tags={PROCESS_TAG: _dead_owner("cli")})
        with dg.build_sensor_context(instance=instance,
                                     resources=sensor_resources(db_url)) as context:
            result = sensor.evaluate_tick(context)
        assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
        assert result.run_requests, result.skip_message
        [request] = result.run_requests
        assert request.run_key == f"drain-after:{dead.run_id}"
