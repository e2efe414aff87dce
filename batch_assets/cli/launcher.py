"""The resident launcher: every CLI command in a process forked from one that has imported them all (issue 20).

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
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from batch_assets.cli.output import err
from batch_assets.settings import LAUNCHER_VAR

HANDSHAKE_TIMEOUT_S = 5.0
"""The client waits this long for the launcher to start its command before it runs the command itself."""
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "LC_", "DAGSTER_")
IMPORT_TIME_VARIABLES = ("LANG",)
"""Variables that the interpreter, the loader or a module read when it starts or is imported (Dagster reads some
of its DAGSTER_ variables at import), so the launcher's imports stand for a client only with the same values.
DAGSTER_HOME is read when the instance is opened, in the forked process: it may differ. BATCH_ASSETS_ variables
are read by the settings, in the forked process, from the client's environment."""
RUN_TIME_VARIABLES = ("DAGSTER_HOME",)
_HEADER = struct.Struct("!I")
_MAX_FRAME = 16 * 1024 * 1024


# -- frames: a 4-byte length and a JSON object; the request carries the client's stdin, stdout and stderr -------------

def _send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    frame = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [frame], list(fds)) if fds else sock.send(frame)
    if sent < len(frame):
        sock.sendall(frame[sent:])


class _Frames:
    """Reads frames from a socket; the descriptors that came with them are kept in `fds`."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.fds: list[int] = []

    def read(self) -> dict[str, Any] | None:
        """The next frame, or None at the end of the stream."""
        while True:
            if len(self.buffer) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self.buffer)
                if size > _MAX_FRAME:
                    raise ValueError(f"a frame of {size} bytes")
                if len(self.buffer) >= _HEADER.size + size:
                    data = self.buffer[_HEADER.size:_HEADER.size + size]
                    self.buffer = self.buffer[_HEADER.size + size:]
                    message = json.loads(data)
                    if not isinstance(message, dict):
                        raise ValueError("a frame that is not an object")
                    return message
            chunk, fds, _flags, _addr = socket.recv_fds(self.sock, 65536, 3)
            self.fds.extend(fds)
            if not chunk:
                return None
            self.buffer += chunk


def _interpreter() -> dict[str, Any]:
    """What a client's interpreter must share with the launcher's: the executable and the options it started with."""
    return {"executable": sys.executable, "flags": list(sys.flags), "warnoptions": list(sys.warnoptions),
            "xoptions": sorted(f"{k}={v}" for k, v in sys._xoptions.items())}


def _import_time(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if (k.startswith(IMPORT_TIME_PREFIXES) or k in IMPORT_TIME_VARIABLES) and k not in RUN_TIME_VARIABLES}


# -- the client -------------------------------------------------------------------------------------------------------

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
            request = {"argv": list(argv), "env": dict(os.environ), "cwd": os.getcwd(), **_interpreter()}
            sock.connect(path)
            _send(sock, request, fds=(0, 1, 2))
            frames = _Frames(sock)
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


def _wait_for(sock: socket.socket, frames: _Frames, pid: int, argv: Sequence[str]) -> int:
    """Pass signals on to the command's process until it reports its exit code."""
    def forward(signum: int, _frame: Any) -> None:
        try:
            _send(sock, {"signal": signum})
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
    from batch_assets.cli.output import emit, empty_summary, looks_like_job
    from batch_assets.errors import EXIT_FAILED

    error = f"the command's process (pid {pid}, forked by the launcher) ended without an exit code"
    err(f"error: {error}")
    if looks_like_job(argv):
        emit(empty_summary("FAILURE", error=error))
    return EXIT_FAILED


# -- the launcher: `batch-assets launcher` ----------------------------------------------------------------------------

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


def preload() -> None:
    """Import what the commands import, with the collector off, and move it out of the collector's reach
    (cli/startup.py): the CLI's every command group, every product job's module, the instance's storage and the
    run's execution."""
    import importlib

    enabled = gc.isenabled()
    gc.disable()
    try:
        from batch_assets.orchestration.instance_home import (
            no_template_highlighting,
            preload_instance_storage,
            read_alembic_scripts,
        )

        no_template_highlighting()
        from batch_assets.cli.main import build_parser
        from batch_assets.reference.project import JOB_MODULES

        build_parser()  # every command group and what its options import
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


def serve(path: str) -> int:
    """Listen on `path` until SIGTERM or SIGINT; fork a process per command. Returns the exit code."""
    from batch_assets.errors import ConfigError

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGCHLD, _reap)
    started = time.perf_counter()
    preload()
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
                _serve_one(listener, conn, sources)
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
    from batch_assets.errors import ConfigError

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
    mine = _interpreter()
    for key in ("executable", "flags", "warnoptions", "xoptions"):
        if request.get(key) != mine[key]:
            return f"the client's Python differs in {key}"
    env = request.get("env")
    if not (isinstance(env, dict) and isinstance(request.get("argv"), list) and isinstance(request.get("cwd"), str)):
        return "a malformed request"
    theirs, ours = _import_time(env), _import_time(dict(os.environ))
    differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
    if differ:
        return f"the environment differs in {', '.join(differ)}, read when modules are imported"
    changed = _changed(sources)
    if changed:
        return f"{changed} changed since the launcher started; restart it"
    return None


def _serve_one(listener: socket.socket, conn: socket.socket, sources: dict[str, float]) -> None:
    conn.settimeout(HANDSHAKE_TIMEOUT_S)
    frames = _Frames(conn)
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
        request = frames.read() if uid == os.getuid() else None
        reason = "another user" if uid != os.getuid() else refusal(request or {}, sources)
        if request is None or len(frames.fds) != 3 or reason:
            _send(conn, {"refused": reason or "no request"})
            return
        pid = os.fork()
        if pid == 0:
            _command_process(listener, conn, frames, request)  # never returns
        err(f"launcher: pid {pid} runs `{' '.join(request['argv'][:2])}`")
    finally:
        for fd in frames.fds:
            os.close(fd)


def _command_process(listener: socket.socket, conn: socket.socket, frames: _Frames,
                     request: dict[str, Any]) -> None:
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
        _send(conn, {"pid": os.getpid()})
        threading.Thread(target=_watch_client, args=(frames, finished), name="batch-assets-client", daemon=True).start()
        import logging

        logging.root.handlers.clear()  # main() configures logging on this process's stderr
        from batch_assets.cli.main import main

        code = main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # a defect: one line, as main() gives one
        print(f"error: unexpected {type(exc).__name__} in the launcher's command process", file=sys.stderr)
    finally:
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        finished.set()
        try:
            _send(conn, {"exit": code})
        except OSError:
            pass
        os._exit(code)


def _reopen_standard_streams() -> None:
    """sys.stdin/stdout/stderr anew on the client's descriptors, buffered as Python buffers them at start-up."""
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False, buffering=1 if os.isatty(1) else -1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1, errors="backslashreplace")  # noqa: SIM115


def _watch_client(frames: _Frames, finished: threading.Event) -> None:
    """Signals from the client are raised here; a client gone (the stream ends) takes the process group down."""
    for message in _messages(frames):
        signum = message.get("signal")
        if isinstance(signum, int) and signum in FORWARDED_SIGNALS:
            os.kill(os.getpid(), signum)
    if not finished.is_set():
        os.killpg(0, signal.SIGKILL)


def _messages(frames: _Frames) -> Iterator[dict[str, Any]]:
    while True:
        try:
            message = frames.read()
        except (OSError, ValueError):
            return
        if message is None:
            return
        yield message


def cmd_launcher(args: Any, _settings: Any) -> int:
    from batch_assets.errors import ConfigError

    path = (args.socket or os.environ.get(LAUNCHER_VAR, "")).strip()
    if not path:
        raise ConfigError(f"give --socket PATH or set {LAUNCHER_VAR}", field="socket")
    return serve(os.path.abspath(path))


def register(sub: Any) -> None:
    p = sub.add_parser("launcher", help="the resident launcher: commands start without importing (cli/launcher.py)")
    p.add_argument("--socket", default=None,
                   help=f"the Unix socket to listen on (default: ${LAUNCHER_VAR}, which clients read to use it)")
    p.set_defaults(func=cmd_launcher)
