"""The resident launcher's client: `batch-assets` hands its command to the launcher that BATCH_ASSETS_LAUNCHER names
and stands in for the forked process (cli/launcher.py) until it reports its exit code."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Sequence
from typing import Any

from batch_assets.cli.launcher_wire import FORWARDED_SIGNALS, HANDSHAKE_TIMEOUT_S, Frames, interpreter, send
from batch_assets.cli.output import emit, empty_summary, err, looks_like_job
from batch_assets.errors import EXIT_FAILED
from batch_assets.settings import LAUNCHER_VAR


def run_through_launcher(argv: Sequence[str]) -> int | None:
    """Run `batch-assets ARGV` in a process the launcher forks, if BATCH_ASSETS_LAUNCHER names one that serves it:
    its exit code; None when the command is to run in this process (the reason is on stderr)."""
    path = os.environ.get(LAUNCHER_VAR, "").strip()
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            request = {"argv": list(argv), "env": dict(os.environ), "cwd": os.getcwd(), **interpreter()}
            sock.connect(path)
            send(sock, request, fds=(0, 1, 2))
            frames = Frames(sock)
            reply = frames.read()
        except (OSError, ValueError) as exc:
            err(f"launcher at {path} not reached ({exc.strerror or exc if isinstance(exc, OSError) else exc}): "
                  "running in this process")
            return None
        if reply is None or "pid" not in reply:
            reason = (reply or {}).get("refused") or "it closed the connection"
            err(f"launcher at {path} did not take the command ({reason}): running in this process")
            return None
        sock.settimeout(None)
        return _wait_for(sock, frames, int(reply["pid"]), argv)
    finally:
        sock.close()


def _wait_for(sock: socket.socket, frames: Frames, pid: int, argv: Sequence[str]) -> int:
    """Pass signals on to the command's process until it reports its exit code."""
    def forward(signum: int, _frame: Any) -> None:
        try:
            send(sock, {"signal": signum})
        except OSError:
            pass

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    try:
        message = frames.read()
    except (OSError, ValueError):
        message = None
    if message is not None and "exit" in message:
        return int(message["exit"])
    error = f"the command's process (pid {pid}, forked by the launcher) ended without an exit code"
    err(f"error: {error}")
    if looks_like_job(argv):
        emit(empty_summary("FAILURE", error=error))
    return EXIT_FAILED
