"""Start-up: a CLI sweep builds only its own job and imports only what a sweep needs.

Not a timing assertion (speed is the bench's, `batch-assets bench` startup section): what is checked is which
modules the CLI process holds when a delta sweep with nothing due has run. Launching one job used to import
every domain's Dagster module, the HTTP client (alerts) and pandas (run metadata tables).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import date
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import kill_session

from batch_assets.definitions import PROJECT
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.seed import seed_customers
from batch_assets.reference.payments.seed import seed_payments

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

NOT_FOR_A_SWEEP = (
    "pandas", "numpy", "matplotlib", "httpx", "celery", "aio_pika", "nats", "redis",
    "pygments.lexers.agile",  # what Mako's exceptions module imports to colour HTML error pages (Alembic imports it)
    "batch_assets.definitions",
    "batch_assets.reference.payments.dagster", "batch_assets.orchestration.outbox_job",
    "batch_assets.reference.subscriptions.dagster", "batch_assets.orchestration.retention_job",
    "batch_assets.queue.worker",
)
"""What a customer-status sweep run through the CLI does not need (its job module is customer_status.dagster)."""

# Runs the CLI as `python -m batch_assets.cli` does, then writes the names of the modules the process imported.
PROBE = """
import json, runpy, sys
listing = sys.argv.pop(1)
try:
    runpy.run_module("batch_assets.cli", run_name="__main__")
finally:
    with open(listing, "w") as out:
        json.dump(sorted(sys.modules), out)
"""


def test_job_modules_name_every_job_of_their_specs() -> None:
    """The project's name → module table (what lets the CLI import one job's module) matches the specs."""
    for module, names in PROJECT.job_modules.items():
        spec = __import__(module, fromlist=["SPEC"]).SPEC
        assert tuple(names) == spec.job_names, module
    assert [s.name for s in PROJECT.own_specs()] == [names[0] for names in PROJECT.job_modules.values()]


def _cli_run(argv: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, str, str, set[str]]:
    """Exit code, stdout, stderr and the names of the modules the CLI process imported."""
    listing = tmp_path / "modules.json"
    proc = subprocess.Popen([sys.executable, "-c", PROBE, str(listing), *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        kill_session(proc)
    return proc.returncode, out, err, set(json.loads(listing.read_text()))


def _cli_modules(argv: list[str], env: dict[str, str], tmp_path: Path) -> tuple[dict, set[str]]:
    code, out, err, modules = _cli_run(argv, env, tmp_path)
    assert code == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1]), modules


@pytest.mark.parametrize(("argv", "code"), [
    (["--help"], 0),
    (["sweep", "customer-status", "--mode", "full", "--workers", "1000000"], 2),
    (["rules", "set", "--thresholds", "MINOR=0,ADULT=x"], 2),
])
def test_a_command_that_runs_no_job_never_imports_dagster(argv: list[str], code: int, cli_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    """Help, and a command refused at its arguments, never import Dagster (a second of start-up on this machine): a
    mend of Dagster applied from the package the CLI imports for every command made each of them import it."""
    got, _out, err, modules = _cli_run(argv, cli_env, tmp_path)
    assert got == code, err[-2000:]
    assert "dagster" not in modules and "batch_assets.orchestration.executors" not in modules


def test_a_cli_delta_sweep_imports_only_its_own_job(cli_env: dict[str, str], engine: sa.Engine, cipher: DobCipher,
                                                    tmp_path: Path) -> None:
    """A delta with nothing due through the CLI: a SUCCESS Dagster run of customer_status_sweep_job, and the process
    never imported another domain's Dagster module, the code location, pandas, the HTTP client or a broker client."""
    run_date = date.today()
    rows = seed_customers(engine, cipher, 300, run_date=run_date, bad_fraction=0.0, seed=5).rows
    sweep = ["sweep", "customer-status", "--run-date", run_date.isoformat(), "--mode"]
    summary, _ = _cli_modules([*sweep, "full"], cli_env, tmp_path)
    assert summary["status"] == "SUCCESS" and summary["changed"] == rows
    summary, modules = _cli_modules([*sweep, "delta"], cli_env, tmp_path)
    assert summary["status"] == "SUCCESS" and summary["scanned"] == 0 and summary["run_id"]
    assert "batch_assets.reference.customer_status.dagster" in modules and "dagster" in modules
    loaded = sorted(name for name in NOT_FOR_A_SWEEP if name in modules)
    assert loaded == [], f"imported by a CLI delta sweep: {loaded}"


# A payment handler that writes what the worker's process collector looks like while the worker works.
GC_PROBE_HANDLER = """
import gc, json, os
def handle(payment_id, amount_cents, attempts):
    with open(os.environ["GC_PROBE_FILE"], "w") as out:
        json.dump({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}, out)
"""


def test_a_cli_worker_collects_with_its_start_up_frozen(cli_env: dict[str, str], engine: sa.Engine,
                                                        tmp_path: Path) -> None:
    """`python -m batch_assets.cli queue work --drain`: the collector, off while the CLI imported (cli/startup.py),
    is on again while the worker handles payments, with what start-up imported frozen out of its reach."""
    module = f"gc_probe_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(GC_PROBE_HANDLER)
    state = tmp_path / "gc.json"
    seed_payments(engine, 1, seed=3)
    env = {**cli_env, "BATCH_ASSETS_PAYMENT_HANDLER": f"{module}:handle", "GC_PROBE_FILE": str(state),
           "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "batch_assets.cli", "queue", "work", "--drain"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        kill_session(proc)
    assert proc.returncode == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "SUCCESS" and summary["changed"] == 1, summary
    seen = json.loads(state.read_text())
    assert seen["enabled"] is True
    assert seen["frozen"] > 10_000, seen
