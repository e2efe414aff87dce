"""The product, driven only through its command line, as an operator would.

Each command is a real process (`.venv/bin/batch-assets` of this worktree) in a
session of its own, its output in files (no pipe can fill up), and its process
group killed in a `finally` if it is still there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PRODUCT_VARS_PREFIX = "BATCH_ASSETS_"


def tested_tree() -> str:
    """The commit the product ran from, and whether the work tree differed from it (a report's provenance)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git work tree)"
    return f"`{commit}`" + (" with uncommitted changes" if dirty else "")


def cli_path() -> str:
    """The worktree's installed entry point; the interpreter's module as a fallback."""
    candidate = Path(sys.executable).parent / "batch-assets"
    return str(candidate) if candidate.exists() else str(REPO / ".venv" / "bin" / "batch-assets")


@dataclass
class CliResult:
    args: list[str]
    rc: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def summary(self) -> dict[str, Any] | None:
        """The JSON object on the last non-empty line of stdout (docs/reference/cli.md), or None."""
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        if not lines:
            return None
        try:
            value = json.loads(lines[-1])
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    @property
    def status(self) -> str | None:
        s = self.summary
        return s.get("status") if s else None

    def brief(self) -> str:
        s = self.summary or {}
        keep = {k: s.get(k) for k in ("status", "scanned", "changed", "failed", "error", "run_id") if k in s}
        return f"rc={self.rc} {json.dumps(keep, default=str)}"

    def stderr_tail(self, n: int = 3) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return " | ".join(lines[-n:])


class Running:
    """A started command; `finish()` collects it, `kill_group()` ends what is left of it."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], workdir: Path,
                 command: Sequence[str] | None = None) -> None:
        """`command` (default: the product's CLI) with `args`, in a session of its own, output in `workdir`."""
        workdir.mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex[:8]
        self.args = list(args)
        self.out_path = workdir / f"{tag}.out"
        self.err_path = workdir / f"{tag}.err"
        self.started = time.monotonic()
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            self.popen = subprocess.Popen(
                [*(command or [cli_path()]), *args], env=dict(env), stdout=out, stderr=err, cwd=workdir,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill_group(self) -> None:
        """SIGKILL the session this command leads (only processes started by it)."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def finish(self, timeout: float) -> CliResult:
        try:
            rc = self.popen.wait(timeout=max(0.1, timeout - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.kill_group()
            rc = -999  # the campaign's mark for "did not end in time"
        finally:
            # Whatever the command left behind in its session (e.g. executor children) goes too.
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return CliResult(self.args, rc, self.out_path.read_text(errors="replace"),
                         self.err_path.read_text(errors="replace"), time.monotonic() - self.started)


class Product:
    """The CLI with the campaign's environment (database URL with password, key, home, URLs)."""

    def __init__(self, workdir: Path, env: Mapping[str, str]) -> None:
        self.workdir = workdir
        base = {k: v for k, v in os.environ.items() if not k.startswith(PRODUCT_VARS_PREFIX) and k != "DAGSTER_HOME"}
        base.update(env)
        base.setdefault("BATCH_ASSETS_AUTOMATION", "off")
        self.env = base
        self.outputs: list[CliResult] = []  # every command's output, for the secret scan
        self.started: list[Running] = []

    def with_env(self, **changes: str | None) -> dict[str, str]:
        env = dict(self.env)
        for k, v in changes.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def start(self, *args: str, env: Mapping[str, str] | None = None) -> Running:
        running = Running(args, env or self.env, self.workdir)
        self.started.append(running)
        return running

    def kill_all(self) -> None:
        """SIGKILL the session of every command still running (they do not get the terminal's Ctrl-C)."""
        for running in self.started:
            if running.running():
                running.kill_group()
        self.started = [r for r in self.started if r.running()]

    def run(self, *args: str, timeout: float = 300, env: Mapping[str, str] | None = None) -> CliResult:
        result = self.start(*args, env=env).finish(timeout)
        self.outputs.append(result)
        return result

    def record(self, result: CliResult) -> CliResult:
        self.outputs.append(result)
        return result
