"""Owner strings of locks and leases, and the rule for a holder that is provably dead.

An owner is `<run_id>@<host>:<pid>:s<start>:n<pidns>`: the run, and the process that holds the
lock on its behalf, identified by host name, pid, the process's start time (so a reused pid is
not mistaken for the holder) and its pid namespace (so a process in another container that
happens to share the host name is never judged from this one).

The takeover rule (docs/DESIGN.md, "Crash recovery"): a lock or lease whose holder is on this
host, in this pid namespace, and whose process no longer exists (or is another process with
the same pid) may be taken over at once instead of waiting for its expiry. Anything else —
another host, another namespace, an owner without a process part (a Dagster run whose ops run
in several processes) — is never judged dead: it expires on its own (lock-at-most-for, lease TTL).
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

import psutil

_OWNER_RE = re.compile(r"^(?P<run>.*)@(?P<host>[^@:]+):(?P<pid>\d+):s(?P<start>\d+):n(?P<ns>\d+)$")


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # no procfs (not Linux): namespaces are not a concern there
        return 0


def _start_of(pid: int) -> int | None:
    """The process's start time in centiseconds since the epoch, or None when there is no such process (or only
    its zombie, which its parent has not reaped yet)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # it ended, and runs nothing, holds nothing: only unreaped
            return None
        return round(process.create_time() * 100)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def make_owner(run_id: str) -> str:
    """The owner string of this process for a run."""
    pid = os.getpid()
    return f"{run_id}@{socket.gethostname()}:{pid}:s{_start_of(pid) or 0}:n{_pid_namespace()}"


def run_level_owner(run_id: str) -> str:
    """An owner shared by processes that come and go (the ops of one Dagster run): never judged dead."""
    return f"{run_id}@{socket.gethostname()}:run"


@dataclass(frozen=True)
class Holder:
    run_id: str
    host: str
    pid: int
    start: int
    pid_namespace: int


def parse_owner(owner: str | None) -> Holder | None:
    """The process part of an owner string, or None for an owner that names no single process."""
    match = _OWNER_RE.match(owner or "")
    if match is None:
        return None
    return Holder(match["run"], match["host"], int(match["pid"]), int(match["start"]), int(match["ns"]))


def provably_dead(owner: str | None) -> bool:
    """True only when the holder is a process of this host and pid namespace that no longer runs."""
    holder = parse_owner(owner)
    if holder is None or holder.host != socket.gethostname() or holder.pid_namespace != _pid_namespace():
        return False
    start = _start_of(holder.pid)
    # A different start time is another process that was given the same pid after the holder died.
    return start is None or (holder.start != 0 and abs(start - holder.start) > 1)
