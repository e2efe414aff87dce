"""A UI server a test started (`batch-assets ui` / `make ui`), and the waits on its processes.

Importable as `ui_server` from the tests of tests/ui (pytest puts their folder on sys.path).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from helpers import wait_for

from batch_assets.cli.ui import descendants, still_running

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
UP_TIMEOUT_S = 150.0
"""How long dg dev may take to serve the code location (a busy 2-core box: webserver, daemon, code server)."""

LOCATION_QUERY = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "\
                 "locationOrLoadError { __typename ... on PythonError { message } } } } } }"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class UiServer:
    """A started `batch-assets ui` (or `make ui`): its process, port, log and every descendant seen."""

    popen: subprocess.Popen[bytes]
    port: int
    log_path: Path
    dagster_home: Path
    seen: list[psutil.Process] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def running(self) -> bool:
        return self.popen.poll() is None

    def note_descendants(self) -> list[psutil.Process]:
        """Record the processes under the server now (to check, and kill, each of them later)."""
        known = {p.pid for p in self.seen}
        self.seen.extend(p for p in descendants(self.popen.pid) if p.pid not in known)
        return self.seen

    def location_loaded(self) -> bool:
        try:
            response = httpx.post(f"{self.url}/graphql", json={"query": LOCATION_QUERY}, timeout=5)
            entries = response.json()["data"]["workspaceOrError"]["locationEntries"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return False
        for entry in entries:
            if entry["name"] == "batch_assets" and entry["loadStatus"] == "LOADED":
                loaded = entry["locationOrLoadError"] or {}
                assert loaded.get("__typename") == "RepositoryLocation", f"the code location failed: {loaded}"
                return True
        return False


def _reset_signals() -> None:
    # Started from a background shell, the child may inherit SIGINT ignored; the CLI under test handles both.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def ui_process(cmd: Sequence[str], env: dict[str, str], tmp_path: Path, port: int) -> Iterator[UiServer]:
    """Start `cmd` (a UI command) in its own session and wait until it serves the code location; in the
    end SIGKILL its process group and every descendant it was seen with, whatever the test did."""
    log_path = tmp_path / f"ui_{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(list(cmd), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_reset_signals)
    server = UiServer(proc, port, log_path, Path(env["BATCH_ASSETS_HOME"]) / "dagster_home")
    try:
        wait_for(lambda: server.note_descendants() and server.location_loaded(), timeout=UP_TIMEOUT_S,
                 what=f"the UI serving the code location on port {port}", interval=0.5, alive=server)
        server.note_descendants()
        yield server
    finally:
        server.note_descendants()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for process in still_running(server.seen):
            try:
                process.kill()
            except psutil.Error:
                continue
        proc.wait(timeout=30)


def wait_gone(processes: Sequence[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Poll (with a deadline) until none of `processes` runs; what is still running then."""
    deadline = time.monotonic() + timeout
    while still_running(processes) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling interval of a deadline loop
    return still_running(processes)
