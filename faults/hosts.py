"""Several hosts on one machine: a rig anyone can run as root, `make hosts` / `python -m faults.hosts`.

Each test host is a network namespace (`ip netns`) joined to the machine by a veth pair on a private
subnet (10.231.<n>.0/24: the machine's end .1, the host's .2, the host's default route via .1), with a pid,
uts and mount namespace of its own inside it (`unshare --pid --uts --mount --mount-proc --fork`, so its
processes see their own pids in /proc and `hostname` is `ba-host-<n>`). The machine's services listen on
127.0.0.1 only and this machine has no iptables/nftables to NAT with, so the rig forwards TCP in user space
from each host's gateway address (10.231.<n>.1:<port>) to 127.0.0.1:<port>: PostgreSQL, RabbitMQ and the
limits stubs. A kill -9 of a host's processes closes their sockets, as a host that dies does.

What it runs (the scenarios, each checked; `docs/hosts.md` is their report):

- **sweep**: a Celery worker per host for `customer_status_sweep_celery_job` on the machine's RabbitMQ (a vhost
  of the rig's own), a full sweep of `--rows` rows in `--ranges` ranges launched from the machine; once one
  host's range is in its middle, every process of that host gets SIGKILL. Expected: a run started from
  another host meanwhile exits 75 (the lock and lease are not taken over), the run ends FAILURE naming the
  ranges that did not finish, the next run resumes every range from its checkpoint and ends SUCCESS, and the
  campaign's checker (faults/checker.py) finds 0 rows lost, stale or duplicated.
- **queue**: `batch-assets queue work` on each host, each against a limits stub of its own that records every
  POST with its Idempotency-Key; one host is killed while its calls are in flight. Expected: its claims are
  done by the other hosts once their lease (the worker's `claim_lease_s`, read from the settings) lapsed,
  every payment DONE once, at most one duplicate POST per killed call, with the same Idempotency-Key.

Everything it creates (namespaces, veths, processes, forwarders, the vhost, its database) is removed in a
`finally`, also on SIGINT/SIGTERM, each by its name or id; debris of an earlier run (names `bah1`..`bah9`)
is removed before it starts. Exit 0 when every check held, 1 otherwise, 2 on bad arguments, 77 when the
machine cannot host the rig (not root, no `ip netns`, no RabbitMQ).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import sqlalchemy as sa

from batch_assets.settings import environ_without_product
from faults import checker
from faults.brokers import RabbitVhost, TcpProxy
from faults.product import REPO, CliResult, Running, cli_path, tested_tree
from faults.services import LimitsStub

PREFIX = "bah"
"""Names of the rig's namespaces and veths: bah<n> (netns), bah<n>o / bah<n>i (the veth's two ends)."""
SUBNET = "10.231"
MAX_HOSTS = 9
EXIT_UNAVAILABLE = 77
DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_AMQP = ("127.0.0.1", 5672)
SWEEP_JOB_KEY = "customer_status_sweep"
DEFAULT_ROWS, DEFAULT_RANGES, DEFAULT_PAYMENTS = 2_000_000, 6, 3_000
WORKER_LOST_S = 20.0
"""The celery executor's worker_lost_s in the rig (the product's default is 30 s)."""
DAY = date.today


def log(message: str) -> None:
    print(f"[hosts {datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def unavailable_reason() -> str | None:
    """Why this machine cannot run the rig (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, unshare)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (ip) and util-linux (unshare)"
    probe = f"{PREFIX}probe{os.getpid() % 1000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns does not work here: {made.stderr.strip()[:200]}"
    _ip("netns", "del", probe, check=False)
    return None


class Forwarder(TcpProxy):
    """faults.brokers.TcpProxy, listening on a host's gateway address instead of 127.0.0.1 (always "up")."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.mode = "up"
        self.server = socket.create_server(listen)
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name=f"forward-{listen[0]}:{listen[1]}").start()

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        """Shut the socket down before closing it: a close alone leaves it open while the other direction's thread
        is blocked in recv() on it, and the service would never see a dead host's connection end."""
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected (any more)
        TcpProxy._reset(sock)

    def close(self) -> None:
        """Also wake the accept thread (shutdown): a listening socket closed under a blocked accept() stays bound."""
        self.closed.set()
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not listening any more
        super().close()


@dataclass
class TestHost:
    """One test host: netns bah<n>, veth bah<n>o (machine, .1) / bah<n>i (host, .2), hostname ba-host-<n>."""

    index: int
    procs: list[subprocess.Popen] = field(default_factory=list)
    forwarders: list[Forwarder] = field(default_factory=list)

    @property
    def netns(self) -> str:
        return f"{PREFIX}{self.index}"

    @property
    def gateway(self) -> str:
        return f"{SUBNET}.{self.index}.1"

    @property
    def address(self) -> str:
        return f"{SUBNET}.{self.index}.2"

    @property
    def hostname(self) -> str:
        return f"ba-host-{self.index}"

    def up(self) -> None:
        name, outside, inside = self.netns, f"{self.netns}o", f"{self.netns}i"
        _ip("netns", "add", name)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", name)
        _ip("addr", "add", f"{self.gateway}/24", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("-n", name, "addr", "add", f"{self.address}/24", "dev", inside)
        _ip("-n", name, "link", "set", inside, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "route", "add", "default", "via", self.gateway)

    def forward(self, port: int, target_port: int | None = None) -> None:
        """Forward gateway:port (reachable from the host) to 127.0.0.1:target_port on the machine."""
        self.forwarders.append(Forwarder((self.gateway, port), ("127.0.0.1", target_port or port)))

    def start(self, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
        """`argv` inside the host: its netns, then new pid, uts and mount namespaces, hostname set."""
        wrapper = ["ip", "netns", "exec", self.netns, "unshare", "--pid", "--uts", "--mount", "--mount-proc",
                   "--fork", "--kill-child", "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname, *argv]
        with log_path.open("ab") as out:
            proc = subprocess.Popen(wrapper, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        """Every process in the host's network namespace (`ip netns pids`), as the machine numbers them."""
        found = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in found.stdout.split()] if found.returncode == 0 else []

    def kill9(self) -> list[int]:
        """SIGKILL every process of the host, each by its pid; returns the pids."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def down(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        killed = self.kill9()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                log(f"{self.hostname}: pid {proc.pid} did not end")
        self.procs = []
        # A killed process whose parent was killed too is reparented to the machine's init, which reaps it when it
        # gets to it: until then it is a zombie (it runs nothing and holds nothing). Wait until each is no more alive.
        if not _wait_for(lambda: not [pid for pid in killed if process_alive(pid)], timeout=20, poll=0.05):
            log(f"{self.hostname}: still alive after SIGKILL: {[pid for pid in killed if process_alive(pid)]}")
        for forwarder in self.forwarders:
            forwarder.close()
        self.forwarders = []
        remove_netns(self.index)


def process_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (state Z) or dead (X): a zombie has ended and awaits its reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}


def remove_netns(index: int) -> None:
    """Remove netns bah<index> and its veth if they exist, killing what still runs in it (by pid)."""
    name = f"{PREFIX}{index}"
    found = _ip("netns", "pids", name, check=False)
    for pid in found.stdout.split() if found.returncode == 0 else []:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    _ip("netns", "del", name, check=False)
    _ip("link", "del", f"{name}o", check=False)


def remove_debris(indexes: range = range(1, MAX_HOSTS + 1)) -> list[str]:
    """Namespaces and veths a previous run left behind (names bah<index>); returns what was removed."""
    listed = _ip("netns", "list", check=False).stdout.split()
    links = _ip("-o", "link", "show", check=False).stdout
    removed = []
    for index in indexes:
        name = f"{PREFIX}{index}"
        if name in listed or f" {name}o@" in links or f" {name}o:" in links:
            remove_netns(index)
            removed.append(name)
    return removed


# --- the rig: hosts, broker vhost, database, product environment -------------------------------


def _with_host(url: str, host: str, database: str | None = None) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    userinfo = netloc[0] + "@" if len(netloc) == 2 else ""
    port = parts.port or 5432
    path = f"/{database}" if database else parts.path
    return urlunsplit((parts.scheme, f"{userinfo}{host}:{port}", path, parts.query, parts.fragment))


class Rig:
    """The hosts, a RabbitMQ vhost, a database and a Dagster home of the rig's own; `close()` removes them all."""

    def __init__(self, workdir: Path, *, hosts: int = 3, database_url: str = DEFAULT_DATABASE_URL,
                 first_index: int = 1) -> None:
        self.workdir = workdir
        self.admin_url = database_url
        self.database = f"ba_hosts_{uuid.uuid4().hex[:8]}"
        self.pg_port = urlsplit(database_url).port or 5432
        if not 1 <= first_index <= first_index + hosts - 1 <= MAX_HOSTS:
            raise ValueError(f"host indexes must lie in 1..{MAX_HOSTS}")
        self.hosts = [TestHost(i) for i in range(first_index, first_index + hosts)]
        self.vhost = RabbitVhost(name=f"ba-hosts-{uuid.uuid4().hex[:8]}")
        self.key = base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")
        self.home = workdir / "home"
        self.started: list[Running] = []
        self.db_created = False
        self._names_lock: Any = None

    # -- lifetime ---------------------------------------------------------------------------

    def open(self) -> None:
        self._hold_names()
        removed = remove_debris(range(self.hosts[0].index, self.hosts[-1].index + 1))
        if removed:
            log(f"removed debris of an earlier run: {', '.join(removed)}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(exist_ok=True)
        self.vhost.start()
        self._create_database()
        for host in self.hosts:
            host.up()
            host.forward(self.pg_port)
            host.forward(DEFAULT_AMQP[1])
        log(f"{len(self.hosts)} hosts up ({', '.join(f'{h.hostname} {h.address}' for h in self.hosts)}); "
            f"database {self.database}; RabbitMQ vhost {self.vhost.name}")

    def _hold_names(self) -> None:
        """An exclusive lock on the rig's host names: debris is only what no live rig holds (never another run's)."""
        import fcntl

        first, last = self.hosts[0].index, self.hosts[-1].index
        self._names_lock = open(Path(tempfile.gettempdir()) / f"ba-hosts-{PREFIX}{first}-{last}.lock", "w")
        try:
            fcntl.flock(self._names_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._names_lock.close()
            self._names_lock = None
            raise RuntimeError(f"another rig runs on {PREFIX}{first}..{PREFIX}{last}: wait for it to end") from None

    def close(self) -> None:
        if self._names_lock is None:
            return  # the names are another rig's: nothing here is ours to remove
        try:
            self._close()
        finally:
            if self._names_lock is not None:
                self._names_lock.close()  # the flock goes with it
                self._names_lock = None

    def _close(self) -> None:
        for running in self.started:
            if running.running():
                running.kill_group()
        for host in self.hosts:
            try:
                host.down()
            except Exception as exc:  # the rest is still cleaned up
                log(f"cleanup {host.netns}: {type(exc).__name__}: {exc}")
        for step in (self.vhost.stop, self._drop_database):
            try:
                step()
            except Exception as exc:  # the rest is still cleaned up
                log(f"cleanup: {type(exc).__name__}: {exc}")

    def _admin(self, database: str | None = None, *, autocommit: bool = True) -> sa.Engine:
        url = self.admin_url if database is None else _with_host(self.admin_url, urlsplit(self.admin_url).hostname
                                                                  or "127.0.0.1", database)
        options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
        return sa.create_engine(url, poolclass=sa.pool.NullPool, **options)

    def _create_database(self) -> None:
        engine = self._admin()
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{self.database}"')
            self.db_created = True
        finally:
            engine.dispose()

    def _drop_database(self) -> None:
        if not self.db_created:
            return
        engine = self._admin()
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            self.db_created = False
        finally:
            engine.dispose()

    def engine(self) -> sa.Engine:
        """The rig's own connections to its database (a transaction each, for the checker)."""
        return self._admin(self.database, autocommit=False)

    # -- the product's environment -------------------------------------------------------------

    def env(self, host: TestHost | None = None, **extra: str) -> dict[str, str]:
        """The product's environment on the machine (host None) or inside `host` (services via its gateway)."""
        base = environ_without_product()
        address = "127.0.0.1" if host is None else host.gateway
        base.update({
            "BATCH_ASSETS_DATABASE_URL": _with_host(self.admin_url, address, self.database),
            "BATCH_ASSETS_ENCRYPTION_KEY": self.key,
            "BATCH_ASSETS_HOME": str(self.home),
            "BATCH_ASSETS_AUTOMATION": "off",
            "PYTHONPATH": os.pathsep.join([str(self.workdir / "celery"), str(REPO)]),
            **extra,
        })
        return base

    def broker_url(self, host: TestHost | None = None) -> str:
        url = self.vhost.url()
        return url if host is None else url.replace(f"@{self.vhost.host}:", f"@{host.gateway}:", 1)

    def cli(self, *args: str, timeout: float = 600, env: dict[str, str] | None = None) -> CliResult:
        running = Running(args, env or self.env(), self.workdir / "cli")
        self.started.append(running)
        return running.finish(timeout)

    def must(self, *args: str, timeout: float = 600) -> CliResult:
        result = self.cli(*args, timeout=timeout)
        if result.rc != 0:
            raise RuntimeError(f"`batch-assets {' '.join(args)}` failed: {result.brief()} {result.stderr_tail()}")
        return result

    def host_cli(self, host: TestHost, *args: str, timeout: float = 120, **extra: str) -> CliResult:
        """`batch-assets ARGS` inside `host`, to its end (its JSON line is on stdout)."""
        out = self.workdir / f"{host.netns}-{uuid.uuid4().hex[:6]}.out"
        proc = host.start([cli_path(), *args], self.env(host, **extra), out)
        started = time.monotonic()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait(timeout=20)
        text = out.read_text(errors="replace")
        return CliResult(list(args), rc, text, "", time.monotonic() - started)

    def start_celery_workers(self, concurrency: int = 2) -> None:
        """One `celery -A dagster_celery.app worker -Q dagster` per host, its broker through the host's gateway."""
        celery = str(Path(sys.executable).parent / "celery")
        for host in self.hosts:
            config = self.workdir / "celery" / host.netns
            config.mkdir(parents=True, exist_ok=True)
            # dagster_celery's app reads dagster_celery_config when importable (what `dagster-celery worker -y` writes).
            (config / "dagster_celery_config.py").write_text(
                f"broker_url = {self.broker_url(host)!r}\nresult_backend = 'rpc://'\n")
            env = self.env(host, PYTHONPATH=os.pathsep.join([str(config), str(REPO)]))
            host.start([celery, "-A", "dagster_celery.app", "worker", "-Q", "dagster", "--prefetch-multiplier=1",
                        "--concurrency", str(concurrency), "--loglevel", "INFO", "--without-gossip",
                        "--without-mingle", "-n", f"{host.hostname}@%h"], env, self.workdir / f"{host.netns}.log")
        deadline = time.monotonic() + 120
        for host in self.hosts:
            log_path = self.workdir / f"{host.netns}.log"
            while b"ready." not in log_path.read_bytes():
                if time.monotonic() > deadline or all(p.poll() is not None for p in host.procs):
                    raise RuntimeError(f"celery worker on {host.hostname} did not start: "
                                       f"{log_path.read_text(errors='replace')[-1500:]}")
                time.sleep(0.2)  # polling interval of a deadline loop
        log(f"celery workers ready on {', '.join(h.hostname for h in self.hosts)} (concurrency {concurrency} each)")

    def launch_sweep(self, mode: str, run_date: str, ranges: int, tag: str) -> Running:
        """The sweep on the celery job, launched from the machine (`python -m faults.hosts launch`)."""
        args = ["launch", "--mode", mode, "--run-date", run_date, "--ranges", str(ranges), "--broker",
                self.broker_url(), "--tag", tag]
        running = Running(args, self.env(), self.workdir / "cli", command=[sys.executable, "-m", "faults.hosts"])
        self.started.append(running)
        return running


@contextmanager
def rig(workdir: Path, **kwargs: Any) -> Iterator[Rig]:
    """A Rig opened, and closed whatever happens (SIGTERM is turned into KeyboardInterrupt meanwhile)."""
    r = Rig(workdir, **kwargs)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        r.open()
        yield r
    finally:
        r.close()
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# --- the timeline -------------------------------------------------------------------------------


@dataclass
class Timeline:
    events: list[tuple[float, str, str]] = field(default_factory=list)
    zero: float | None = None

    def add(self, what: str, detail: str = "", at: float | None = None) -> float:
        """Record an event (at `at`, an epoch time, when it happened before now)."""
        now = time.time() if at is None else at
        self.events.append((now, what, detail))
        log(f"{what}: {detail}" if detail else what)
        return now

    def rows(self) -> list[str]:
        zero = self.zero or (self.events[0][0] if self.events else 0.0)
        lines = ["| time (UTC) | since the kill | event | detail |", "|---|---:|---|---|"]
        for at, what, detail in sorted(self.events):
            stamp = datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")[:-3]
            lines.append(f"| {stamp} | {at - zero:+.1f} s | {what} | {detail.replace('|', '/')} |")
        return lines


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Scenario:
    name: str
    timeline: Timeline = field(default_factory=Timeline)
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    report: checker.Report = field(default_factory=checker.Report)
    error: str | None = None

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        log(f"check {'ok' if ok else 'FAILED'}: {name}: {detail}")
        return bool(ok)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)


def holders(engine: sa.Engine, job_key: str) -> dict[str, tuple[str, float]]:
    """The job's lease and lock: owner and seconds until they lapse (negative: lapsed), by the database clock."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT 'lease', owner, extract(epoch FROM expires_at - now())::float8 FROM ba_leases WHERE name = %(n)s "
            "UNION ALL SELECT 'lock', owner, extract(epoch FROM lock_until - now())::float8 FROM ba_job_locks "
            "WHERE name = %(n)s", {"n": job_key}).all()
    return {kind: (owner, float(left)) for kind, owner, left in rows}


class HolderWatch:
    """Polls the job's lease and lock every second; every change of owner or renewal is kept with its time."""

    def __init__(self, engine: sa.Engine, job_key: str) -> None:
        self.engine, self.job_key = engine, job_key
        self.samples: list[tuple[float, dict[str, tuple[str, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="holder-watch")

    def start(self) -> HolderWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), holders(self.engine, self.job_key)))
            except sa.exc.SQLAlchemyError:
                pass  # the next poll tries again
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def owners(self, since: float) -> set[str]:
        return {owner for at, held in self.samples if at >= since for owner, _ in held.values()}

    def gone_at(self, kind: str, since: float) -> tuple[float | None, str]:
        """When `kind` stopped being live after `since`: (time, 'released' | 'expired'), or (None, '')."""
        for at, held in self.samples:
            if at < since:
                continue
            if kind not in held:
                return at, "released"
            if held[kind][1] < 0:
                return at, "expired"
        return None, ""


# --- scenario 1: a host lost in the middle of a range ------------------------------------------------


def range_progress(engine: sa.Engine, run_started: datetime) -> dict[str, int]:
    """Rows scanned per range key of the sweep since the run started (the checkpoints' counters)."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT range_key, coalesce((counters->>'scanned')::bigint, 0) FROM ba_checkpoints "
            "WHERE sweep = 'customer_status' AND updated_at >= %(t)s ORDER BY range_key", {"t": run_started}).all()
    return {str(k): int(n) for k, n in rows}


def steps_by_host(run_id: str, home: Path) -> dict[str, str]:
    """step key -> host name of the celery worker that took it, from the run's Dagster event log."""
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(home / "dagster_home")
    with dg.DagsterInstance.get() as instance:
        records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records
    found: dict[str, str] = {}
    for record in records:
        entry = record.event_log_entry
        event = entry.dagster_event
        data = event.engine_event_data if event is not None and event.is_engine_event else None
        worker = (data.metadata or {}).get("Celery worker") if data is not None else None
        if worker is not None and entry.step_key:
            found[entry.step_key] = str(getattr(worker, "value", worker)).split("@", 1)[0]
    return found


def find_run(home: Path, tag: str, timeout: float) -> str | None:
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(home / "dagster_home")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Only once the launcher created the instance's storage (its marker): two processes creating a fresh SQLite
        # storage at once race in its migration.
        if (home / "dagster_home" / ".batch_assets_initialised").exists():
            with dg.DagsterInstance.get() as instance:
                runs = instance.get_runs(filters=dg.RunsFilter(tags={"batch_assets/hosts_rig": tag}), limit=1)
            if runs:
                return runs[0].run_id
        time.sleep(0.5)  # polling interval of a deadline loop
    return None


def _error_lines(path: Path, n: int = 3) -> str:
    """The last `n` lines of a log that are not traceback frames (the exception itself)."""
    lines = [line for line in path.read_text(errors="replace").splitlines()
             if line.strip() and not line.startswith((" ", "\t", "Traceback"))]
    return " | ".join(lines[-n:])[-1200:]


def _wait_for(predicate: Any, timeout: float, poll: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)  # polling interval of a deadline loop
    return None


def _mapping_key(step: str) -> str:
    return step.split("[", 1)[1].rstrip("]") if "[" in step else step


def sweep_scenario(r: Rig, *, rows: int, ranges: int, kill_at: float = 0.35, run_date: str | None = None) -> Scenario:
    """A full sweep across the hosts; one host killed -9 mid-range; FAILURE; no takeover; resume; checker."""
    sc = Scenario("sweep")
    rd = run_date or DAY().isoformat()
    t = time.monotonic()
    r.must("db", "migrate")
    r.must("seed", "customers", "--rows", str(rows), "--run-date", rd, "--seed", "20")
    sc.facts.update(rows=rows, ranges=ranges, run_date=rd, seed_s=round(time.monotonic() - t, 1))
    log(f"seeded {rows:,} customers in {sc.facts['seed_s']} s")
    engine = r.engine()
    try:
        with engine.connect() as conn:
            baseline = checker.take_baseline(conn)
        r.start_celery_workers()
        _sweep_kill_and_resume(r, sc, engine, rows=rows, ranges=ranges, kill_at=kill_at, run_date=rd)
        with engine.connect() as conn:
            sc.report = checker.check_customers(conn, r.key, date.fromisoformat(rd), checker.DEFAULT_RULES, baseline)
        sc.check("0 rows lost, duplicated or stale (faults/checker.py)", sc.report.ok,
                 f"rows lost {sc.report.rows_lost}, duplicates {sc.report.duplicates}, stale {sc.report.stale}; "
                 f"{sc.report.describe()[:300]}; transitions {sc.report.info['transitions']:,}")
    finally:
        engine.dispose()
    return sc


def _settings_bounds() -> dict[str, float]:
    """The lock and lease TTLs and heartbeat the product runs with (its SweepSettings defaults)."""
    from batch_assets.engine.settings import SweepSettings

    s = SweepSettings()
    return {"lease_ttl_s": s.lease_ttl_s, "lock_ttl_s": s.lock_ttl_s, "heartbeat_s": s.heartbeat_s}


def _readme_says(bounds: dict[str, float]) -> bool:
    """The README's crash-recovery numbers are the product's settings (lock-at-most-for, lease, heartbeat)."""
    text = (REPO / "README.md").read_text()
    return (f"lock-at-most-for {bounds['lock_ttl_s']:.0f} s" in text
            and f"lease after {bounds['lease_ttl_s']:.0f} s" in text
            and f"every {bounds['heartbeat_s']:.0f} s" in text)


def _sweep_kill_and_resume(r: Rig, sc: Scenario, engine: sa.Engine, *, rows: int, ranges: int, kill_at: float,
                           run_date: str) -> None:
    tl = sc.timeline
    bounds = _settings_bounds()
    sc.facts.update(bounds)
    sc.check("README's lock and lease numbers are the product's settings", _readme_says(bounds),
             f"lock_ttl_s {bounds['lock_ttl_s']:g}, lease_ttl_s {bounds['lease_ttl_s']:g}, heartbeat_s "
             f"{bounds['heartbeat_s']:g} (batch_assets.engine.settings.SweepSettings) against README "
             "\"Crash recovery\"")
    started_at = datetime.now(UTC)
    tag = uuid.uuid4().hex[:10]
    run = r.launch_sweep("full", run_date, ranges, tag)
    tl.add("run launched", f"full sweep, {rows:,} rows in {ranges} ranges, celery executor on RabbitMQ, "
                           f"from the machine (pid {run.pid})")
    run_id = find_run(r.home, tag, timeout=120)
    if run_id is None:
        raise RuntimeError(f"the run did not start: {_error_lines(run.err_path)}")
    per_range = rows / ranges
    victim, victim_steps, keys = _wait_mid_range(r, run, engine, run_id, started_at, per_range * kill_at, per_range)
    watch = HolderWatch(engine, SWEEP_JOB_KEY).start()
    try:
        before = holders(engine, SWEEP_JOB_KEY)
        progress = range_progress(engine, started_at)
        pids = victim.kill9()
        t_kill = tl.add("kill -9", f"every process of {victim.hostname} ({len(pids)} pids: {pids}) while it ran "
                                   f"{', '.join(victim_steps)}; rows scanned per range: "
                                   + ", ".join(f"r{i:03d} {progress.get(k, 0):,}" for i, k in enumerate(keys)))
        tl.zero = t_kill
        sc.facts["victim"] = victim.hostname
        sc.facts["killed_ranges"] = sorted(_mapping_key(s) for s in victim_steps)
        sc.facts["killed_range_keys"] = [keys[int(k[1:4])] for k in sc.facts["killed_ranges"]]
        sc.facts["range_keys"] = keys
        lease_owner = before.get("lease", ("-", 0.0))[0]
        tl.add("lease and lock at the kill", f"owner {lease_owner}; lease lapses in "
               f"{before.get('lease', ('', 0.0))[1]:.0f} s, lock in {before.get('lock', ('', 0.0))[1]:.0f} s "
               "unless renewed (the other ranges renew them: they are the run's, shared by its steps)")
        _probe_takeover(r, sc, victim, run, lease_owner)
        failed = run.finish(timeout=max(600.0, bounds["lock_ttl_s"] * 4))
        _lost_steps(tl, run.err_path)
        t_fail = tl.add("run ended", failed.brief()[:400])
        summary = failed.summary or {}
        unfinished = sorted(summary.get("unfinished_ranges") or [])
        sc.facts["failed_summary"] = {k: summary.get(k) for k in ("status", "error", "unfinished_ranges", "scanned")}
        sc.check("the run ends FAILURE naming the killed ranges",
                 summary.get("status") == "FAILURE" and unfinished == sc.facts["killed_ranges"]
                 and all(k in str(summary.get("error")) for k in unfinished),
                 f"status {summary.get('status')}, unfinished_ranges {unfinished}, killed "
                 f"{sc.facts['killed_ranges']}; error: {str(summary.get('error'))[:300]}")
        _expiry(r, sc, watch, engine, t_kill, t_fail, lease_owner, victim)
    finally:
        watch.stop()
    _resume(r, sc, run_date, ranges)


def _lost_steps(tl: Timeline, err_path: Path) -> None:
    """The celery executor's "stopped reporting step" errors in the launcher's log, at their own (second) times."""
    seen: set[str] = set()
    for line in err_path.read_text(errors="replace").splitlines():
        step = line.split("stopped reporting step ", 1)[-1].split(" ", 1)[0] if "stopped reporting step" in line else ""
        if not step or step in seen:
            continue  # the run's failure repeats each message: the first is when it was declared
        seen.add(step)
        try:
            at = datetime.strptime(line[:25], "%Y-%m-%d %H:%M:%S %z").timestamp()
        except ValueError:
            at = None
        message = line[line.index("celery worker"):] if "celery worker" in line else line
        tl.add("step declared lost by the run", message.split(" before its result")[0], at=at)


def _wait_mid_range(r: Rig, run: Running, engine: sa.Engine, run_id: str, started_at: datetime, target: float,
                    per_range: float) -> tuple[TestHost, list[str], list[str]]:
    """Wait until one host runs ranges that are all mid-way, one past `target` rows: (host, its steps, range keys)."""
    by_name = {h.hostname: h for h in r.hosts}

    def ready() -> tuple[TestHost, list[str], list[str]] | None:
        if not run.running():
            raise RuntimeError(f"the run ended before the kill: {run.out_path.read_text(errors='replace')[-600:]} "
                               f"{_error_lines(run.err_path)}")
        steps = {k: v for k, v in steps_by_host(run_id, r.home).items() if k.startswith("sweep_range[")}
        progress = range_progress(engine, started_at)
        keys = sorted(progress)

        def scanned(step: str) -> int:
            index = int(_mapping_key(step)[1:4])
            return progress[keys[index]] if index < len(keys) else 0

        started = [k for k, n in progress.items() if n > 0]
        if len(started) < min(len(keys), 2 * len(r.hosts)):
            return None  # every range that has a worker slot is under way before one host dies
        for host in sorted(set(steps.values()) & set(by_name)):
            mine = sorted(s for s, h in steps.items() if h == host)
            # Every range of the host still mid-way (none near its end), one past the kill point.
            if any(scanned(s) >= target for s in mine) and all(scanned(s) < 0.85 * per_range for s in mine):
                return by_name[host], mine, keys
        return None

    found = _wait_for(ready, timeout=600, poll=0.3)
    if found is None:
        raise RuntimeError("no host's range reached the kill point within 600 s")
    return found


def _probe(r: Rig, sc: Scenario, victim: TestHost, when: str) -> int:
    """A sweep started on another host (in-process CLI); while the lost host's lease and lock live it must exit 75."""
    other = next(h for h in r.hosts if h is not victim)
    got = r.host_cli(other, "sweep", "customer-status", "--mode", "full", "--run-date", sc.facts["run_date"],
                     timeout=120)
    summary = got.summary or {}
    detail = str(summary.get("reason") or summary.get("error") or summary.get("status") or got.stdout[-300:])
    sc.timeline.add(f"takeover probe from {other.hostname} ({when})", f"exit {got.rc}: {detail[:200]}")
    sc.facts.setdefault("probe_exits", []).append(got.rc)
    return got.rc


def _probe_takeover(r: Rig, sc: Scenario, victim: TestHost, run: Running, owner: str) -> None:
    """Sweeps started from another host while the run has not ended (every 15 s, at most 3)."""
    while run.running() and len(sc.facts.get("probe_exits", [])) < 3:
        if _probe(r, sc, victim, "before the run ended") != 75:
            break
        _wait_for(lambda: not run.running(), timeout=15)


def _expiry(r: Rig, sc: Scenario, watch: HolderWatch, engine: sa.Engine, t_kill: float, t_fail: float,
            owner: str, victim: TestHost) -> None:
    """The lease and lock after the failure: left to expire (a lost step is never judged dead), never taken over."""
    if any(left > 5 for _, left in holders(engine, SWEEP_JOB_KEY).values()):
        _probe(r, sc, victim, "after the failure, before the expiry")
    _wait_for(lambda: not any(left > 0 for _, left in holders(engine, SWEEP_JOB_KEY).values()),
              timeout=sc.facts["lock_ttl_s"] + 30, poll=1.0)
    # The watch's own samples must have seen both go (it polls every second).
    _wait_for(lambda: all(watch.gone_at(kind, t_kill)[0] is not None for kind in ("lease", "lock")), timeout=10,
              poll=0.2)
    gone = {}
    for kind in ("lease", "lock"):
        at, how = watch.gone_at(kind, t_kill)
        if at is not None:
            gone[kind] = how
            sc.timeline.add(f"{kind} {how}", f"{at - t_kill:.0f} s after the kill, {at - t_fail:.0f} s after the "
                            "failure" + (" (by the failed run's launcher)" if how == "released" else ""), at=at)
            sc.facts[f"{kind}_gone"] = {"how": how, "after_kill_s": round(at - t_kill, 1),
                                        "after_failure_s": round(at - t_fail, 1)}
    exits = sc.facts.get("probe_exits", [])
    others = {o for o in watch.owners(t_kill) if o != owner}
    sc.check("no other host takes the lock or lease over before they expire",
             bool(exits) and all(rc == 75 for rc in exits) and not others
             and gone == {"lease": "expired", "lock": "expired"},
             f"sweeps from another host meanwhile exited {exits} (75 = SKIPPED: locked by {owner}); owners seen "
             f"after the kill: {sorted(watch.owners(t_kill)) or ['(none)']}; lease {gone.get('lease', '?')}, lock "
             f"{gone.get('lock', '?')} (README: lock-at-most-for {sc.facts['lock_ttl_s']:g} s, lease "
             f"{sc.facts['lease_ttl_s']:g} s after the last renewal)")


def _resume(r: Rig, sc: Scenario, run_date: str, ranges: int) -> None:
    tag = uuid.uuid4().hex[:10]
    run = r.launch_sweep("full", run_date, ranges, tag)
    sc.timeline.add("next run launched", f"the same full sweep, on the {len(r.hosts) - 1} hosts left")
    done = run.finish(timeout=900)
    summary = done.summary or {}
    sc.timeline.add("next run done", done.brief()[:300])
    resumed = summary.get("resumed_from")
    sc.facts["resume_summary"] = {k: summary.get(k) for k in ("status", "scanned", "changed", "unchanged")}
    killed = set(sc.facts.get("killed_range_keys", []))
    keys = sc.facts.get("range_keys", [])
    kinds = _resumed_kinds(resumed, keys)
    sc.check("the next run resumes every range from its checkpoint and ends SUCCESS",
             summary.get("status") == "SUCCESS" and done.rc == 0 and len(keys) == ranges
             and all(kinds[k] == ("checkpoint" if k in killed else "finished") for k in keys),
             f"status {summary.get('status')}, scanned {summary.get('scanned')} (only what the killed ranges had "
             f"left), per range {[kinds[k] for k in keys]} (killed: {sorted(killed)})")


def _resumed_kinds(resumed: Any, keys: list[str]) -> dict[str, str]:
    """range key -> 'finished' | 'checkpoint' | 'start' from a summary's resumed_from (ids only, never dates)."""
    given = resumed if isinstance(resumed, dict) and set(resumed) <= set(keys) else {}
    if len(keys) == 1 and resumed is not None and not given:
        given = {keys[0]: resumed}
    return {k: "start" if given.get(k) is None else ("finished" if given[k] == "finished" else "checkpoint")
            for k in keys}


# --- scenario 2: queue workers on several hosts ------------------------------------------------------


def claim_lease_s() -> float:
    """The worker's claim lease as the product's settings say (the QueueSettings the worker imports, as on disk)."""
    from batch_assets.reference.payments import worker

    return float(worker.QueueSettings().claim_lease_s)


def queue_scenario(r: Rig, *, payments: int, concurrency: int = 4) -> Scenario:
    """3 `queue work` processes, one per host, each with its own limits stub; one killed mid-call."""
    sc = Scenario("queue")
    tl = sc.timeline
    lease = claim_lease_s()
    sc.facts.update(payments=payments, claim_lease_s=lease, concurrency=concurrency)
    r.must("db", "migrate")
    r.must("queue", "enqueue", "--count", str(payments), "--seed", "7")
    engine = r.engine()
    stubs = [LimitsStub(seed=i) for i in range(len(r.hosts))]
    victim = r.hosts[0]
    try:
        with engine.begin() as conn:
            checker.install_done_audit(conn)
        for host, stub in zip(r.hosts, stubs, strict=True):
            stub.start()
            host.forward(stub.port)
        stubs[0].mode, stubs[0].hang_s = "hang", 3600.0  # the victim's calls are held: it dies mid-call
        workers = []
        for host, stub in zip(r.hosts, stubs, strict=True):
            out = r.workdir / f"{host.netns}-queue.out"
            limits = f"http://{host.gateway}:{stub.port}/limits"
            workers.append(host.start([cli_path(), "queue", "work", "--concurrency", str(concurrency),
                                       "--max-seconds", str(int(lease * 2 + 300))],
                                      r.env(host, BATCH_ASSETS_LIMITS_URL=limits), out))
        tl.add("queue workers started", f"one `batch-assets queue work --concurrency {concurrency}` on each of "
                                        f"{', '.join(h.hostname for h in r.hosts)}; {payments:,} payments")
        if not _wait_for(lambda: sum(stubs[0].posts.values()) >= 1, timeout=120, poll=0.02):
            raise RuntimeError("the victim's worker made no call within 120 s")
        pids = victim.kill9()
        t_kill = time.time()
        # Every call of the victim is held at its stub, so all it ever POSTed was in flight when it died; the
        # count is read once it stopped changing (bytes already on their way through the forwarder).
        in_flight = _settled(lambda: set(stubs[0].posts))
        tl.add("kill -9", f"every process of {victim.hostname} ({len(pids)} pids) with {len(in_flight)} call(s) in "
                          "flight at its stub (it holds them: the victim dies mid-call)", at=t_kill)
        tl.zero = t_kill
        killed = _victim_claims(engine, in_flight)
        lapse = max((until for until in killed.values()), default=None)
        tl.add("the victim's claims", f"{len(killed)} PROCESSING under its claim token(s); their lease lapses "
                                      f"{(lapse - t_kill) if lapse else 0:.0f} s after the kill "
                                      f"(claim_lease_s {lease:g}, renewed while the worker lived)")
        done = _wait_for(lambda: _all_done(engine, payments), timeout=lease * 2 + 240, poll=1.0)
        tl.add("every payment DONE" if done else "not every payment DONE",
               f"{_count_done(engine):,}/{payments:,}")
        for proc in workers[1:]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in workers[1:]:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        tl.add("workers stopped", "SIGTERM to the two others")
        _queue_checks(sc, engine, stubs, in_flight, killed, t_kill)
    finally:
        for stub in stubs:
            stub.stop()
        engine.dispose()
    return sc


def _settled(read: Any, timeout: float = 10.0) -> Any:
    """`read()` once two reads 0.5 s apart agree (or at the deadline)."""
    deadline = time.monotonic() + timeout
    last = read()
    while time.monotonic() < deadline:
        time.sleep(0.5)  # the interval between the two reads that must agree
        now = read()
        if now == last:
            return now
        last = now
    return last


def _victim_claims(engine: sa.Engine, in_flight: set[str]) -> dict[str, float]:
    """payment id -> claimed_until (epoch) of every row claimed by the victim (the claim tokens of its calls)."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT id::text, extract(epoch FROM claimed_until)::float8 FROM payments WHERE status = 'PROCESSING' "
            "AND claim_token IN (SELECT claim_token FROM payments WHERE id::text = ANY(%(ids)s))",
            {"ids": sorted(in_flight)}).all()
    return {pid: float(until or 0) for pid, until in rows}


def _count_done(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT count(*) FROM payments WHERE status = 'DONE'").scalar() or 0)


def _all_done(engine: sa.Engine, payments: int) -> bool:
    return _count_done(engine) >= payments


def _queue_checks(sc: Scenario, engine: sa.Engine, stubs: list[LimitsStub], in_flight: set[str],
                  killed: dict[str, float], t_kill: float) -> None:
    posts: Counter[str] = Counter()
    accepted: Counter[str] = Counter()
    for stub in stubs:
        posts.update(stub.posts)
        accepted.update(stub.accepted)
    with engine.connect() as conn:
        sc.report = checker.check_payments(conn, posts, accepted, complete=True)
        done_at = {pid: float(at) for pid, at in conn.exec_driver_sql(
            "SELECT payment_id::text, extract(epoch FROM min(at))::float8 FROM faults_done_log GROUP BY 1")}
    sc.check("every payment DONE, and DONE once", sc.report.ok,
             f"{sc.report.describe()[:300]}; {sc.report.info.get('payments_done', 0):,} DONE")
    dups = {k: n for k, n in posts.items() if n > 1}
    others: Counter[str] = Counter()
    for stub in stubs[1:]:
        others.update(stub.posts)
    sc.check("at most one duplicate POST per killed call, with the same Idempotency-Key, from another host",
             set(dups) <= in_flight and all(n == 2 for n in dups.values()) and all(others[k] == 1 for k in dups),
             f"{len(in_flight)} call(s) killed in flight; {len(dups)} key(s) POSTed twice, all among them: "
             f"{set(dups) <= in_flight}; the second POST of each at another host's stub: "
             f"{all(others[k] == 1 for k in dups)}")
    early = [pid for pid, until in killed.items() if done_at.get(pid, until) < until - 1.0]
    last_done = max((done_at.get(pid, 0.0) for pid in killed), default=t_kill)
    first_done = min((done_at.get(pid, last_done) for pid in killed), default=t_kill)
    sc.timeline.add("the victim's claims done elsewhere",
                    f"{sum(1 for p in killed if p in done_at)}/{len(killed)} DONE, the first "
                    f"{first_done - t_kill:.0f} s and the last {last_done - t_kill:.0f} s after the kill", at=last_done)
    sc.check("the killed claims are done elsewhere only once their lease lapsed",
             bool(killed) and not early and all(p in done_at for p in killed),
             f"{len(killed)} claims of the victim; done before their claimed_until: {len(early)}")


# --- report ------------------------------------------------------------------------------------------


def render(scenarios: list[Scenario], *, command: str, duration_s: float) -> str:
    ok = all(s.ok for s in scenarios)
    out = [
        "# Several hosts: a sweep and the queue with one host lost",
        "",
        "Written by `make hosts` (`python -m faults.hosts`, faults/hosts.py); do not edit by hand. Each test host",
        "is a network namespace joined to the machine by a veth pair (10.231.<n>.2, gateway .1), with pid, uts and",
        "mount namespaces of its own and its own hostname (`ba-host-<n>`); the machine's PostgreSQL, RabbitMQ (a",
        "vhost of the rig's) and limits stubs are reached through each host's gateway. \"kill -9\" is SIGKILL to",
        "every process of one host's network namespace, each by its pid.",
        "",
        f"- command: `{command}`; tree: {tested_tree()}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- result: **{'PASS' if ok else 'FAIL'}** in {duration_s / 60:.1f} min",
        "",
    ]
    for sc in scenarios:
        out += render_scenario(sc)
    return "\n".join(out) + "\n"


SCENARIO_TITLE = {
    "sweep": "A host lost in the middle of a range (customer_status_sweep_celery_job)",
    "queue": "Queue workers on several hosts, one killed mid-call",
}


HIDDEN_FACTS = ("range_keys", "killed_range_keys")
"""Facts the checks use that the report leaves out (the ranges' uuid bounds)."""


def render_scenario(sc: Scenario, level: int = 2) -> list[str]:
    """One scenario's facts, timeline and checks in Markdown, its title at heading `level`."""
    facts = ", ".join(f"{k} {json.dumps(v, default=str)}" for k, v in sc.facts.items() if k not in HIDDEN_FACTS)
    h, sub = "#" * level, "#" * (level + 1)
    out = [f"{h} {SCENARIO_TITLE.get(sc.name, sc.name)}", "", f"Facts: {facts}.", "", f"{sub} Timeline", "",
           *sc.timeline.rows(), "", f"{sub} Checks", "", "| check | verdict | detail |", "|---|---|---|"]
    for c in sc.checks:
        out.append(f"| {c.name} | {'pass' if c.ok else '**FAIL**'} | {c.detail.replace('|', '/')} |")
    if sc.error:
        out += ["", f"Scenario error: {sc.error}"]
    return out + [""]


# --- CLI ---------------------------------------------------------------------------------------------


def run(*, rows: int, ranges: int, payments: int, only: list[str] | None, workdir: Path,
        database_url: str = DEFAULT_DATABASE_URL, first_index: int = 1) -> list[Scenario]:
    """Each scenario on a rig of its own (fresh hosts, vhost and database); an error is reported, not raised.

    `first_index`: the hosts are bah<first_index>.. (make hosts 1-3, the campaign 4-6, the tests 7-9)."""
    scenarios = []
    for name in ("sweep", "queue"):
        if only and name not in only:
            continue
        try:
            with rig(workdir / name, database_url=database_url, first_index=first_index) as r:
                if name == "sweep":
                    scenarios.append(sweep_scenario(r, rows=rows, ranges=ranges))
                else:
                    scenarios.append(queue_scenario(r, payments=payments))
        except Exception as exc:  # the report says what broke; the other scenario still runs
            sc = Scenario(name, error=f"{type(exc).__name__}: {str(exc)[:600]}")
            log(f"{name}: {sc.error}")
            scenarios.append(sc)
    return scenarios


def _launch(args: argparse.Namespace) -> int:
    """The run process of a sweep on the celery job (the machine's side): its JSON summary is the last line."""
    from batch_assets.orchestration.launch import launch_job
    from batch_assets.reference.customer_status.dagster import SweepConfig
    from batch_assets.settings import load_settings

    result = launch_job(
        "customer_status_sweep_job", SweepConfig(mode=args.mode, run_date=args.run_date, ranges=args.ranges),
        settings=load_settings(), executor="celery", tags={"batch_assets/hosts_rig": args.tag},
        executor_config={"broker": args.broker, "worker_lost_s": WORKER_LOST_S},
    )
    print(json.dumps(result.summary, default=str), flush=True)
    return 0 if result.dagster_status == "SUCCESS" else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faults.hosts", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command")
    go = sub.add_parser("run", help="the scenarios (the default command)")
    for parser in (p, go):
        parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="customers of the sweep (default 2M)")
        parser.add_argument("--ranges", type=int, default=DEFAULT_RANGES, help="cursor ranges of the sweep (default 6)")
        parser.add_argument("--payments", type=int, default=DEFAULT_PAYMENTS, help="payments of the queue scenario")
        parser.add_argument("--only", action="append", choices=("sweep", "queue"), default=None)
        parser.add_argument("--report", default=str(REPO / "docs" / "hosts.md"), help="default docs/hosts.md")
        parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL,
                            help="a role that may CREATE DATABASE (the rig creates and drops its own)")
    sub.add_parser("clean", help="remove namespaces and veths an earlier run left behind")
    la = sub.add_parser("launch", help=argparse.SUPPRESS)
    la.add_argument("--mode", required=True)
    la.add_argument("--run-date", required=True)
    la.add_argument("--ranges", type=int, required=True)
    la.add_argument("--broker", required=True)
    la.add_argument("--tag", required=True)
    args = p.parse_args(argv)
    if args.command == "launch":
        return _launch(args)
    reason = unavailable_reason()
    if reason is not None:
        print(f"python -m faults.hosts: {reason}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.command == "clean":
        log(f"removed: {', '.join(remove_debris()) or 'nothing'}")
        return 0
    if not RabbitVhost.available(*DEFAULT_AMQP):
        print("python -m faults.hosts: needs RabbitMQ on 127.0.0.1:5672 and rabbitmqctl", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.rows < args.ranges or not 2 <= args.ranges <= 64 or args.payments < 10:
        print("python -m faults.hosts: --ranges must be 2..64, --rows at least --ranges, --payments at least 10",
              file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="ba-hosts-"))
    workdir.chmod(0o755)
    started = time.monotonic()
    command = f"python -m faults.hosts --rows {args.rows} --ranges {args.ranges} --payments {args.payments}" + (
        "".join(f" --only {o}" for o in args.only or []))
    try:
        scenarios = run(rows=args.rows, ranges=args.ranges, payments=args.payments, only=args.only, workdir=workdir,
                        database_url=args.database_url)
    except KeyboardInterrupt:
        log("interrupted: everything the rig started was removed")
        return 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = Path(args.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(render(scenarios, command=command, duration_s=time.monotonic() - started))
    ok = all(s.ok for s in scenarios)
    log(f"report written to {report}; {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _interrupt)
    sys.exit(main())
