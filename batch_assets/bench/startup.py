"""Where the time goes: the Dagster run start-up of a CLI command, measured on its own.

`batch-assets sweep` runs every sweep as a Dagster run. Its wall time is the
engine's own `duration_s` plus the cost of the process, the imports, the
instance and the run around it. A delta sweep with nothing due does almost no
engine work, so its wall time minus its `duration_s` is that start-up. The
first run uses a fresh Dagster instance (created on the way), the next ones
reuse it, as a deployed instance would.
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
from datetime import date
from pathlib import Path
from typing import Any

CLI_TIMEOUT_S = 300


def _child_env(url: str, key_text: str, home: Path) -> dict[str, str]:
    """The CLI's environment: the scratch database and the bench key; no product variable of the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCH_ASSETS_") and k != "DAGSTER_HOME"}
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
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "batch_assets.cli", *argv],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        out, errors = proc.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        tail = errors.strip().splitlines()[-1:] or ["no message"]
        raise RuntimeError(f"batch-assets {' '.join(argv)} exited {proc.returncode}: {tail[0]}")
    return wall, json.loads(out.strip().splitlines()[-1])


def measure_startup(url: str, key_text: str, run_date: date, *, runs: int) -> dict[str, Any]:
    """Wall time vs `duration_s` of `runs` CLI delta sweeps with nothing due (the first on a fresh instance)."""
    samples = []
    with tempfile.TemporaryDirectory(prefix="ba_bench_home_") as home:
        env = _child_env(url, key_text, Path(home))
        argv = ["sweep", "customer-status", "--mode", "delta", "--run-date", run_date.isoformat()]
        for i in range(runs):
            wall, summary = _cli_run(argv, env)
            if summary.get("status") != "SUCCESS":
                raise RuntimeError(f"start-up probe ended {summary.get('status')}: {summary.get('error')}")
            duration = float(summary["duration_s"])
            samples.append({
                "instance": "fresh" if i == 0 else "warm",
                "cli_wall_s": round(wall, 3),
                "engine_duration_s": round(duration, 3),
                "startup_s": round(wall - duration, 3),
                "scanned": summary["scanned"],
            })
    warm = [s["startup_s"] for s in samples if s["instance"] == "warm"] or [samples[0]["startup_s"]]
    return {
        "command": " ".join(["batch-assets", *argv]),
        "runs": samples,
        "startup_s": round(statistics.median(warm), 3),
    }
