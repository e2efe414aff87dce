"""Helpers shared by the test kinds: polling, stopping a process session, a local limits service, a worker process.

Importable as `helpers` from every test (tests/ is on sys.path: it holds the root conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


# --- one resident launcher per test process ---------------------------------------------------------


class SuiteLauncher:
    """The product's resident launcher (`batch-assets launcher`, cli/launcher.py) for the CLI calls a test runs to
    completion (`_cli.run_cli`): each such call then runs in a process forked from one that imported Dagster and the
    jobs once, instead of importing them again (about 2 s of CPU a call on a slow day, hundreds of calls a suite).

    Started on first use, once per test process (each xdist worker has its own), by
    `batch_assets.bench.startup.running_launcher`, and stopped at the end of the session by the root conftest (SIGTERM,
    then SIGKILL of its process group). The command is the same CLI command either way: same parser, settings from
    the caller's environment, its own Dagster run, its exit code and stdout; a call whose environment the launcher
    cannot serve exactly as a fresh process (another PYTHONPATH, a changed source file) runs in its own process after
    one line on stderr, as the launcher documents. What only a fresh process shows stays tested in fresh processes:
    start-up and imports (tests/dagster/test_cli_startup.py), signals and kills (`CliProcess`), the launcher itself
    (tests/integration/test_launcher.py). BATCH_ASSETS_TEST_LAUNCHER=off runs every call in its own process."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._socket: str | None = None

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` with BATCH_ASSETS_LAUNCHER naming this process's launcher (unless the caller named one itself)."""
        from batch_assets.settings import HOME_VAR, LAUNCHER_VAR, TEST_LAUNCHER_VAR

        if os.environ.get(TEST_LAUNCHER_VAR) == "off" or LAUNCHER_VAR in env:
            return dict(env)
        if self._socket is None:
            from batch_assets.bench.startup import running_launcher
            from batch_assets.settings import environ_without_product

            # A home of its own: the launcher writes its instance file there, not into the checkout's .batch_assets.
            home = self._stack.enter_context(tempfile.TemporaryDirectory(prefix="ba_test_launcher_home_"))
            base = {**environ_without_product(), HOME_VAR: home}
            self._socket = self._stack.enter_context(running_launcher(base))[LAUNCHER_VAR]
        return {**env, LAUNCHER_VAR: self._socket}

    def close(self) -> None:
        self._socket = None
        self._stack.close()


SUITE_LAUNCHER = SuiteLauncher()


# --- polling ---------------------------------------------------------------------------------------


class Watched(Protocol):
    """A process a wait gives up on once it ended (acceptance `_cli.CliProcess`)."""

    popen: subprocess.Popen[Any]

    def running(self) -> bool: ...

    def output(self) -> str: ...


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float = 10.0,
    what: str = "condition",
    interval: float = 0.05,
    alive: Watched | None = None,
) -> T:
    """Poll `predicate` until it returns something truthy and return that; fail after `timeout` s
    (or at once when `alive` ended)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None and not alive.running():
            raise AssertionError(f"the process ended (exit {alive.popen.returncode}) before {what}\n{alive.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)  # the polling interval, not a synchronisation


# Every page write of a sweep waits 0.2 s (a statement trigger on customers): a run's ranges then hold their
# connections, and their pool slots, long enough for a test to see them at the same time.
SLOW_WRITES = """
CREATE FUNCTION ba_test_slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$;
CREATE TRIGGER ba_test_slow AFTER UPDATE ON customers FOR EACH STATEMENT EXECUTE FUNCTION ba_test_slow();
"""


# --- processes -------------------------------------------------------------------------------------


def kill_session(popen: subprocess.Popen[Any]) -> None:
    """SIGKILL the session `popen` leads (started with start_new_session=True: only processes started
    by the test), then reap it."""
    if popen.poll() is None:
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        popen.wait(timeout=30)


def scalar(engine: Any, query: str, **params: Any) -> Any:
    """The first column of the first row of `query` (SQL text, bound `params`), on a connection of its own."""
    import sqlalchemy as sa

    with engine.connect() as conn:
        return conn.execute(sa.text(query), params).scalar()


# --- a resident payment worker in a process of its own (tests of the queue) -------------------------

REPO = Path(__file__).resolve().parent.parent

WORKER_SCRIPT = textwrap.dedent(
    """
    import json, signal, sys, threading
    from batch_assets.db.engine import create_engine
    from batch_assets.reference.payments.handler import HttpLimitsHandler
    from batch_assets.queue.settings import QueueSettings
    from batch_assets.reference.payments.worker import run_worker

    url, limits_url, knobs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    settings = QueueSettings(**knobs)
    handler = HttpLimitsHandler(limits_url, settings.http_timeout_s, max_connections=settings.concurrency)
    result = run_worker(create_engine(url, pool_size=2), settings, handler=handler, stop=stop, drain=False)
    print(json.dumps(result.to_summary("test")), flush=True)
    """
)


class WorkerProcess:
    """The resident worker in a process of its own session (stopped by its own group id)."""

    def __init__(self, db_url: str, limits_url: str, knobs: dict[str, Any], tmp_path: Path) -> None:
        tag = uuid.uuid4().hex[:6]
        self.out_path, self.err_path = tmp_path / f"worker-{tag}.out", tmp_path / f"worker-{tag}.err"
        self._out, self._err = self.out_path.open("w"), self.err_path.open("w")
        self.popen = subprocess.Popen(
            [sys.executable, "-c", WORKER_SCRIPT, db_url, limits_url, json.dumps(knobs)],
            stdout=self._out, stderr=self._err, cwd=REPO, start_new_session=True,
        )

    def stop(self, timeout: float = 60) -> dict[str, Any]:
        """SIGTERM, wait, and return the worker's summary."""
        os.kill(self.popen.pid, signal.SIGTERM)
        self.popen.wait(timeout=timeout)
        self._out.close()
        lines = self.out_path.read_text().strip().splitlines()
        assert self.popen.returncode == 0 and lines, self.err_path.read_text()[-3000:]
        return json.loads(lines[-1])

    def kill_group(self) -> None:
        kill_session(self.popen)
        self._out.close()
        self._err.close()


# --- the job guard's settings ----------------------------------------------------------------------


@dataclass(frozen=True)
class GuardCfg:
    """The fields of locking.guard.GuardSettings, with the tests' defaults."""

    lock_ttl_s: float = 30
    lock_min_s: float = 0
    lock_fail_open: bool = False
    lease_ttl_s: float = 30
    heartbeat_s: float = 5


# --- a local limits service (docs/guide/payment-queue.md) ----------------------------------------------------------


class LimitsStub:
    """A limits service on 127.0.0.1 for the payment handler, running inside `with`: every POST is
    answered `respond(body)` (200 unless a test sets it) after waiting up to `delay_s` on `release`
    (a slow service; set `release` to let calls through at once).

    Records the calls: `keys` (Idempotency-Key, in order), `bodies`, `posts` (POSTs per
    Idempotency-Key, i.e. per payment id), `times` (time.monotonic() at each POST's arrival, in
    order), `max_active` (calls in flight at once) and `active_seen` (calls in flight as each
    arrived). `keep_alive=True` answers HTTP/1.1, so the client may reuse its connections.
    `headers(body)` adds response headers (e.g. Retry-After).
    """

    def __init__(
        self,
        *,
        delay_s: float = 0.0,
        respond: Callable[[dict[str, Any]], int] | None = None,
        keep_alive: bool = False,
        headers: Callable[[dict[str, Any]], dict[str, str]] | None = None,
    ) -> None:
        self.delay_s = delay_s
        self.respond: Callable[[dict[str, Any]], int] = respond or (lambda body: 200)
        self.headers = headers
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.keys: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self.posts: Counter[str] = Counter()
        self.times: list[float] = []
        self.active = 0
        self.max_active = 0
        self.active_seen: list[int] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else {}
                key = self.headers.get("Idempotency-Key", "")
                with stub.lock:
                    stub.keys.append(key)
                    stub.bodies.append(body)
                    stub.posts[key] += 1
                    stub.times.append(time.monotonic())
                    stub.active += 1
                    stub.max_active = max(stub.max_active, stub.active)
                    stub.active_seen.append(stub.active)
                try:
                    if stub.delay_s:
                        stub.release.wait(timeout=stub.delay_s)
                    status = stub.respond(body)
                finally:
                    # The call ends before its answer goes out: a client that starts its next call on
                    # reading the answer is never counted in flight together with this one.
                    with stub.lock:
                        stub.active -= 1
                self.send_response(status)
                for name, value in (stub.headers(body) if stub.headers else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/limits"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def count(self, payment_id: object) -> int:
        """POSTs so far for one payment."""
        with self.lock:
            return self.posts[str(payment_id)]

    def __enter__(self) -> LimitsStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Release the calls still waiting, then shut the server down."""
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


# --- an alert webhook receiver (BATCH_ASSETS_ALERT_WEBHOOK) ------------------------------------------


class AlertWebhook:
    """An HTTP server on 127.0.0.1 recording the JSON body of every POST, running inside `with`.

    `url` is what BATCH_ASSETS_ALERT_WEBHOOK is set to; `received` the bodies, in arrival order. Each
    instance has its own list (no class-level state shared between tests)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        received = self.received

        class _Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/alert"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> AlertWebhook:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def sensor_resources(db_url: str | None = None) -> dict[str, Any]:
    """The resources a sensor tick evaluated by a test gets, as the code location gives them: the test's database
    (None: BATCH_ASSETS_DATABASE_URL), the PostgreSQL lock store and the alert sink (BATCH_ASSETS_ALERT_WEBHOOK as the
    test set it, or log only)."""
    from batch_assets.orchestration.resources import AlertsResource, DatabaseResource, JobLockResource

    return {"database": DatabaseResource(url=db_url), "job_lock": JobLockResource(),
            "alerts": AlertsResource(webhook=os.environ.get("BATCH_ASSETS_ALERT_WEBHOOK") or None)}


def job_with_resources(job_name: str, **overrides: Any) -> Any:
    """A job of the code location (a declared one too) with its resources as `get_job` binds them from this
    process's environment, but for `overrides` (e.g. calendar=CalendarResource(...))."""
    import dagster as dg

    from batch_assets.orchestration.location import resources_of
    from batch_assets.orchestration.project import current
    from batch_assets.settings import load_settings

    spec = current().spec_for(job_name)
    [job] = [j for j in spec.op_jobs if j.name == job_name]
    resources = {**resources_of((spec,), load_settings()), **overrides}
    return dg.Definitions(jobs=[job], resources=resources).resolve_job_def(job_name)


# --- a TCP proxy in front of a real service (one home: the fault campaign's) -----------------------------

from faults.brokers import TcpProxy  # noqa: E402

__all__ = ["TcpProxy"]


def write_module(folder: Path, name: str, source: str) -> str:
    """`source` (dedented) as module `name` in `folder` (a test's folder on sys.path); returns the module name."""
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return name
