"""The resident launcher (cli/launcher.py): a command it forks is the same CLI command.

Each test starts `batch-assets launcher` in a session of its own and stops it by its id in a `finally`; the
commands are `python -m batch_assets.cli ...` clients with BATCH_ASSETS_LAUNCHER set, run against the test's own
database. What is checked is behaviour (exit codes, summaries, which process ran the run, signals, a killed
client), not speed: start-up is the bench's (`batch-assets bench`, startup section).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from helpers import kill_session, scalar, wait_for

from batch_assets.orchestration.watchdog import PROCESS_TAG
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.seed import seed_customers
from batch_assets.reference.payments.seed import seed_payments
from faults.hosts import process_alive

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

NOOP_HANDLER = "batch_assets.reference.payments.noop:handle"
UNSETTLED = "SELECT count(*) FROM payments WHERE status <> 'DONE'"
RUNS_LINE = re.compile(r"launcher: pid (\d+) runs `([^`]*)`")


@dataclass
class Launcher:
    socket: str
    log: Path
    popen: subprocess.Popen[str]

    def served(self) -> list[tuple[int, str]]:
        """(pid, command) of every command the launcher forked so far."""
        return [(int(m[1]), m[2]) for m in RUNS_LINE.finditer(self.log.read_text())]


@contextmanager
def launcher(env: dict[str, str]) -> Iterator[Launcher]:
    # A short directory of its own: a Unix socket's path is limited to 107 bytes, and tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="ba_launcher_", dir="/tmp") as folder:
        socket_path, log = os.path.join(folder, "launcher.sock"), Path(folder) / "launcher.log"
        with open(log, "w") as err:
            popen = subprocess.Popen([sys.executable, "-m", "batch_assets.cli", "launcher", "--socket", socket_path],
                                     env=env, stdout=subprocess.DEVNULL, stderr=err, text=True,
                                     start_new_session=True)
        try:
            wait_for(lambda: "launcher: ready" in log.read_text() or popen.poll() is not None, timeout=120,
                     what="the launcher to listen")
            assert popen.poll() is None, log.read_text()
            yield Launcher(socket_path, log, popen)
        finally:
            kill_session(popen)


def client(env: dict[str, str], socket_path: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "batch_assets.cli", *args],
                          env={**env, "BATCH_ASSETS_LAUNCHER": socket_path}, capture_output=True, text=True,
                          timeout=timeout)


def summary_of(out: str) -> dict:
    import json

    return json.loads(out.strip().splitlines()[-1])


def run_tags(home: Path, run_id: str) -> dict[str, str]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        return dict(run.tags)


def test_a_command_the_launcher_forks_is_the_cli_command(cli_env: dict[str, str], engine: sa.Engine,
                                                         cipher: DobCipher, tmp_path: Path) -> None:
    """A full sweep and a delta through the launcher: the client's exit codes and JSON summaries, each a Dagster
    run whose process tag names the forked process (not the client, not the launcher); a usage error reaches the
    client's stderr with exit 2, and the client's own environment is the command's."""
    run_date = date.today()
    rows = seed_customers(engine, cipher, 300, run_date=run_date, bad_fraction=0.0, seed=7).rows
    with launcher(cli_env) as served:
        sweep = ["sweep", "customer-status", "--run-date", run_date.isoformat(), "--mode"]
        full = client(cli_env, served.socket, *sweep, "full")
        assert full.returncode == 0, full.stderr[-2000:]
        assert "running in this process" not in full.stderr
        summary = summary_of(full.stdout)
        assert summary["status"] == "SUCCESS" and summary["changed"] == rows
        delta = client(cli_env, served.socket, *sweep, "delta")
        assert delta.returncode == 0 and summary_of(delta.stdout)["scanned"] == 0, delta.stderr[-2000:]

        forked = served.served()
        assert [command for _, command in forked] == ["sweep customer-status"] * 2
        home = Path(cli_env["BATCH_ASSETS_HOME"]) / "dagster_home"
        for (pid, _), run in zip(forked, (summary, summary_of(delta.stdout)), strict=True):
            owner = run_tags(home, run["run_id"])[PROCESS_TAG]
            assert f":{pid}:" in owner, (owner, pid)
            assert pid != served.popen.pid

        bad = client(cli_env, served.socket, *sweep, "sideways")
        assert bad.returncode == 2 and "mode" in bad.stderr, bad.stderr[-2000:]
        # The settings are read from the client's environment, not the launcher's (whose time zone is valid).
        zone = client({**cli_env, "BATCH_ASSETS_TIMEZONE": "Not/AZone"}, served.socket, *sweep, "delta")
        assert zone.returncode == 2 and "TIMEZONE" in zone.stderr.upper(), zone.stderr[-2000:]
        assert "running in this process" not in zone.stderr
        assert len(served.served()) == 4


def test_a_launcher_that_cannot_serve_the_command_leaves_it_to_the_client(cli_env: dict[str, str],
                                                                          tmp_path: Path) -> None:
    """No launcher on the socket, or a client whose environment differs in what imports read: the client says why
    on stderr and runs the command itself, with the same outcome."""
    nobody = client(cli_env, str(tmp_path / "absent.sock"), "rules", "show")
    assert nobody.returncode == 0, nobody.stderr[-2000:]
    assert "not reached" in nobody.stderr and "running in this process" in nobody.stderr
    with launcher(cli_env) as served:
        other = client({**cli_env, "DAGSTER_BA_TEST_FLAG": "1"}, served.socket, "rules", "show")
        assert other.returncode == 0, other.stderr[-2000:]
        assert "DAGSTER_BA_TEST_FLAG" in other.stderr and "running in this process" in other.stderr
        assert served.served() == []
        second = subprocess.run([sys.executable, "-m", "batch_assets.cli", "launcher", "--socket", served.socket],
                                env=cli_env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and "another launcher is listening" in second.stderr, second.stderr[-2000:]
        assert served.popen.poll() is None


def test_signals_reach_the_command_and_a_killed_client_takes_it_down(cli_env: dict[str, str],
                                                                     engine: sa.Engine) -> None:
    """A resident queue worker through the launcher: SIGTERM sent to the client stops it gracefully (exit 0, its
    summary on the client's stdout); kill -9 of the client ends the forked worker too, as it would end a worker
    the CLI ran itself, and the launcher goes on serving."""
    env = {**cli_env, "BATCH_ASSETS_PAYMENT_HANDLER": NOOP_HANDLER}
    with launcher(env) as served:
        for ending in ("SIGTERM", "SIGKILL"):
            seed_payments(engine, 1, seed=11 if ending == "SIGTERM" else 12)
            worker = subprocess.Popen([sys.executable, "-m", "batch_assets.cli", "queue", "work"],
                                      env={**env, "BATCH_ASSETS_LAUNCHER": served.socket}, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                # Once the payment is DONE the worker's run is under way, its signal handlers installed.
                wait_for(lambda w=worker: scalar(engine, UNSETTLED) == 0 or w.poll() is not None, timeout=120,
                         what="the worker to settle its payment")
                assert worker.poll() is None, worker.communicate()[1][-2000:]
                [(pid, command)] = served.served()[-1:]
                assert command == "queue work"
                if ending == "SIGTERM":
                    worker.send_signal(signal.SIGTERM)
                    out, err = worker.communicate(timeout=120)
                    assert worker.returncode == 0, err[-2000:]
                    summary = summary_of(out)
                    assert summary["status"] == "SUCCESS" and summary["changed"] == 1, summary
                    wait_for(lambda pid=pid: not process_alive(pid), timeout=30, what="the forked worker to end")
                else:
                    worker.kill()
                    worker.communicate(timeout=30)  # its stdout ends when the forked worker, which holds it too, dies
                    wait_for(lambda pid=pid: not process_alive(pid), timeout=30,
                             what="the forked worker to die with its client")
            finally:
                kill_session(worker)
        assert served.popen.poll() is None
        assert len(served.served()) == 2


def test_a_sweep_whose_client_is_killed_is_a_dead_run_and_the_next_run_resumes(
        cli_env: dict[str, str], engine: sa.Engine, cipher: DobCipher, db_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of a sweep's client mid-range: the forked run worker dies with it (reaped by the launcher, so no
    zombie looks alive), the watchdog's tick fails the run, and the next run through the launcher resumes from the
    checkpoints and computes every row."""
    from helpers import sensor_resources

    from batch_assets.definitions import defs as load_defs

    for name, value in cli_env.items():
        if name.startswith("BATCH_ASSETS_"):
            monkeypatch.setenv(name, value)
    home = Path(cli_env["BATCH_ASSETS_HOME"]) / "dagster_home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    run_date = date.today()
    rows = seed_customers(engine, cipher, 40_000, run_date=run_date, bad_fraction=0.0, seed=13).rows
    args = ["sweep", "customer-status", "--mode", "full", "--run-date", run_date.isoformat(), "--page-size", "200",
            "--workers", "1"]
    with launcher(cli_env) as served:
        sweep = subprocess.Popen([sys.executable, "-m", "batch_assets.cli", *args],
                                 env={**cli_env, "BATCH_ASSETS_LAUNCHER": served.socket}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            wait_for(lambda: scalar(engine, "SELECT count(*) FROM outbox_events") >= 2000 or sweep.poll() is not None,
                     timeout=120, what="the sweep to have written part of the table")
            assert sweep.poll() is None, sweep.communicate()[1][-2000:]
            [(pid, _)] = served.served()
            sweep.kill()
            sweep.communicate(timeout=60)
            wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout=30, what="the run worker to die, reaped")
        finally:
            kill_session(sweep)
        written = scalar(engine, "SELECT count(*) FROM outbox_events")
        assert 2000 <= written < rows

        defs = load_defs()
        with dg.DagsterInstance.from_config(str(home)) as instance, dg.build_sensor_context(
                instance=instance, resources=sensor_resources(db_url)) as context:
            result = defs.resolve_sensor_def("dead_run_watchdog_sensor").evaluate_tick(context)
            assert "dead run(s) marked failed" in (result.skip_message or ""), result.skip_message
        again = client(cli_env, served.socket, *args)
        assert again.returncode == 0, again.stderr[-2000:]
        summary = summary_of(again.stdout)
        assert summary["status"] == "SUCCESS" and summary["resumed_from"] is not None, summary
        assert summary["scanned"] < rows
    assert scalar(engine, "SELECT count(*) FROM customers WHERE next_review_date IS NULL") == 0
    assert scalar(engine, "SELECT count(*) FROM outbox_events") == rows

