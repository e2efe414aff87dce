"""Peak RSS of a whole first-computation sweep, each in a fresh process.

Memory must be a function of the settings, never of the table size: the same
sweep at the small and the large size should peak at the same RSS. The child
is `python -m batch_assets.bench.memory RUN_DATE`; the database URL and the
key reach it through the environment (never on a command line), and it prints
one JSON object.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from datetime import date
from typing import Any

from batch_assets.settings import DATABASE_URL_VAR, ENCRYPTION_KEY_VAR

RSS_WORKERS = 4
RSS_TIMEOUT_S = 1800


def measure_rss(url: str, key_text: str, run_date: date) -> dict[str, Any]:
    """Run one first-computation full sweep (4 workers) in a fresh process; its peak RSS in MiB."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCH_ASSETS_")}
    env.update({DATABASE_URL_VAR: url, ENCRYPTION_KEY_VAR: key_text})
    proc = subprocess.Popen(
        [sys.executable, "-m", "batch_assets.bench.memory", run_date.isoformat()],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        out, errors = proc.communicate(timeout=RSS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        tail = errors.strip().splitlines()[-1:] or ["no message"]
        raise RuntimeError(f"peak-RSS child exited {proc.returncode}: {tail[0]}")
    return json.loads(out.strip().splitlines()[-1])


def peak_rss_kib() -> int:
    """This process's own peak RSS in KiB: the high-water mark of its memory since its exec (VmHWM).

    Not getrusage's ru_maxrss: Linux carries it across exec from the forked copy of the parent, so a child started
    by a parent holding 500 MiB reports 500 MiB however little it uses itself. The bench's parent holds more than a
    sweep does, and every "peak RSS of a sweep in a fresh process" read so was the parent's (141.1 MiB at 100k and
    at 1M alike in the report of 2026-12-02). ru_maxrss stays the answer where /proc is absent."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS


def _child(run_date_text: str) -> int:
    from batch_assets.bench.scratch import reset_to_first_computation
    from batch_assets.bench.sweeps import run_sweep
    from batch_assets.db.engine import create_engine
    from batch_assets.reference.customer_status.crypto import DobCipher, decode_key

    engine = create_engine(os.environ[DATABASE_URL_VAR], pool_size=10)
    cipher = DobCipher(decode_key(os.environ[ENCRYPTION_KEY_VAR]))
    reset_to_first_computation(engine)
    summary = run_sweep(engine, cipher, "full", date.fromisoformat(run_date_text), RSS_WORKERS)
    engine.dispose()
    print(json.dumps({"peak_rss_mib": round(peak_rss_kib() / 1024, 1), "scanned": summary["scanned"],
                      "workers": RSS_WORKERS}))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
