"""Where the time goes: the Dagster run start-up of a CLI command, measured on its own.

`batch-assets sweep` runs every sweep as a Dagster run. Its wall time is the
engine's own `duration_s` plus the cost of the process, the imports, the
instance and the run around it. A delta sweep with nothing due does almost no
engine work, so its wall time minus its `duration_s` is that start-up. The
first run uses a fresh Dagster instance (created on the way), the next ones
reuse it, as a deployed instance would.

The same CLI, timed by wall from outside, against the references: a steady-state full sweep at the
bench's row count against the single-stream floor's time (goal: within 1.0x, the CLI's start-up included), and
queue workers started as `batch-assets queue work --drain` processes against the raw SKIP LOCKED floor
(goal: at least 0.6x its rate by wall, each worker's start-up included).

Each figure twice: with the CLI importing everything itself (a process started cold), and through the resident
launcher (`batch-assets launcher`, cli/launcher.py: the command runs in a process forked from one that has
imported it all). The start-up goal (at most STARTUP_GOAL_S of wall time beyond `duration_s`) is reported for
both.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Any

from batch_assets.settings import environ_without_product

CLI_TIMEOUT_S = 300
STARTUP_GOAL_S = 1.0
"""A CLI delta with nothing due spends at most this much wall time beyond the engine's `duration_s`."""
CLI_FLOOR_GOAL = 1.0
"""A steady-state full sweep through the CLI, wall included, takes at most this many times the floor's time."""
QUEUE_CLI_GOAL = 0.6
"""Queue workers started through the CLI settle at least this fraction of the raw floor's rate, by wall."""
QUEUE_CLI_PROCESSES = 2
NOOP_HANDLER = "batch_assets.reference.payments.noop:handle"


def _child_env(url: str, key_text: str, home: Path) -> dict[str, str]:
    """The CLI's environment: the scratch database and the bench key; no product variable of the caller."""
    env = environ_without_product()
    env.update(
        BATCH_ASSETS_DATABASE_URL=url,
        BATCH_ASSETS_ENCRYPTION_KEY=key_text,  # handed over in the environment, never on a command line
        BATCH_ASSETS_HOME=str(home),
        DAGSTER_HOME=str(home / "dagster_home"),
        BATCH_ASSETS_AUTOMATION="off",
    )
    return env


def _cli_run(argv: list[str], env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """Run `batch-assets ARGV`; (wall seconds, the JSON summary on its last stdout line)."""
    [(wall, summary)] = _cli_runs([argv], env)
    return wall, summary


def _cli_runs(argvs: list[list[str]], env: dict[str, str]) -> list[tuple[float, dict[str, Any]]]:
    """Start `batch-assets ARGV` for each ARGV at once; (wall seconds since they all started, JSON summary) each.
    Every process runs in its own session and is killed (its group) if it outlives the timeout. With a launcher
    in `env`, a command it did not serve (the client ran it itself) is an error: its figure would be mislabelled."""
    from batch_assets.settings import LAUNCHER_VAR

    started = time.perf_counter()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "batch_assets.cli", *argv],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    ) for argv in argvs]
    results = []
    try:
        for argv, proc in zip(argvs, procs, strict=True):
            out, errors = proc.communicate(timeout=CLI_TIMEOUT_S)
            wall = time.perf_counter() - started
            if proc.returncode != 0:
                tail = errors.strip().splitlines()[-1:] or ["no message"]
                raise RuntimeError(f"batch-assets {' '.join(argv)} exited {proc.returncode}: {tail[0]}")
            if env.get(LAUNCHER_VAR) and "running in this process" in errors:
                raise RuntimeError(f"the launcher did not serve `batch-assets {' '.join(argv)}`: "
                                   f"{errors.strip().splitlines()[0]}")
            results.append((wall, json.loads(out.strip().splitlines()[-1])))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return results


@contextmanager
def _warm_cli_home(url: str, key_text: str, run_date: date, *, launcher: bool = False) -> Iterator[dict[str, str]]:
    """A CLI environment whose Dagster instance already exists (one delta with nothing due created it), as on a
    deployed machine: the figures measured in it carry the warm start-up, not the instance's creation. With
    `launcher`, a resident launcher serves its commands (`running_launcher`)."""
    with tempfile.TemporaryDirectory(prefix="ba_bench_home_") as home:
        env = _child_env(url, key_text, Path(home))
        _cli_run(["sweep", "customer-status", "--mode", "delta", "--run-date", run_date.isoformat()], env)
        if not launcher:
            yield env
            return
        with running_launcher(env) as served:
            yield served


@contextmanager
def running_launcher(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """`batch-assets launcher` for `env`, in its own session, until the block ends (then SIGTERM, and SIGKILL to
    its group if it outlives the timeout): `env` with BATCH_ASSETS_LAUNCHER naming its socket."""
    from batch_assets.settings import LAUNCHER_VAR

    # A short directory of its own: a Unix socket's path is limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="ba_bench_launcher_", dir="/tmp") as folder:
        socket_path, log_path = os.path.join(folder, "launcher.sock"), Path(folder) / "launcher.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "batch_assets.cli", "launcher", "--socket", socket_path],
                                    env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        try:
            deadline = time.monotonic() + CLI_TIMEOUT_S
            while "launcher: ready" not in log_path.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text().strip().splitlines()[-1:] or ["no message"]
                    raise RuntimeError(f"the launcher did not start: {tail[0]}")
                time.sleep(0.05)  # the poll's interval, under the deadline above
            yield {**env, LAUNCHER_VAR: socket_path}
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def measure_cli_sweep(url: str, key_text: str, run_date: date, *, workers: int, floor_s: float,
                      launcher: bool = False) -> dict[str, Any]:
    """A steady-state full sweep through the CLI (`sweep customer-status --mode full`), timed by wall from outside,
    against the single-stream floor's steady-state time on the same rows (the table must be settled already);
    with `launcher`, the command served by a resident launcher."""
    with _warm_cli_home(url, key_text, run_date, launcher=launcher) as env:
        argv = ["sweep", "customer-status", "--mode", "full", "--run-date", run_date.isoformat(),
                "--workers", str(workers)]
        wall, summary = _cli_run(argv, env)
    if summary.get("status") != "SUCCESS":
        raise RuntimeError(f"CLI full sweep ended {summary.get('status')}: {summary.get('error')}")
    ratio = round(wall / floor_s, 3) if floor_s > 0 else None
    return {
        "command": " ".join(["batch-assets", *argv]),
        "workers": workers,
        "launcher": launcher,
        "cli_wall_s": round(wall, 3),
        "engine_duration_s": round(float(summary["duration_s"]), 3),
        "scanned": summary["scanned"],
        "changed": summary["changed"],
        "floor_s": round(floor_s, 3),
        "cli_wall_over_floor": ratio,
        "within_goal": ratio is not None and ratio <= CLI_FLOOR_GOAL,
    }


QUEUE_ROWS = {
    "floor": "the floor's rows: ids in ascending order, ANALYZEd (batch_assets.bench.payments), as the queue section",
    "seed": "`batch-assets seed payments`: random UUIDv4 ids, no ANALYZE",
}
"""The payments a CLI queue probe drains. The goal is judged on the floor's own rows, so the ratio is the CLI's
overhead alone; the same probe on `seed payments` rows shows what random ids cost (each batch's updates touch as
many primary-key leaf pages as rows, where ascending ids share a few)."""


CLI_QUEUE_PROBES = (("cli_queue", False, "floor"), ("cli_queue_launcher", True, "floor"),
                    ("cli_queue_launcher_seeded", True, "seed"))
"""(report key under startup, served by the launcher, QUEUE_ROWS key) of each CLI queue probe; the goal is judged
on the first two."""


def measure_cli_queue(url: str, key_text: str, run_date: date, *, payments: int,
                      floor_per_s: float, launcher: bool = False, rows: str = "floor") -> dict[str, Any]:
    """`payments` NEW payments drained by QUEUE_CLI_PROCESSES `batch-assets queue work --drain` processes started at
    once (the no-op plug-in handler), timed by wall from their start to the last one's exit, against the raw
    floor's rate; each worker's own clock (its summary's duration_s) beside it; with `launcher`, the commands
    served by a resident launcher; `rows` one of QUEUE_ROWS. Deletes the payments afterwards, and vacuums."""
    from batch_assets.db.engine import create_engine

    if rows not in QUEUE_ROWS:
        raise ValueError(f"rows must be one of {', '.join(QUEUE_ROWS)}, got {rows!r}")

    with _warm_cli_home(url, key_text, run_date, launcher=launcher) as env:
        env = {**env, "BATCH_ASSETS_PAYMENT_HANDLER": NOOP_HANDLER}
        engine = create_engine(url, pool_size=1)
        try:
            with engine.connect() as conn:
                busy = conn.exec_driver_sql("SELECT count(*) FROM payments").scalar_one()
            if busy:
                raise RuntimeError(f"{busy} payments already in the scratch database: the CLI queue probe needs none")
            _cli_run(["queue", "work", "--drain"], env)  # nothing due: the worker's start-up alone, warm instance
            from batch_assets.bench.queue_harness import bench_rows, settle

            made = bench_rows(url)
            if rows == "seed":
                _cli_run(["seed", "payments", "--rows", str(payments)], env)
                settled = settle(made.conninfo)
            else:  # made exactly as the floor's and the queue section's (ascending ids, ANALYZE, CHECKPOINT)
                made.insert(payments)
                settled = made.settled
            argv = ["queue", "work", "--drain"]
            results = _cli_runs([argv] * QUEUE_CLI_PROCESSES, env)
            with engine.connect() as conn:
                done = conn.exec_driver_sql("SELECT count(*) FROM payments WHERE status = 'DONE'").scalar_one()
        finally:
            # As the queue section leaves its rows (batch_assets.bench.payments): deleted and vacuumed, so the next
            # probe does not drain beside autovacuum cleaning this one's 100k dead rows, nor over their index entries.
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("DELETE FROM payments")
                conn.exec_driver_sql("VACUUM (ANALYZE) payments")
            engine.dispose()
    wall = max(w for w, _ in results)
    own = max(float(summary.get("duration_s") or 0.0) for _, summary in results)
    per_s = payments / wall
    ratio = round(per_s / floor_per_s, 3) if floor_per_s > 0 else None
    return {
        "command": " ".join(["batch-assets", *argv]) + f" (x{QUEUE_CLI_PROCESSES} processes)",
        "processes": QUEUE_CLI_PROCESSES,
        "launcher": launcher,
        "rows": rows,
        "rows_made_by": QUEUE_ROWS[rows],
        "payments": payments,
        "done": int(done),
        "cli_wall_s": round(wall, 3),
        "own_clock_s": round(own, 3),
        "cli_wall_per_s": round(per_s, 1),
        "own_clock_per_s": round(payments / own, 1) if own > 0 else None,
        "floor_per_s": round(floor_per_s, 1),
        "checkpoint_before_drain": settled,
        "cli_wall_over_floor": ratio,
        "within_goal": (ratio is not None and ratio >= QUEUE_CLI_GOAL) if rows == "floor" else None,
    }


def measure_startup(url: str, key_text: str, run_date: date, *, runs: int) -> dict[str, Any]:
    """Wall time vs `duration_s` of `runs` CLI delta sweeps with nothing due (the first on a fresh instance), then of
    `runs` more served by a resident launcher on the same (now warm) instance (under "launcher")."""
    argv = ["sweep", "customer-status", "--mode", "delta", "--run-date", run_date.isoformat()]
    with tempfile.TemporaryDirectory(prefix="ba_bench_home_") as home:
        env = _child_env(url, key_text, Path(home))
        cold = [_startup_probe(argv, env, "fresh" if i == 0 else "warm") for i in range(runs)]
        with running_launcher(env) as served:
            forked = [_startup_probe(argv, served, "warm") for _ in range(runs)]
    warm = [s["startup_s"] for s in cold if s["instance"] == "warm"] or [cold[0]["startup_s"]]
    cold_s, forked_s = round(statistics.median(warm), 3), round(statistics.median(s["startup_s"] for s in forked), 3)
    return {
        "command": " ".join(["batch-assets", *argv]),
        "runs": cold,
        "startup_s": cold_s,
        "goal_s": STARTUP_GOAL_S,
        "within_goal": cold_s <= STARTUP_GOAL_S,
        "launcher": {
            "command": "batch-assets launcher (resident), then " + " ".join(["batch-assets", *argv]),
            "runs": forked,
            "startup_s": forked_s,
            "within_goal": forked_s <= STARTUP_GOAL_S,
        },
    }


def _startup_probe(argv: list[str], env: dict[str, str], instance: str) -> dict[str, Any]:
    wall, summary = _cli_run(argv, env)
    if summary.get("status") != "SUCCESS":
        raise RuntimeError(f"start-up probe ended {summary.get('status')}: {summary.get('error')}")
    duration = float(summary["duration_s"])
    return {
        "instance": instance,
        "cli_wall_s": round(wall, 3),
        "engine_duration_s": round(duration, 3),
        "startup_s": round(wall - duration, 3),
        "scanned": summary["scanned"],
    }
