"""`batch-assets ui`: Dagster's UI (`dg dev`: webserver, daemon and code server) on the CLI's instance.

`dg dev` is Dagster 1.13's successor of `dagster dev`; it reads the project from `[tool.dg]` in pyproject.toml
(the code location batch_assets.definitions). It runs in a process group of its own, so a terminal's Ctrl-C or
a service manager's SIGTERM reaches this command, which passes the signal on to the whole group, waits up to
STOP_GRACE_S for it to shut down, and then kills whatever of it is left: no webserver, daemon or code server
outlives `batch-assets ui` (or `make ui`).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from batch_assets.cli.args import at_least_one
from batch_assets.cli.output import err
from batch_assets.extras import install_hint, installed, missing_extra_error
from batch_assets.settings import Settings

if TYPE_CHECKING:
    import psutil  # imported where used: `batch-assets` builds this parser on every command

STOP_GRACE_S = 30.0
"""How long `dg dev` gets after SIGTERM/SIGINT to stop its webserver, daemon and code servers."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Stop(Exception):
    """Raised by the signal handler to leave the wait for the child (PEP 475 retries a plain wait)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def dg_dev_command(port: int, host: str, workspace: Path) -> list[str]:
    """`dg dev` for this project, with this interpreter (the project's environment). dg comes with the `ui` extra
    (and `make install`); without it, the superseded `dagster dev` on `workspace` serves the same code location.
    Either needs dagster-webserver (the `ui` extra, or the team's own install): without it, a ConfigError."""
    if not installed("dagster_webserver"):
        raise missing_extra_error("dagster_webserver")
    if not installed("dagster_dg_cli"):
        err(f"dg (dagster-dg-cli) is not installed: using `dagster dev` ({install_hint('ui')} brings dg)")
        return [sys.executable, "-m", "dagster", "dev", "-w", str(workspace), "--port", str(port), "--host", host]
    return [sys.executable, "-m", "dagster_dg_cli.cli", "dev", "--port", str(port), "--host", host]


def _group_members(pgid: int) -> list[psutil.Process]:
    import psutil

    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def still_running(processes: Sequence[psutil.Process]) -> list[psutil.Process]:
    """Those of `processes` that still run (a zombie counts as gone)."""
    import psutil

    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.Error:
            continue
    return alive


def descendants(pid: int) -> list[psutil.Process]:
    """Every process below `pid` now (none when it is gone)."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _wait_gone(proc: subprocess.Popen[bytes], known: Sequence[psutil.Process], deadline: float) -> bool:
    """Wait (a poll with a deadline) until the child, its group and the `known` descendants are gone."""
    while True:
        if proc.poll() is not None and not _group_members(proc.pid) and not still_running(known):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)  # polling interval of a deadline loop


def _kill_rest(proc: subprocess.Popen[bytes], known: Sequence[psutil.Process]) -> None:
    """SIGKILL what is left: the child's process group and any descendant that left it."""
    _signal_group(proc.pid, signal.SIGKILL)
    for process in still_running(known):
        try:
            process.kill()
        except psutil.Error:
            continue
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        err(f"dg dev (pid {proc.pid}) did not exit after SIGKILL")


def run_supervised(cmd: Sequence[str], *, env: Mapping[str, str], cwd: Path, grace_s: float = STOP_GRACE_S) -> int:
    """Run `cmd` in a process group of its own until it exits; SIGTERM/SIGINT are passed on to the group, and
    after `grace_s` the rest of it is killed. The child's exit code, or 128 + the signal's number."""
    started: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if started:
            _signal_group(started[0].pid, signum)
        raise _Stop(signum)

    # Handlers before the start: the child then begins with both signals at their defaults (a caught signal is
    # reset by exec; an ignored one, as in a background job, would stay ignored and `dg dev` deaf to SIGTERM).
    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    known: list[psutil.Process] = []
    try:
        try:
            started.append(subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, start_new_session=True))
            code = started[0].wait()
            return 128 - code if code < 0 else code
        except _Stop as stop:
            if not started:
                return 128 + stop.signum
            proc = started[0]
            known = descendants(proc.pid)
            err(f"received {signal.Signals(stop.signum).name}: stopping the Dagster UI (up to {grace_s:.0f}s)")
            # A second signal during the grace period is passed on too, without leaving the wait below.
            for sig in STOP_SIGNALS:
                signal.signal(sig, lambda signum, _frame: _signal_group(proc.pid, signum))
            if not _wait_gone(proc, known, time.monotonic() + grace_s):
                err(f"the Dagster UI did not stop within {grace_s:.0f}s: killing what is left of it")
            return 128 + stop.signum
    finally:
        if started:
            _kill_rest(started[0], [*known, *descendants(started[0].pid)])
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.orchestration.instance_home import repo_root
    from batch_assets.orchestration.launch import ensure_instance

    home = ensure_instance(settings)
    err(f"DAGSTER_HOME={home}; open http://{args.host}:{args.port}")
    env = dict(os.environ, DAGSTER_HOME=str(home))
    command = dg_dev_command(args.port, args.host, repo_root() / "workspace.yaml")
    return run_supervised(command, env=env, cwd=repo_root())


def register(sub: Any) -> None:
    ui = sub.add_parser("ui", help="open the Dagster UI (dg dev) on the CLI's instance")
    ui.add_argument("--port", type=at_least_one("port", 65535), default=3000)
    ui.add_argument("--host", default="127.0.0.1", help="the address the webserver listens on")
    ui.set_defaults(func=cmd_ui)
