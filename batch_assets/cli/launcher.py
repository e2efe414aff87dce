"""The resident launcher: every CLI command in a process forked from one that has imported them all.

A CLI process spends about a second importing Dagster, SQLAlchemy, psycopg and the job's modules before its run
starts: most of the wall time of a delta with little due, and of a queue worker that drains a short backlog.
`batch-assets launcher` imports all of that once, listens on a Unix socket (`BATCH_ASSETS_LAUNCHER`, or
`--socket`) and forks a process per command. The `batch-assets` client that finds `BATCH_ASSETS_LAUNCHER` set
hands the launcher its arguments, its environment, its working directory and its stdin, stdout and stderr
(the descriptors themselves, SCM_RIGHTS), and waits for the forked process's exit code. The command then is
the same CLI command: the same parser, settings from the client's environment, its own Dagster run (the process
tag names the forked process), the JSON summary written straight to the client's stdout.

The forked process is the command's process, and the client stands in for it:
- SIGINT, SIGTERM and SIGHUP sent to the client are passed on to it (a SIGTERM drains in-flight pages, as ever);
- if the client dies (kill -9 included) the forked process kills its own process group at once, as a killed
  CLI process would die: its run is judged dead by the watchdog, its ranges resume on the next run;
- the client exits with its exit code. A forked process that died without one (killed itself) makes the client
  exit 1, after the one-line error and, for a job command, the FAILURE summary on stdout.

When the launcher cannot serve a command exactly as a fresh process would, the client runs it itself, as
without a launcher, after one line on stderr saying why: the socket is absent or nobody answers in
HANDSHAKE_TIMEOUT_S; the client is another user, another Python or has other interpreter options; a variable read
when modules are imported (IMPORT_TIME_VARIABLES) has another value in the client's environment; or a source
file of an imported module changed since the launcher started (an upgrade: restart the launcher).

Nothing the launcher imports opens a connection or starts a thread: the forked processes share no state.

This module is the launcher itself; the client is cli/launcher_client.py and the frames between them
cli/launcher_wire.py. The command line a forked process runs is handed to `register` by cli/main.py, which
imports this module (this module does not import it back).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import logging
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from batch_assets.cli.launcher_wire import (
    FORWARDED_SIGNALS,
    HANDSHAKE_TIMEOUT_S,
    Frames,
    import_time,
    interpreter,
    send,
)
from batch_assets.cli.output import err
from batch_assets.errors import ConfigError
from batch_assets.settings import LAUNCHER_VAR


@dataclass(frozen=True)
class CommandLine:
    """The command line the launcher serves: `main(argv)` runs one command (in a forked process) and
    `build_parser()` imports every command group (preloaded once)."""

    main: Callable[[Sequence[str]], int]
    build_parser: Callable[[], object]


class _Stop(Exception):
    """SIGTERM or SIGINT: the launcher stops listening (the commands it started go on)."""


def _stop(_signum: int, _frame: Any) -> None:
    raise _Stop


RUN_MODULES = (
    "batch_assets.orchestration.launch",
    "batch_assets.orchestration.coordinator",
    "dagster._core.execution.api",
    "dagster._core.execution.plan.active",
    "dagster._core.executor.in_process",
    "dagster._core.instance.factory",
    "dagster._core.instance.runs.run_domain",
    "dagster._core.secrets.env_file",
    "dagster._core.storage.migration.utils",
    "dagster._core.storage.root",
    "dagster._core.system_config.composite_descent",
    "dagster._core.utility_ops",
    "dagster._core.workspace.autodiscovery",
    "dagster._core.definitions.repository_definition.repository_data_builder",
    "dagster._utils.temp_file",
    "dagster._utils.test.definitions",
    "upath",
    "upath.core",
    "upath.implementations.local",
    "fsspec.implementations.local",
)
"""What a job command imports while its run starts, besides its job's module (Dagster imports them lazily)."""


def _reap(_signum: int, _frame: Any) -> None:
    """Every command process that ended is reaped at once: a zombie would still look alive to the watchdog (and
    to `locking.owner.provably_dead`) until someone waited for it."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def preload(cli: CommandLine) -> None:
    """Import what the commands import, with the collector off, and move it out of the collector's reach
    (cli/startup.py): the CLI's every command group, every product job's module, the instance's storage and the
    run's execution."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        from batch_assets.orchestration.instance_home import (
            no_template_highlighting,
            preload_instance_storage,
            read_alembic_scripts,
        )

        no_template_highlighting()
        from batch_assets.reference.project import JOB_MODULES

        cli.build_parser()  # every command group and what its options import
        for module in (*JOB_MODULES, *RUN_MODULES):
            try:
                importlib.import_module(module)
            except ImportError:  # best effort: a module a later Dagster moves is imported by the command
                continue
        preload_instance_storage()
        read_alembic_scripts()
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _sources() -> dict[str, float]:
    """The modification time of every imported module's source file."""
    times = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path:
            try:
                times[path] = os.stat(path).st_mtime
            except OSError:
                continue
    return times


def _changed(since: dict[str, float]) -> str | None:
    for path, mtime in since.items():
        try:
            if os.stat(path).st_mtime != mtime:
                return path
        except OSError:
            return path
    return None


def serve(path: str, cli: CommandLine) -> int:
    """Listen on `path` until SIGTERM or SIGINT; fork a process per command of `cli`. Returns the exit code."""
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGCHLD, _reap)
    started = time.perf_counter()
    preload(cli)
    if threading.active_count() != 1:  # a fork copies only the forking thread: no other may hold a lock
        raise ConfigError(f"{threading.active_count()} threads after the imports; the launcher needs one",
                          field="launcher")
    sources = _sources()
    listener = _listen(path)
    try:
        err(f"launcher: ready on {path} (pid {os.getpid()}, {len(sources)} modules imported in "
              f"{time.perf_counter() - started:.2f}s)")
        while True:
            conn, _ = listener.accept()
            try:
                _serve_one(listener, conn, sources, cli)
            except (OSError, ValueError) as exc:
                err(f"launcher: a request failed: {exc}")
            finally:
                conn.close()
    except _Stop:
        err("launcher: stopped (commands it started go on)")
        return 0
    finally:
        listener.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _listen(path: str) -> socket.socket:
    """A socket bound to `path` for this user only; a stale socket file (nobody listening) is replaced."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)
        else:
            listener.close()
            raise ConfigError(f"another launcher is listening on {path}", field="socket")
        finally:
            probe.close()
    old = os.umask(0o077)
    try:
        listener.bind(path)
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot listen on {path}: {exc.strerror}", field="socket") from None
    finally:
        os.umask(old)
    listener.listen(64)
    return listener


def refusal(request: dict[str, Any], sources: dict[str, float]) -> str | None:
    """Why this launcher's imports do not stand for the client's (None: they do)."""
    mine = interpreter()
    for key in ("executable", "flags", "warnoptions", "xoptions"):
        if request.get(key) != mine[key]:
            return f"the client's Python differs in {key}"
    env = request.get("env")
    if not (isinstance(env, dict) and isinstance(request.get("argv"), list) and isinstance(request.get("cwd"), str)):
        return "a malformed request"
    theirs, ours = import_time(env), import_time(dict(os.environ))
    differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
    if differ:
        return f"the environment differs in {', '.join(differ)}, read when modules are imported"
    changed = _changed(sources)
    if changed:
        return f"{changed} changed since the launcher started; restart it"
    return None


def _serve_one(listener: socket.socket, conn: socket.socket, sources: dict[str, float], cli: CommandLine) -> None:
    conn.settimeout(HANDSHAKE_TIMEOUT_S)
    frames = Frames(conn)
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
        request = frames.read() if uid == os.getuid() else None
        reason = "another user" if uid != os.getuid() else refusal(request or {}, sources)
        if request is None or len(frames.fds) != 3 or reason:
            send(conn, {"refused": reason or "no request"})
            return
        pid = os.fork()
        if pid == 0:
            _command_process(listener, conn, frames, request, cli)  # never returns
        err(f"launcher: pid {pid} runs `{' '.join(request['argv'][:2])}`")
    finally:
        for fd in frames.fds:
            os.close(fd)


def _command_process(listener: socket.socket, conn: socket.socket, frames: Frames,
                     request: dict[str, Any], cli: CommandLine) -> None:
    """In the forked process: become the client's CLI process, run its command, report its exit code. Never returns."""
    code = 1
    finished = threading.Event()
    try:
        listener.close()
        for signum in (*FORWARDED_SIGNALS, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)  # the command installs its own, as a fresh process has none
        os.setsid()  # its own process group: killed as a whole when the client dies
        for target, fd in zip((0, 1, 2), frames.fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)  # the launcher's own 0-2 are open: what came in is numbered above them
        frames.fds.clear()
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()
        os.chdir(request["cwd"])
        sys.argv = ["batch-assets", *request["argv"]]
        _reopen_standard_streams()
        conn.settimeout(None)
        send(conn, {"pid": os.getpid()})
        threading.Thread(target=_watch_client, args=(frames, finished), name="batch-assets-client", daemon=True).start()
        logging.root.handlers.clear()  # main() configures logging on this process's stderr
        code = cli.main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # a defect: one line, as main() gives one
        print(f"error: unexpected {type(exc).__name__} in the launcher's command process", file=sys.stderr)
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        finished.set()
        try:
            send(conn, {"exit": code})
        except OSError:
            pass
        os._exit(code)


def _reopen_standard_streams() -> None:
    """sys.stdin/stdout/stderr anew on the client's descriptors, buffered as Python buffers them at start-up."""
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False, buffering=1 if os.isatty(1) else -1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1, errors="backslashreplace")  # noqa: SIM115


def _watch_client(frames: Frames, finished: threading.Event) -> None:
    """Signals from the client are raised here; a client gone (the stream ends) takes the process group down."""
    for message in _messages(frames):
        signum = message.get("signal")
        if isinstance(signum, int) and signum in FORWARDED_SIGNALS:
            os.kill(os.getpid(), signum)
    if not finished.is_set():
        os.killpg(0, signal.SIGKILL)


def _messages(frames: Frames) -> Iterator[dict[str, Any]]:
    while True:
        try:
            message = frames.read()
        except (OSError, ValueError):
            return
        if message is None:
            return
        yield message


def cmd_launcher(args: Any, _settings: Any, *, cli: CommandLine) -> int:
    path = (args.socket or os.environ.get(LAUNCHER_VAR, "")).strip()
    if not path:
        raise ConfigError(f"give --socket PATH or set {LAUNCHER_VAR}", field="socket")
    return serve(os.path.abspath(path), cli)


def register(sub: Any, cli: CommandLine) -> None:
    """`batch-assets launcher`, serving the commands of `cli`."""
    p = sub.add_parser("launcher", help="the resident launcher: commands start without importing (cli/launcher.py)")
    p.add_argument("--socket", default=None,
                   help=f"the Unix socket to listen on (default: ${LAUNCHER_VAR}, which clients read to use it)")
    p.set_defaults(func=partial(cmd_launcher, cli=cli))
