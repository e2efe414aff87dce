"""The fault campaign: seeded faults at random points of real runs, recovery, independent invariants.

One campaign = one PostgreSQL server (and a Redis, and a limits stub) of its own, a
fresh BATCH_ASSETS_HOME, template databases seeded once through the CLI, and one
database cloned from a template per fault. Every fault is a `FaultSpec`; running
it gives a `FaultResult` (injected or not, the faulted run's outcome, the recovery
runs and their time, the checker's report).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from faults import checker, hosts, writers
from faults.brokers import NatsServer, RabbitVhost, TcpProxy, delivered_ids
from faults.declarations import CATALOGUE, QUICK_CASES
from faults.product import CliResult, Product, Running
from faults.services import LimitsStub, PgServer, RedisServer

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 75
EVALUATION_KINDS = ("missing_data", "invalid_value", "decrypt_failure")
NEW_RULES = (("MINOR", 0), ("YOUNG_ADULT", 21), ("ADULT", 30), ("SENIOR", 60))
NEW_RULES_TEXT = ",".join(f"{c}={a}" for c, a in NEW_RULES)
EDIT_RATE = 400  # edits/s of the concurrent writer: a busy service beside the jobs
PRE_EDITS = 1_000  # settled rows edited once before a delta (then due), edited again while it runs
PG_FAULTS = ("kill9", "sigterm", "terminate", "restart_fast", "restart_immediate")
FAULT_LABEL = {
    "kill9": "kill -9",
    "sigterm": "SIGTERM",
    "terminate": "pg_terminate_backend",
    "restart_fast": "pg_ctl restart -m fast",
    "restart_immediate": "pg_ctl restart -m immediate",
    "redis_down": "lock store (Redis) down",
    "redis_restart_empty": "lock store restarted empty",
    "redis_between_ranges": "lock store stopped between ranges (--ranges 4)",
    "limits_down": "limits service down",
    "limits_hang": "limits service hanging",
    "limits_flaky": "limits service flaky (50% 503)",
    "limits_503": "limits service 503",
    "write_errors": "write errors on some rows (trigger RAISEs)",
    "concurrent": f"concurrent writer ({EDIT_RATE} encrypted_dob edits/s)",
    "hostile": "hostile rows injected",
    "broker_cut": "broker connection killed mid-batch",
    "broker_mute": "broker confirm never arrives (timeout)",
    "broker_down": "broker unreachable before the first batch",
    "broker_stop": "broker stopped mid-batch, started again",
    "host_lost": "kill -9 of every process of one host (of 3, namespaces)",
    "missing_privileges": "missing privileges (a role lacking one grant)",
    "hostile_decl": "hostile declaration",
}
BROKER_FAULTS = ("broker_down", "broker_cut", "broker_mute", "broker_stop")
BROKERS = ("rabbitmq", "nats")
JOB_LABEL = {"sweep": "sweep", "queue": "queue drain (3 workers)", "expiry": "subscriptions expire",
             "relay": "outbox relay", "hosts": "celery sweep and queue workers on 3 hosts (faults/hosts.py)",
             "decl": "a team's declared job (faults/declarations.py)"}


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def log(message: str) -> None:
    print(f"[faults {datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


@dataclass(frozen=True)
class Sizes:
    customers: int
    subscriptions: int
    payments: int
    recovery_bound_s: float
    fuzz: str  # "all" | "some"


QUICK = Sizes(customers=20_000, subscriptions=10_000, payments=800, recovery_bound_s=90, fuzz="some")
FULL = Sizes(customers=60_000, subscriptions=30_000, payments=2_000, recovery_bound_s=200, fuzz="all")


@dataclass(frozen=True)
class FaultSpec:
    job: str  # sweep | queue | expiry | relay
    fault: str  # a FAULT_LABEL key
    mode: str | None = None  # sweep mode
    at: float = 0.3  # progress fraction at which the fault is injected
    workers: int = 4

    @property
    def label(self) -> str:
        what = JOB_LABEL[self.job] + (f" {self.mode}" if self.mode else "")
        return f"{FAULT_LABEL[self.fault]} · {what}"

    @property
    def group(self) -> str:
        """The report's row: the label, but one row for every hostile declaration (each has its own table)."""
        return f"{FAULT_LABEL[self.fault]} · {JOB_LABEL[self.job]}" if self.job == "decl" else self.label


@dataclass
class FaultResult:
    spec: FaultSpec
    seed: int
    injected: bool = False
    injected_note: str = ""
    faulted: str = ""
    truth_violation: str | None = None
    recovery_runs: int = 0
    recovery_rcs: list[int] = field(default_factory=list)
    recovered: bool = False
    recovery_s: float | None = None
    report: checker.Report = field(default_factory=checker.Report)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    edits: int = 0  # encrypted_dob edits made by the concurrent writer while the run ran
    hostile: dict[str, checker.HostileOutcome] = field(default_factory=dict)
    declaration: checker.DeclarationOutcome | None = None  # a hostile declaration's outcome, command by command

    @property
    def reason(self) -> str:
        """Why a fault failed, in a few words (the table's outcome column)."""
        if self.outcome != "FAIL":
            return ""
        parts = []
        if self.truth_violation:
            parts.append("untruthful SUCCESS" if self.truth_violation.startswith("SUCCESS") else "partial state")
        if not self.recovered:
            parts.append("no recovery")
        if self.declaration is not None:
            found = self.report.violations
            parts += [what for what, kinds in (("outcome", ("command_not_as_expected", "known_failure_passes")),
                                               ("wrong rows", checker.TEAM_ROW_KINDS), ("leaks", ("canary_leak",)))
                      if any(found[k] for k in kinds)]
        elif not self.report.ok:
            parts.append("invariants")
        if any(not o.ok for o in self.hostile.values()):
            parts.append("hostile rows")
        return "+".join(parts)

    @property
    def outcome(self) -> str:
        if self.error:
            return "error"
        if not self.injected:
            return "not injected"
        failed = (bool(self.truth_violation) or not self.recovered or not self.report.ok
                  or any(not o.ok for o in self.hostile.values()))
        if failed and self.declaration is not None and self.declaration.known and \
                "known_failure_passes" not in self.report.violations:
            return "known failure"  # reported with its reason, and it does not fail the campaign
        return "FAIL" if failed else "pass"


# --- progress probes -----------------------------------------------------------------


class Probe:
    """A polled count on the scenario's database (a fresh connection each time: faults cut them)."""

    def __init__(self, pg: PgServer, database: str, query: str, params: dict[str, Any] | None = None) -> None:
        self.engine = pg.admin_engine(database)
        self.query = sa.text(query)
        self.params = params or {}

    def value(self) -> int | None:
        try:
            with self.engine.connect() as conn:
                return int(conn.execute(self.query, self.params).scalar() or 0)
        except sa.exc.SQLAlchemyError:
            return None

    def close(self) -> None:
        self.engine.dispose()


def wait_progress(probe: Probe, target: int, procs: list[Running], timeout: float) -> tuple[bool, int | None]:
    """Poll until the count reaches `target`; False when every process ended first (nothing to inject into)."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = probe.value()
        if value is not None and value >= target:
            return True, value
        if not any(p.running() for p in procs):
            return False, value
        time.sleep(0.03)  # polling interval
    return False, value


# --- the campaign ----------------------------------------------------------------------


class Campaign:
    def __init__(self, root: Path, seed: int, sizes: Sizes, *, use_redis: bool = True) -> None:
        self.root = root
        self.seed = seed
        self.sizes = sizes
        self.rng = random.Random(seed)
        self.run_date = datetime.now(UTC).date()
        self.pg = PgServer(root / "pg")
        self.redis = RedisServer(root / "redis") if use_redis and RedisServer.available() else None
        self.nats: NatsServer | None = NatsServer(root / "nats") if NatsServer.available() else None
        self.rabbit: RabbitVhost | None = RabbitVhost() if RabbitVhost.available() else None
        self.stub = LimitsStub(seed)
        self.home = root / "home"
        self.key_text = ""
        self.product: Product | None = None
        self.results: list[FaultResult] = []
        self.fuzz: list[dict[str, Any]] = []
        self.config_fuzz: list[dict[str, Any]] = []
        self.secrets: dict[str, Any] = {}
        self.dobs: set[str] = set()
        self.drain_flag: list[str] = []
        self.skipped: list[str] = []
        self.hosts: list[Any] = []  # faults.hosts.Scenario of the several-hosts fault, when it ran
        self._next_db = 0

    # -- services ------------------------------------------------------------------------

    def start(self) -> None:
        import base64

        self.key_text = base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")
        log(f"PostgreSQL from {self.pg.bindir} on 127.0.0.1:{self.pg.port}")
        self.pg.init()
        self.pg.start()
        if self.redis is not None:
            self.redis.start()
            log(f"Redis on 127.0.0.1:{self.redis.port}")
        else:
            log("redis-server not found: the lock-store faults are skipped")
        self._start_brokers()
        self.stub.start()
        self.home.mkdir(parents=True, exist_ok=True)
        self.product = Product(self.root / "work", {
            "BATCH_ASSETS_ENCRYPTION_KEY": self.key_text,
            "BATCH_ASSETS_HOME": str(self.home),
            "BATCH_ASSETS_LIMITS_URL": self.stub.url,
        })

    def _start_brokers(self) -> None:
        """The campaign's own NATS server and RabbitMQ vhost; a broker that will not start skips its faults."""
        for name in ("nats", "rabbit"):
            broker = getattr(self, name)
            if broker is None:
                continue
            try:
                broker.start()
                log(f"{name}: {broker.url()}")
            except Exception as exc:  # its faults are skipped and the report says so
                log(f"{name} did not start ({type(exc).__name__}: {exc}); its faults are skipped")
                setattr(self, name, None)

    def brokers(self) -> tuple[str, ...]:
        """The brokers the campaign can fault: "rabbitmq" (a vhost on the machine's server), "nats" (its own)."""
        return tuple(b for b, there in (("rabbitmq", self.rabbit), ("nats", self.nats)) if there is not None)

    def stop(self) -> None:
        steps = [self.product.kill_all] if self.product is not None else []
        brokers = [b.stop for b in (self.nats, self.rabbit) if b is not None]
        for step in (*steps, self.stub.stop, *([self.redis.stop] if self.redis else []), *brokers, self.pg.stop):
            try:
                step()
            except Exception as exc:  # cleanup goes on: every service must be stopped
                log(f"cleanup: {type(exc).__name__}: {exc}")

    def _finish_faulted(self, proc: Running, res: FaultResult) -> tuple[CliResult, float]:
        """Wait for the faulted run, record it with the product's outputs, describe it in `res`; (result, end time)."""
        assert self.product is not None
        faulted = proc.finish(timeout=300)
        faulted_end = time.monotonic()
        self.product.record(faulted)
        res.faulted = f"{faulted.brief()} in {faulted.duration_s:.1f}s"
        return faulted, faulted_end

    def env_for(self, database: str, *, redis: bool = False) -> dict[str, str]:
        assert self.product is not None
        return self.product.with_env(
            BATCH_ASSETS_DATABASE_URL=self.pg.app_url(database),
            BATCH_ASSETS_REDIS_URL=self.redis.url if (redis and self.redis) else None,
        )

    def cli(self, database: str, *args: str, timeout: float = 300, redis: bool = False,
            env: dict[str, str] | None = None) -> CliResult:
        assert self.product is not None
        return self.product.run(*args, timeout=timeout, env=env or self.env_for(database, redis=redis))

    def must(self, database: str, *args: str, timeout: float = 300) -> CliResult:
        result = self.cli(database, *args, timeout=timeout)
        if result.rc != EXIT_OK:
            raise RuntimeError(f"setup `{' '.join(args)}` failed: {result.brief()} {result.stderr_tail()}")
        return result

    # -- templates -----------------------------------------------------------------------

    def build_templates(self) -> None:
        s, rd = self.sizes, self.run_date.isoformat()
        t0 = time.monotonic()
        self.pg.create_database("tpl_fresh")
        self.must("tpl_fresh", "db", "migrate")
        self.must("tpl_fresh", "seed", "customers", "--rows", str(s.customers), "--bad-fraction", "0.002",
                  "--seed", str(self.seed), "--run-date", rd)
        self.pg.create_database("tpl_settled")
        self.must("tpl_settled", "db", "migrate")
        self.must("tpl_settled", "seed", "customers", "--rows", str(s.customers), "--due-fraction", "0.3",
                  "--bad-fraction", "0.002", "--seed", str(self.seed + 1), "--run-date", rd)
        self.must("tpl_settled", "seed", "subscriptions", "--rows", str(s.subscriptions), "--expired-fraction", "0.5",
                  "--seed", str(self.seed), "--run-date", rd)
        self.pg.create_database("tpl_outbox", template="tpl_fresh")
        self.must("tpl_outbox", "sweep", "customer-status", "--mode", "full", "--run-date", rd)
        help_text = self.cli("tpl_fresh", "queue", "work", "--help").stdout
        self.drain_flag = ["--drain"] if "--drain" in help_text else ["--max-seconds", "120"]
        self._collect_dobs()
        log(f"templates ready in {time.monotonic() - t0:.0f}s ({s.customers:,} customers each; "
            f"queue drain flag: {' '.join(self.drain_flag)})")

    def _collect_dobs(self) -> None:
        """Every decrypted date of birth of the templates: none may appear in any output (secret scan)."""
        aead = checker.AESGCM(checker.decode_key(self.key_text))
        for db in ("tpl_fresh", "tpl_settled"):
            engine = self.admin(db)
            try:
                with engine.connect() as conn:
                    for cid, blob in conn.exec_driver_sql("SELECT id, encrypted_dob FROM customers"):
                        text = checker.decrypt_dob(aead, cid, bytes(blob) if blob is not None else None)
                        # Dates of birth of the last two years look like run dates, expiry dates and
                        # timestamps the product prints on purpose: only older ones are searched.
                        if text and checker._DATE.fullmatch(text) and text[:4] < str(self.run_date.year - 1):
                            self.dobs.add(text)
            finally:
                engine.dispose()
        self.dobs.discard(self.run_date.isoformat())  # the run date is printed on purpose

    def clone(self, template: str) -> str:
        self._next_db += 1
        name = f"f{self._next_db:03d}"
        self.pg.create_database(name, template=template)
        return name

    def admin(self, database: str) -> sa.Engine:
        """Transactions of our own (the checker streams rows with a server-side cursor)."""
        return self.pg.admin_engine(database, autocommit=False)

    # -- faults --------------------------------------------------------------------------

    def inject(self, fault: str, procs: list[Running], database: str) -> str:
        if fault == "kill9":
            procs[0].signal(signal.SIGKILL)
            return f"SIGKILL to pid {procs[0].pid}"
        if fault == "sigterm":
            procs[0].signal(signal.SIGTERM)
            return f"SIGTERM to pid {procs[0].pid}"
        if fault == "terminate":
            return f"terminated {self.pg.terminate_backends(database)} backends"
        if fault in ("restart_fast", "restart_immediate"):
            mode = fault.split("_")[1]
            t = time.monotonic()
            self.pg.restart(mode)
            return f"restarted (-m {mode}) in {time.monotonic() - t:.1f}s"
        if fault == "redis_restart_empty":
            assert self.redis is not None
            self.redis.restart_empty()
            return "Redis restarted empty"
        if fault == "redis_between_ranges":
            assert self.redis is not None
            self.redis.stop()
            return "Redis stopped"
        raise ValueError(fault)

    def recover(self, database: str, args: list[str], res: FaultResult, t_fault: float, *, redis: bool = False,
                before_each: Callable[[], None] | None = None, done: Callable[[CliResult], bool] | None = None,
                faulted: CliResult | None = None, faulted_end: float = 0.0,
                env: dict[str, str] | None = None) -> CliResult | None:
        """Run `args` again until it ends SUCCESS (exit 0), within the bound; 75 = wait for the lock.

        A faulted run that itself ended SUCCESS (having survived the fault) needs no recovery run.
        """
        deadline = t_fault + self.sizes.recovery_bound_s
        last = None
        if faulted is not None and faulted.rc == EXIT_OK and faulted.status == "SUCCESS" and (
            done is None or done(faulted)
        ):
            res.recovered = True
            res.recovery_s = max(0.0, faulted_end - t_fault)
            return faulted
        while time.monotonic() < deadline:
            if before_each is not None:
                before_each()
            last = self.cli(database, *args, redis=redis, timeout=max(30.0, deadline - time.monotonic() + 30),
                            env=env)
            res.recovery_runs += 1
            res.recovery_rcs.append(last.rc)
            if last.rc == EXIT_OK and last.status == "SUCCESS" and (done is None or done(last)):
                res.recovered = True
                res.recovery_s = time.monotonic() - t_fault
                return last
            if last.rc not in (EXIT_OK, EXIT_SKIPPED, EXIT_FAILED):
                res.notes.append(f"recovery run {res.recovery_runs}: {last.brief()} {last.stderr_tail(1)[:200]}")
            time.sleep(2 if last.rc == EXIT_SKIPPED else 0.5)  # wait for the lock holder, then retry
        if last is not None:
            res.notes.append(f"no SUCCESS within {self.sizes.recovery_bound_s:.0f}s "
                             f"({res.recovery_runs} runs, last {last.brief()} {last.stderr_tail(1)[:200]})")
        return last

    # -- scenarios -----------------------------------------------------------------------

    def run_fault(self, spec: FaultSpec, index: int) -> FaultResult:
        res = FaultResult(spec, seed=self.seed * 1000 + index)
        t = time.monotonic()
        try:
            if spec.job == "sweep" and spec.fault == "concurrent":
                self._concurrent_fault(spec, res)
            elif spec.job == "sweep" and spec.fault == "hostile":
                self._hostile_sweep_fault(spec, res)
            elif spec.fault == "missing_privileges":
                self._privileges_fault(spec, res)
            elif spec.job == "sweep":
                self._sweep_fault(spec, res)
            elif spec.job == "queue":
                self._queue_fault(spec, res)
            elif spec.job == "expiry":
                self._expiry_fault(spec, res)
            elif spec.job == "relay":
                self._relay_fault(spec, res)
            elif spec.job == "hosts":
                self._hosts_fault(res)
            elif spec.job == "decl":
                from faults import declarations

                declarations.run_case(self, spec, res)
        except Exception as exc:  # one broken scenario is reported and the campaign goes on
            res.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        finally:
            if self.redis is not None and not self.redis.running():
                self.redis.start()
            if self.nats is not None and not self.nats.running():
                self.nats.start()
            self.stub.set_mode("ok")
        log(f"#{index:02d} {spec.label} at {spec.at:.0%}: {res.outcome} ({time.monotonic() - t:.0f}s) "
            f"{res.injected_note}; faulted {res.faulted}; recovery "
            f"{_secs(res.recovery_s)} in {res.recovery_runs} runs; "
            f"{res.truth_violation or ''} {res.report.describe() if not res.report.ok else ''} "
            f"{res.error or ''} {' | '.join(res.notes)}")
        return res

    def _truth(self, database: str, result: CliResult, rules: tuple[tuple[str, int], ...],
               baseline: checker.Baseline, edits: checker.Edits | None = None) -> str | None:
        """A run that said SUCCESS must have left no row in scope uncomputed (beyond its `failed`).

        Rows another service wrote while it ran (`edits`) may be left due: the next run computes them.
        """
        if result.rc != EXIT_OK and result.status != "SUCCESS":
            return None
        engine = self.admin(database)
        try:
            with engine.connect() as conn:
                report = checker.check_customers(conn, self.key_text, self.run_date, rules, baseline, edits=edits,
                                                 pending=True)
        finally:
            engine.dispose()
        missing = sum(report.violations[k] for k in ("uncomputed", "wrong_category", "wrong_next_review"))
        summary = result.summary or {}
        by_type = summary.get("failed_by_type")
        if isinstance(by_type, dict) and by_type:
            # Only failures that are not the row's own (missing_data, invalid_value, decrypt_failure)
            # may account for rows left uncomputed.
            failed = sum(int(n or 0) for k, n in by_type.items() if k not in EVALUATION_KINDS)
        else:
            failed = int(summary.get("failed") or 0) - report.info["unevaluable"]
        if missing > max(failed, 0):
            return (f"SUCCESS (rc {result.rc}) with {missing} rows in scope not computed (summary failed="
                    f"{summary.get('failed')}, unevaluable rows {report.info['unevaluable']}): "
                    f"{report.describe()[:300]}")
        return None

    def _sweep_fault(self, spec: FaultSpec, res: FaultResult) -> None:
        mode = spec.mode or "full"
        template = "tpl_fresh" if mode == "full" else "tpl_settled"
        db = self.clone(template)
        redis = spec.fault.startswith("redis")
        if redis and self.redis is None:
            res.injected_note = "skipped: no redis-server"
            return
        rules = checker.DEFAULT_RULES
        if mode == "config-change":
            self.must_env(db, ["rules", "set", "--thresholds", NEW_RULES_TEXT])
            rules = NEW_RULES
        engine = self.admin(db)
        with engine.connect() as conn:
            baseline = checker.take_baseline(conn)
            todo = checker.check_customers(conn, self.key_text, self.run_date, rules, baseline)
        engine.dispose()
        to_write = sum(todo.violations[k] for k in ("uncomputed", "wrong_category", "wrong_next_review"))
        rd = self.run_date.isoformat()
        args = ["sweep", "customer-status", "--mode", mode, "--run-date", rd, "--workers", str(spec.workers)]
        if spec.fault == "redis_between_ranges":
            args += ["--ranges", "4"]
        if spec.fault == "write_errors":
            poisoned = self._poison(db, res)
            res.injected, res.injected_note = poisoned > 0, f"{poisoned} rows poisoned"
        if spec.fault == "redis_down":
            assert self.redis is not None
            self.redis.stop()
            res.injected, res.injected_note = True, "Redis stopped before the run"
        started_at = datetime.now(UTC)
        proc = self.product.start(*args, env=self.env_for(db, redis=redis))  # type: ignore[union-attr]
        t_fault = time.monotonic()
        if spec.fault in PG_FAULTS or spec.fault in ("redis_restart_empty", "redis_between_ranges"):
            if spec.fault == "redis_between_ranges":
                probe = Probe(self.pg, db, "SELECT count(*) FROM ba_checkpoints WHERE status = 'DONE' "
                                           "AND updated_at >= :t", {"t": started_at})
                target = 1
            else:
                probe = Probe(self.pg, db, "SELECT count(*) FROM customers WHERE updated_at >= :t", {"t": started_at})
                target = max(1, int(to_write * spec.at))
            ok, seen = wait_progress(probe, target, [proc], timeout=240)
            probe.close()
            if ok:
                t_fault = time.monotonic()
                res.injected = True
                unit = " range(s) finished" if spec.fault == "redis_between_ranges" else f"/{to_write:,} rows written"
                res.injected_note = f"{self.inject(spec.fault, [proc], db)} at {seen:,}{unit}"
            else:
                res.injected_note = f"not injected: the run ended first ({seen} of target {target})"
        faulted, faulted_end = self._finish_faulted(proc, res)
        if spec.fault == "redis_down":
            res.notes.append(f"run with the lock store down: {faulted.brief()} {faulted.stderr_tail(1)[:160]}")
        if not res.injected:
            return
        if faulted.rc == -999:
            res.notes.append("the faulted run did not end within 300s")
        res.truth_violation = self._truth(db, faulted, rules, baseline)
        if self.redis is not None and not self.redis.running():
            self.redis.start()
        if spec.fault == "write_errors":
            self._unpoison(db)
            t_fault = time.monotonic()  # the fault lasted the whole run: recovery starts as it heals
        if spec.fault == "write_errors" and faulted.rc == 0:
            # A run that ended SUCCESS counted the rows whose write failed and left them due: the next
            # delta, once the writes work again, is the recovery (and must repair every one of them).
            # A full or config-change run ends FAILURE instead (its low watermark stays before those
            # rows), and its recovery is the same command again, as below.
            res.notes.append("recovery is a delta sweep after the trigger was dropped")
            delta = ["sweep", "customer-status", "--mode", "delta", "--run-date", rd, "--workers", str(spec.workers)]
            self.recover(db, delta, res, t_fault, redis=redis)
        else:
            # An untruthful SUCCESS is not a recovery: run again, as the next night would.
            self.recover(db, args, res, t_fault, redis=redis, faulted=None if res.truth_violation else faulted,
                         faulted_end=faulted_end)
        engine = self.admin(db)
        with engine.connect() as conn:
            res.report = checker.check_customers(conn, self.key_text, self.run_date, rules, baseline)
        engine.dispose()
        self._scan_outbox(db)
        self.pg.drop_database(db)

    def _privileges_fault(self, spec: FaultSpec, res: FaultResult) -> None:
        """A job run by a role that has the grants of docs/production/privileges.md but one (the seed picks it among
        those the job needs): exit 2 before anything is read, one line naming exactly that grant, nothing written (not
        a row, event, claim, checkpoint, lock or run record), no secret printed; then, the grant given back, the same
        command recovers and every invariant holds."""
        from batch_assets.db.privileges import QUEUE_BOOKKEEPING, SWEEP_BOOKKEEPING, queue_table
        from batch_assets.reference.privileges import SWEEP

        queue = spec.job == "queue"
        db = self.clone("tpl_settled" if queue or spec.mode != "full" else "tpl_fresh")
        engine = self.admin(db)
        role = f"ba_limited_{db}"  # the campaign's own name: letters, digits, _
        needed = (*QUEUE_BOOKKEEPING, *queue_table("payments")) if queue else (*SWEEP_BOOKKEEPING, *SWEEP)
        missing = random.Random(res.seed).choice(needed)
        try:
            if queue:
                with engine.begin() as conn:
                    checker.install_done_audit(conn)
                self.must(db, "queue", "enqueue", "--count", str(self.sizes.payments), "--seed", str(res.seed))
                self.stub.reset_counts()
                args = ["queue", "work", "--concurrency", "4", *self.drain_flag]
            else:
                args = ["sweep", "customer-status", "--mode", spec.mode or "full", "--run-date",
                        self.run_date.isoformat(), "--workers", str(spec.workers)]
            revoke = self._limited_role(db, role, missing)
            url = f"postgresql+psycopg://{role}:{self.pg.password}@127.0.0.1:{self.pg.port}/{db}"
            env = {**self.env_for(db), "BATCH_ASSETS_DATABASE_URL": url}
            # A grant on some columns is refused naming the first of them (the page grants the whole table).
            named = dataclasses.replace(missing, columns=missing.columns[:1])
            before = _written_counts(engine)
            res.injected, res.injected_note = True, f"the role lacks {named}"
            faulted = self.cli(db, *args, env=env)
            res.faulted = faulted.brief()
            res.truth_violation = _refusal_violation(faulted, str(named), before, _written_counts(engine))
            with engine.connect() as conn:
                conn.exec_driver_sql(revoke.replace("REVOKE", "GRANT", 1).replace(" FROM ", " TO "))
                conn.commit()
            self._recover_with_grant(db, args, env, res, queue)
        finally:
            engine.dispose()
            self.pg.drop_database(db)
            self.pg.drop_role(role)

    def _limited_role(self, db: str, role: str, missing: Any) -> str:
        """`role` with the page's grants for every job and the reference jobs, its password the campaign's (which the
        secret scan looks for), less `missing`; returns the REVOKE statement."""
        on = missing.on if missing.kind == "table" else f"{missing.kind.upper()} {missing.on}"
        # A function is executable by PUBLIC unless a DBA revoked that: the role lacks it only without both.
        holders = f"PUBLIC, {role}" if missing.kind == "function" else role
        revoke = f"REVOKE {missing.privilege} ON {on} FROM {holders}"
        admin = self.pg.admin_engine(db)
        try:
            with admin.connect() as conn:
                grants = "\n".join(_page_grants(block) for block in ("every-job", "reference"))
                conn.exec_driver_sql(grants.replace("batch_runner", role).replace("DATABASE app", f'DATABASE "{db}"'))
                # The password is a generated token of URL-safe characters; it cannot be a bound parameter.
                conn.exec_driver_sql(f"ALTER ROLE {role} PASSWORD '{self.pg.password}'")
                conn.exec_driver_sql(revoke)
        finally:
            admin.dispose()
        return revoke

    def _recover_with_grant(self, db: str, args: list[str], env: dict[str, str], res: FaultResult,
                            queue: bool) -> None:
        """The same command, with the grant back, until SUCCESS; then the job's invariants."""
        engine = self.admin(db)
        try:
            if queue:
                def all_done(_: CliResult) -> bool:
                    with engine.connect() as conn:
                        return not conn.exec_driver_sql("SELECT count(*) FROM payments WHERE status <> 'DONE'").scalar()

                self.recover(db, args, res, time.monotonic(), env=env, done=all_done)
                with engine.connect() as conn:
                    res.report = checker.check_payments(conn, self.stub.posts, self.stub.accepted, complete=True)
                self.secrets.setdefault("stub_bodies", []).extend(self.stub.bodies[:2000])
                return
            with engine.connect() as conn:
                baseline = checker.take_baseline(conn)
            self.recover(db, args, res, time.monotonic(), env=env)
            with engine.connect() as conn:
                res.report = checker.check_customers(conn, self.key_text, self.run_date, checker.DEFAULT_RULES,
                                                     baseline)
            self._scan_outbox(db)
        finally:
            engine.dispose()

    def must_env(self, db: str, args: list[str]) -> None:
        self.must(db, *args)

    def _poison(self, db: str, res: FaultResult) -> int:
        """A trigger that RAISEs on the UPDATE of one row in 10,000 (at least 3; chosen by the seed).

        Few rows: each one sends its whole page to the per-row fallback, which is slow by design.
        """
        engine = self.admin(db)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("CREATE TABLE faults_poison (id uuid PRIMARY KEY)")
                n = conn.exec_driver_sql(
                    "INSERT INTO faults_poison SELECT id FROM customers WHERE status = 'ACTIVE' "
                    "AND (next_review_date IS NULL OR next_review_date <= %(rd)s OR %(all)s) "
                    "ORDER BY md5(id::text || %(seed)s) LIMIT greatest(3, (SELECT count(*) FROM customers) / 10000)",
                    {"seed": str(res.seed), "rd": self.run_date, "all": res.spec.mode != "delta"},
                ).rowcount
                # SECURITY DEFINER: the product's role must not need rights on the campaign's table.
                conn.exec_driver_sql("""CREATE FUNCTION faults_poison_raise() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM faults_poison WHERE id = NEW.id) THEN
        RAISE EXCEPTION 'faults: write refused for this row';
    END IF;
    RETURN NEW;
END;
$$""")
                conn.exec_driver_sql("CREATE TRIGGER faults_poison BEFORE UPDATE ON customers "
                                     "FOR EACH ROW EXECUTE FUNCTION faults_poison_raise()")
            return int(n)
        finally:
            engine.dispose()

    def _unpoison(self, db: str) -> None:
        engine = self.admin(db)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("DROP TRIGGER IF EXISTS faults_poison ON customers")
        finally:
            engine.dispose()

    # -- other services writing while the sweep runs (docs/reference/tables.md) -----------------------

    def _prepare_beside(self, spec: FaultSpec, template: str) -> tuple[str, tuple[tuple[str, int], ...],
                                                                        checker.Baseline]:
        """A database with the campaign's write log installed and a baseline holding every ciphertext."""
        db = self.clone(template)
        rules = checker.DEFAULT_RULES
        if spec.mode == "config-change":
            self.must_env(db, ["rules", "set", "--thresholds", NEW_RULES_TEXT])
            rules = NEW_RULES
        engine = self.admin(db)
        try:
            with engine.begin() as conn:
                checker.install_write_log(conn)
            with engine.connect() as conn:
                baseline = checker.take_baseline(conn, with_blobs=True)
        finally:
            engine.dispose()
        return db, rules, baseline

    def _sweep_args(self, mode: str, workers: int) -> list[str]:
        return ["sweep", "customer-status", "--mode", mode, "--run-date", self.run_date.isoformat(),
                "--workers", str(workers)]

    def _settle(self, db: str, args: list[str], res: FaultResult, t_fault: float, faulted: CliResult,
                faulted_end: float, settle: list[str]) -> CliResult | None:
        """The faulted command again until SUCCESS when it did not succeed, then `settle` (the next run)."""
        if res.truth_violation or faulted.rc != EXIT_OK or faulted.status != "SUCCESS":
            self.recover(db, args, res, t_fault)
            if not res.recovered:
                return None
        res.recovered = False
        return self.recover(db, settle, res, t_fault)

    def _concurrent_fault(self, spec: FaultSpec, res: FaultResult) -> None:
        """Another connection rewrites encrypted_dob at EDIT_RATE/s while the sweep runs; then one delta.

        Afterwards no row may be stale (not due, holding the result of a date of birth it no longer has),
        each of the product's writes must be the rule applied to what the row held as it was written, and
        the triggers and events must be those of the writes.
        """
        mode = spec.mode or "full"
        db, rules, baseline = self._prepare_beside(spec, "tpl_fresh" if mode == "full" else "tpl_settled")
        writer_engine = self.pg.admin_engine(db)
        editor = writers.DobEditor(writer_engine, self.key_text, list(baseline.categories), self.run_date,
                                   rate=EDIT_RATE, seed=res.seed)
        pre = 0
        if mode == "delta":
            # Rows edited once before the delta (so due again), then edited again while it runs.
            with writer_engine.connect() as conn:
                settled = [r[0] for r in conn.exec_driver_sql(
                    "SELECT id FROM customers WHERE status = 'ACTIVE' AND next_review_date > %(rd)s "
                    "ORDER BY md5(id::text || %(seed)s) LIMIT %(n)s",
                    {"rd": self.run_date, "seed": str(res.seed), "n": PRE_EDITS})]
                for cid in settled:
                    editor.edit_one(conn, cid)
                editor.ids = [r[0] for r in conn.exec_driver_sql(
                    "SELECT id FROM customers WHERE status = 'ACTIVE' AND (next_review_date IS NULL "
                    "OR next_review_date <= %(rd)s)", {"rd": self.run_date})]
            pre = editor.edits.count
        args = self._sweep_args(mode, spec.workers)
        proc = self.product.start(*args, env=self.env_for(db))  # type: ignore[union-attr]
        t_fault = time.monotonic()
        editor.start()
        try:
            faulted, faulted_end = self._finish_faulted(proc, res)
        finally:
            edits = editor.stop()
            writer_engine.dispose()
        res.edits = edits.count - pre
        # Only dates older than last year are searched (see _collect_dobs).
        self.dobs |= {d for d in editor.dobs if d[:4] < str(self.run_date.year - 1)}
        res.injected = res.edits > 0
        res.injected_note = (f"{res.edits:,} edits of encrypted_dob in {editor.elapsed_s:.1f}s "
                             f"({res.edits / max(editor.elapsed_s, 0.001):.0f}/s) over {len(editor.ids):,} rows"
                             + (f", {pre:,} rows edited once before the run" if pre else "")
                             + (f"; {editor.errors} writer reconnects" if editor.errors else ""))
        summary = faulted.summary or {}
        res.notes.append(f"faulted run counted conflicts={summary.get('conflicts', 'absent')}")
        if not res.injected:
            self.pg.drop_database(db)
            return
        res.truth_violation = self._truth(db, faulted, rules, baseline, edits)
        engine = self.admin(db)
        try:
            with engine.connect() as conn:
                mid = checker.check_customers(conn, self.key_text, self.run_date, rules, baseline, edits=edits,
                                              pending=True)
            res.notes.append(f"right after the run: {mid.stale} stale rows, {mid.info['edited_left_due']:,} "
                             "edited rows left due")
            self._settle(db, args, res, t_fault, faulted, faulted_end, self._sweep_args("delta", spec.workers))
            with engine.connect() as conn:
                res.report = checker.check_customers(conn, self.key_text, self.run_date, rules, baseline,
                                                     edits=edits)
        finally:
            engine.dispose()
        self._scan_outbox(db)
        self.pg.drop_database(db)

    def _hostile_sweep_fault(self, spec: FaultSpec, res: FaultResult) -> None:
        """Rows of every hostile kind written by another connection while the sweep runs; then the next run.

        Each must end with its named outcome: a failure kind counted in `failed_by_type`, the row due
        with the category it held; a valid one computed.
        """
        mode = spec.mode or "full"
        db, rules, baseline = self._prepare_beside(spec, "tpl_settled")
        engine = self.admin(db)
        with engine.connect() as conn:
            todo = checker.check_customers(conn, self.key_text, self.run_date, rules, baseline)
        to_write = sum(todo.violations[k] for k in ("uncomputed", "wrong_category", "wrong_next_review"))
        args = self._sweep_args(mode, spec.workers)
        started_at = datetime.now(UTC)
        proc = self.product.start(*args, env=self.env_for(db))  # type: ignore[union-attr]
        probe = Probe(self.pg, db, "SELECT count(*) FROM customers WHERE updated_at >= :t", {"t": started_at})
        ok, seen = wait_progress(probe, max(1, int(to_write * spec.at)), [proc], timeout=240)
        probe.close()
        t_fault = time.monotonic()
        rows: list[checker.HostileRow] = []
        edits = checker.Edits()
        if ok:
            writer_engine = self.pg.admin_engine(db)
            try:
                # A delta never reads a row that is not due: "preset" rows wait for the weekly full.
                variants = ("new", "edited") if mode == "delta" else ("new", "edited", "preset")
                rows = writers.inject_hostile_customers(writer_engine, self.key_text, self.run_date,
                                                        variants=variants, seed=res.seed)
                with writer_engine.connect() as conn:
                    for cid, blob in conn.exec_driver_sql("SELECT id, encrypted_dob FROM customers WHERE id = ANY("
                                                          "%(ids)s)", {"ids": [r.cid for r in rows]}):
                        edits.add(cid, None if blob is None else bytes(blob))
            finally:
                writer_engine.dispose()
            for r in rows:
                if r.variant != "edited":
                    baseline.categories[r.cid] = r.category
            res.injected = bool(rows)
            res.injected_note = (f"{len(rows)} hostile rows ({len(writers.HOSTILE_CUSTOMERS)} kinds × "
                                 f"{', '.join(variants)}) at {seen:,}/{to_write:,} rows written")
        else:
            res.injected_note = f"not injected: the run ended first ({seen} of {to_write})"
        faulted, faulted_end = self._finish_faulted(proc, res)
        if not res.injected:
            engine.dispose()
            self.pg.drop_database(db)
            return
        try:
            res.truth_violation = self._truth(db, faulted, rules, baseline, edits)
            settle = self._sweep_args("delta" if mode == "delta" else "full", spec.workers)
            with engine.connect() as conn:
                want = checker.expected_failures(conn, self.key_text, self.run_date, rules, due_only=mode == "delta")
            last = self._settle(db, args, res, t_fault, faulted, faulted_end, settle)
            with engine.connect() as conn:
                res.report = checker.check_customers(conn, self.key_text, self.run_date, rules, baseline,
                                                     edits=edits)
                res.hostile = checker.hostile_customer_outcomes(conn, self.key_text, self.run_date, rules, rows)
            self._count_hostile(db, res, rows, want, last)
        finally:
            engine.dispose()
        self._scan_outbox(db)
        self.pg.drop_database(db)

    def _count_hostile(self, db: str, res: FaultResult, rows: list[checker.HostileRow], want: Counter[str],
                       last: CliResult | None) -> None:
        """Did the settling run count each hostile kind as its failure kind?

        Its `failed_by_type` is compared with the checker's count over the rows it read. Where a count
        differs, each suspect kind is swept alone (every other row CLOSED) to name what it was counted as.
        """
        by_type = ((last.summary or {}).get("failed_by_type") if last else None) or {}
        got = Counter({k: int(by_type.get(k) or 0) for k in EVALUATION_KINDS})
        wrong = {k for k in EVALUATION_KINDS if got[k] != want[k]}
        for k in sorted(wrong):
            res.report.add("failed_by_type_miscounted", f"{k}: the settling run counted {got[k]}, "
                                                        f"its rows hold {want[k]}")
        res.notes.append("settling run failed_by_type " + ", ".join(f"{k} {got[k]} (expected {want[k]})"
                                                                    for k in EVALUATION_KINDS))
        suspects = [kind for kind, o in res.hostile.items() if o.expected in wrong or o.expected == "computed"]
        if last is None:
            for o in res.hostile.values():
                o.see("not counted: no settling run succeeded", False)
            return
        for kind, o in res.hostile.items():
            if kind not in suspects:
                o.see(f"counted as {o.expected}" if o.expected != "computed" else "not counted as failed", True)
        if not wrong or not suspects:
            for kind in suspects:
                res.hostile[kind].see("not counted as failed", True)
            return
        for kind, text, ok in self._attribute(db, rows, suspects):
            res.hostile[kind].see(text, ok)

    def _attribute(self, db: str, rows: list[checker.HostileRow], kinds: list[str]) -> list[tuple[str, str, bool]]:
        """Sweep each kind's rows alone (a full sweep of a table whose other rows are CLOSED)."""
        engine = self.pg.admin_engine(db)
        ids = [r.cid for r in rows]
        out = []
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("UPDATE customers SET status = 'CLOSED' WHERE status = 'ACTIVE'")
            for kind in kinds:
                mine = [r.cid for r in rows if r.kind == kind]
                expected = next(r.expected for r in rows if r.kind == kind)
                with engine.connect() as conn:
                    conn.exec_driver_sql("UPDATE customers SET status = CASE WHEN id = ANY(%(mine)s) THEN 'ACTIVE' "
                                         "ELSE 'CLOSED' END WHERE id = ANY(%(ids)s)", {"mine": mine, "ids": ids})
                result = self.cli(db, *self._sweep_args("full", 1))
                by_type = {k: int(v) for k, v in ((result.summary or {}).get("failed_by_type") or {}).items()
                           if int(v or 0)}
                text = ("counted as " + ", ".join(f"{k} ×{v}" for k, v in sorted(by_type.items()))
                        if by_type else "not counted as failed")
                want = {} if expected == "computed" else {expected: len(mine)}
                out.append((kind, f"{text} (swept alone: {result.brief()[:60]})" if result.rc else text,
                            result.rc == EXIT_OK and by_type == want))
        finally:
            engine.dispose()
        return out

    # -- the queue -----------------------------------------------------------------------

    def _queue_fault(self, spec: FaultSpec, res: FaultResult) -> None:
        db = self.clone("tpl_settled")
        engine = self.admin(db)
        with engine.begin() as conn:
            checker.install_done_audit(conn)
        self.must(db, "queue", "enqueue", "--count", str(self.sizes.payments), "--seed", str(res.seed))
        self.stub.reset_counts()
        self.stub.set_mode("ok")
        args = ["queue", "work", "--concurrency", "4", *self.drain_flag]
        env = self.env_for(db)
        workers = [self.product.start(*args, env=env) for _ in range(3)]  # type: ignore[union-attr]
        probe = Probe(self.pg, db, "SELECT count(*) FROM payments WHERE status = 'DONE'")
        target = max(1, int(self.sizes.payments * spec.at))
        t_fault = time.monotonic()
        writer_engine = self.pg.admin_engine(db)
        hostile: list[checker.HostileRow] = []
        refused: frozenset[uuid.UUID] = frozenset()
        try:
            ok, seen = wait_progress(probe, target, workers, timeout=240)
            if ok:
                t_fault = time.monotonic()
                res.injected = True
                if spec.fault.startswith("limits_"):
                    mode = spec.fault.removeprefix("limits_")
                    self.stub.set_mode(mode)
                    self.stub.hang_s = 15.0
                    # The outage lasts a few seconds of the drain, then the service is back.
                    end = time.monotonic() + 6
                    while time.monotonic() < end and any(w.running() for w in workers):
                        time.sleep(0.1)  # polling interval
                    self.stub.set_mode("ok")
                    res.injected_note = f"limits {mode} for 6s at {seen:,}/{self.sizes.payments:,} DONE"
                elif spec.fault == "hostile":
                    hostile = writers.inject_hostile_payments(writer_engine)
                    res.injected_note = (f"{len(hostile)} hostile payments ({len(writers.HOSTILE_PAYMENTS)} kinds) "
                                         f"inserted at {seen:,}/{self.sizes.payments:,} DONE")
                else:
                    res.injected_note = f"{self.inject(spec.fault, workers, db)} at {seen:,} DONE"
            else:
                res.injected_note = f"not injected: the drain ended first ({seen} DONE)"
        finally:
            probe.close()
            outs = [w.finish(timeout=240) for w in workers]
            queue_end = time.monotonic()
            writer_engine.dispose()
        if hostile:
            # Their outcome is what the drain made of them, before any time is fast-forwarded (which would
            # also lapse a NULL claim) or the DLQ replayed; afterwards they must still reach DONE.
            with engine.connect() as conn:
                res.hostile = checker.hostile_payment_outcomes(conn, hostile)
                # A hostile payment FAILED with a true reason (say, an amount out of bounds) is refused for
                # good: the DLQ is not replayed for it and it need not reach DONE.
                refused = frozenset(pid for (pid,) in conn.exec_driver_sql(
                    "SELECT id FROM payments WHERE status = 'FAILED' AND id = ANY(%(ids)s)",
                    {"ids": [r.cid for r in hostile if res.hostile[r.kind].ok]}))
        for out in outs:
            self.product.record(out)  # type: ignore[union-attr]
        res.faulted = "; ".join(o.brief() for o in outs)
        if not res.injected:
            self.pg.drop_database(db)
            return

        def fast_forward() -> None:
            # Simulate the passage of time (backoff and claim leases run in minutes), only
            # while no worker runs; FAILED payments (the DLQ) are replayed as an operator would.
            with engine.begin() as conn:
                conn.exec_driver_sql("UPDATE payments SET next_attempt_at = now() WHERE status = 'NEW'")
                conn.exec_driver_sql("UPDATE payments SET claimed_until = now() - interval '1 second' "
                                     "WHERE status = 'PROCESSING'")
                failed = [str(i) for (i,) in conn.exec_driver_sql(
                    "SELECT id FROM payments WHERE status = 'FAILED' AND id <> ALL(%(refused)s)",
                    {"refused": list(refused)})]
            if failed:
                res.notes.append(f"{len(failed)} FAILED payments replayed from the DLQ")
                self.cli(db, "queue", "dlq", "replay", *[a for i in failed[:500] for a in ("--id", i)])

        def all_done(_: CliResult) -> bool:
            with engine.connect() as conn:
                return not conn.exec_driver_sql(
                    "SELECT count(*) FROM payments WHERE status <> 'DONE' "
                    "AND NOT (status = 'FAILED' AND id = ANY(%(refused)s))", {"refused": list(refused)}).scalar()

        survived = all(o.rc == EXIT_OK and o.status == "SUCCESS" for o in outs)
        self.recover(db, args, res, t_fault, before_each=fast_forward, done=all_done,
                     faulted=outs[0] if survived else None, faulted_end=queue_end)
        with engine.connect() as conn:
            res.report = checker.check_payments(conn, self.stub.posts, self.stub.accepted, complete=True,
                                                refused=refused)
        engine.dispose()
        self.secrets.setdefault("stub_bodies", []).extend(self.stub.bodies[:2000])
        self.pg.drop_database(db)

    # -- subscriptions -------------------------------------------------------------------

    def _expiry_fault(self, spec: FaultSpec, res: FaultResult) -> None:
        db = self.clone("tpl_settled")
        engine = self.admin(db)
        with engine.connect() as conn:
            baseline = checker.take_baseline(conn)
            due = conn.exec_driver_sql("SELECT count(*) FROM subscriptions WHERE status = 'ACTIVE' "
                                       "AND expiry_date < %(rd)s", {"rd": self.run_date}).scalar()
        args = ["subscriptions", "expire", "--run-date", self.run_date.isoformat()]
        proc = self.product.start(*args, env=self.env_for(db))  # type: ignore[union-attr]
        probe = Probe(self.pg, db, "SELECT count(*) FROM subscriptions WHERE status <> 'ACTIVE'")
        already = sum(1 for s in baseline.subscription_status.values() if s != "ACTIVE")
        target = already + max(1, int((due or 0) * spec.at))
        t_fault = time.monotonic()
        ok, seen = wait_progress(probe, target, [proc], timeout=240)
        probe.close()
        if ok:
            t_fault = time.monotonic()
            res.injected = True
            res.injected_note = f"{self.inject(spec.fault, [proc], db)} at {(seen or 0) - already:,}/{due:,} expired"
        else:
            res.injected_note = f"not injected: the job ended first ({(seen or 0) - already} of {due})"
        faulted, faulted_end = self._finish_faulted(proc, res)
        if res.injected:
            survived = faulted.rc == EXIT_OK and faulted.status == "SUCCESS"
            with engine.connect() as conn:
                # A run that says SUCCESS must have expired every due subscription (or marked it FAILED).
                mid = checker.check_subscriptions(conn, self.run_date, baseline, complete=survived)
            if not mid.ok:
                res.truth_violation = (f"{'SUCCESS' if survived else 'right after the fault'}: "
                                       f"{mid.describe()}")
            self.recover(db, args, res, t_fault, faulted=None if res.truth_violation else faulted,
                         faulted_end=faulted_end)
            with engine.connect() as conn:
                res.report = checker.check_subscriptions(conn, self.run_date, baseline, complete=True)
        engine.dispose()
        self.pg.drop_database(db)

    # -- several hosts: the rig of faults/hosts.py on the campaign's PostgreSQL ------

    def _hosts_fault(self, res: FaultResult) -> None:
        """The sweep and queue scenarios of faults/hosts.py (network, pid and uts namespaces per host) against the
        campaign's server; their timelines and checks go into the report (`hosts` below)."""
        self.hosts = hosts.run(rows=hosts.DEFAULT_ROWS, ranges=hosts.DEFAULT_RANGES, payments=hosts.DEFAULT_PAYMENTS,
                               only=None, workdir=self.root / "hosts", database_url=self.pg.app_url("postgres"),
                               first_index=4)  # bah4..6: `make hosts` (bah1..3) may run at the same time
        sweep = next((sc for sc in self.hosts if sc.name == "sweep"), None)
        res.injected = sweep is not None and any(e[1] == "kill -9" for e in sweep.timeline.events)
        res.injected_note = "; ".join(f"{sc.name}: {d}" for sc in self.hosts for _, w, d in sc.timeline.events
                                      if w == "kill -9")
        for sc in self.hosts:
            res.report.merge(sc.report)
            for c in sc.checks:
                if not c.ok:
                    res.report.add("hosts_check_failed", f"{sc.name}: {c.name}: {c.detail[:200]}")
            if sc.error:
                res.error = f"{sc.name}: {sc.error}"
        resumed = [c for sc in self.hosts for c in sc.checks if c.name.startswith("the next run resumes")]
        res.recovered = bool(resumed) and all(c.ok for c in resumed)
        if sweep is not None and sweep.timeline.zero is not None:
            done = [at for at, what, _ in sweep.timeline.events if what == "next run done"]
            res.recovery_s = done[0] - sweep.timeline.zero if done else None
            res.recovery_runs = 1 if done else 0
        res.faulted = "; ".join(f"{sc.name}: {sum(c.ok for c in sc.checks)}/{len(sc.checks)} checks passed"
                                for sc in self.hosts)

    # -- the outbox relay ----------------------------------------------------------------

    def _relay_fault(self, spec: FaultSpec, res: FaultResult) -> None:
        if spec.fault in BROKER_FAULTS:
            self._broker_relay_fault(spec, res)
            return
        db = self.clone("tpl_outbox")
        redis = spec.fault.startswith("redis")
        if redis and self.redis is None:
            res.injected_note = "skipped: no redis-server"
            return
        sink = self.home / "outbox.jsonl"
        if sink.exists():
            sink.unlink()
        if redis:
            self._redis_del_stream()
        engine = self.admin(db)
        with engine.connect() as conn:
            total = conn.exec_driver_sql("SELECT count(*) FROM outbox_events").scalar()
        args = ["outbox", "relay"]
        env = self.env_for(db, redis=redis)
        if redis and self.redis is not None:  # the relay's sink is the Redis stream (BATCH_ASSETS_OUTBOX_SINK)
            env["BATCH_ASSETS_OUTBOX_SINK"] = self.redis.url
        proc = self.product.start(*args, env=env)  # type: ignore[union-attr]
        probe = Probe(self.pg, db, "SELECT count(*) FROM outbox_events WHERE status = 'SENT'")
        t_fault = time.monotonic()
        ok, seen = wait_progress(probe, max(1, int((total or 0) * spec.at)), [proc], timeout=240)
        probe.close()
        lost_with_sink: set[int] = set()
        if ok:
            t_fault = time.monotonic()
            res.injected = True
            res.injected_note = f"{self.inject(spec.fault, [proc], db)} at {seen:,}/{total:,} SENT"
            if redis:
                # The sink itself (a Redis without persistence) lost what it held: events SENT before
                # the restart cannot be in it, and that is Redis's durability, not the relay's.
                with engine.connect() as conn:
                    lost_with_sink = {int(i) for (i,) in conn.exec_driver_sql(
                        "SELECT id FROM outbox_events WHERE status = 'SENT'")}
                res.notes.append(f"{len(lost_with_sink):,} events SENT before the sink restarted empty are "
                                 "not expected in it")
        else:
            res.injected_note = f"not injected: the relay ended first ({seen} SENT)"
        faulted, faulted_end = self._finish_faulted(proc, res)
        if res.injected:
            if self.redis is not None and not self.redis.running():
                self.redis.start()

            def all_sent(_: CliResult) -> bool:
                with engine.connect() as conn:
                    return not conn.exec_driver_sql(
                        "SELECT count(*) FROM outbox_events WHERE status <> 'SENT'").scalar()

            self.recover(db, args, res, t_fault, redis=redis, done=all_sent, faulted=faulted, faulted_end=faulted_end,
                         env=env)
            ids = self._redis_stream_ids() if redis else self._jsonl_ids(sink)
            with engine.connect() as conn:
                res.report = checker.check_outbox_sent(conn, ids, lost_with_sink)
        engine.dispose()
        if sink.exists():
            sink.rename(self.home / f"outbox-{db}.jsonl")  # kept for the secret scan
        self.pg.drop_database(db)

    def _broker_relay_fault(self, spec: FaultSpec, res: FaultResult) -> None:
        """The relay to a real broker (spec.mode: rabbitmq | nats) through a TCP proxy: unreachable before the first
        batch, its connection cut mid-batch, its confirms held back (the send times out), or (NATS, the campaign's
        own server) the broker stopped mid-batch. After recovery every event is SENT and in the broker at least
        once, every message's broker-level id (message_id / Nats-Msg-Id) is its event id; duplicates are counted."""
        broker = self.rabbit if spec.mode == "rabbitmq" else self.nats
        if broker is None or (spec.fault == "broker_stop" and spec.mode != "nats"):
            res.injected_note = f"skipped: no {spec.mode}"
            return
        db = self.clone("tpl_outbox")
        broker.reset()
        proxy = TcpProxy(broker.address)
        proxy.mode = "down" if spec.fault == "broker_down" else "up"
        env = dict(self.env_for(db), BATCH_ASSETS_OUTBOX_SINK=broker.url(proxy.port))
        engine = self.admin(db)
        args = ["outbox", "relay", "--batch-size", "250"]
        try:
            with engine.connect() as conn:
                total = int(conn.exec_driver_sql("SELECT count(*) FROM outbox_events").scalar() or 0)
            proc = self.product.start(*args, env=env)  # type: ignore[union-attr]
            t_fault = time.monotonic()
            if spec.fault == "broker_down":
                res.injected, res.injected_note = True, "every connection refused from the start"
            else:
                probe = Probe(self.pg, db, "SELECT count(*) FROM outbox_events WHERE status = 'SENT'")
                ok, seen = wait_progress(probe, max(1, int(total * spec.at)), [proc], timeout=240)
                probe.close()
                if ok:
                    t_fault = time.monotonic()
                    res.injected = True
                    res.injected_note = f"{self._inject_broker(spec.fault, proxy)} at {seen:,}/{total:,} SENT"
                else:
                    res.injected_note = f"not injected: the relay ended first ({seen} SENT)"
            faulted, faulted_end = self._finish_faulted(proc, res)
            if not res.injected:
                return
            proxy.mode = "up"
            if isinstance(broker, NatsServer) and not broker.running():
                broker.start()

            def all_sent(_: CliResult) -> bool:
                with engine.connect() as conn:
                    return not conn.exec_driver_sql(
                        "SELECT count(*) FROM outbox_events WHERE status <> 'SENT'").scalar()

            self.recover(db, args, res, t_fault, done=all_sent, faulted=faulted, faulted_end=faulted_end, env=env)
            ids, wrong_id = delivered_ids(broker.read())
            with engine.connect() as conn:
                res.report = checker.check_outbox_sent(conn, ids)
            if wrong_id:
                res.report.add("message_id_mismatch", f"{wrong_id} messages carry another id than their event's")
            res.notes.append(f"{sum(ids.values()):,} messages for {len(ids):,} events "
                             f"({res.report.info.get('sink_resends', 0):,} duplicates, all with their event's id)")
        finally:
            proxy.close()
            engine.dispose()
            self.pg.drop_database(db)

    def _inject_broker(self, fault: str, proxy: TcpProxy) -> str:
        if fault == "broker_cut":
            return f"{proxy.cut()} broker connection(s) reset"
        if fault == "broker_mute":
            proxy.mode = "mute"
            return "confirms held back (the relay's send times out)"
        if fault == "broker_stop":
            assert self.nats is not None
            self.nats.stop()
            return "nats-server stopped"
        raise ValueError(fault)

    @staticmethod
    def _jsonl_ids(path: Path) -> Counter[int]:
        ids: Counter[int] = Counter()
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    ids[int(json.loads(line)["id"])] += 1
                except (ValueError, KeyError, TypeError):
                    continue
        return ids

    def _redis_client(self) -> Any:
        import redis

        assert self.redis is not None
        return redis.Redis.from_url(self.redis.url, socket_timeout=5)

    def _redis_del_stream(self) -> None:
        client = self._redis_client()
        try:
            client.delete("batch_assets.outbox")
        finally:
            client.close()

    def _redis_stream_ids(self) -> Counter[int]:
        client = self._redis_client()
        ids: Counter[int] = Counter()
        try:
            last = "-"
            while True:
                batch = client.xrange("batch_assets.outbox", min=last, max="+", count=5000)
                batch = [b for b in batch if b[0] != last] if last != "-" else batch
                if not batch:
                    break
                for _entry_id, fields in batch:
                    ids[int(fields.get(b"id", b"0"))] += 1
                    payload = fields.get(b"payload", b"")
                    self._scan_text(payload.decode("utf-8", "replace"), "outbox stream (Redis)")
                last = batch[-1][0]
        finally:
            client.close()
        return ids

    # -- secret scan ---------------------------------------------------------------------

    def _scan_outbox(self, db: str) -> None:
        engine = self.admin(db)
        try:
            with engine.connect() as conn:
                result = conn.execution_options(stream_results=True).exec_driver_sql(
                    "SELECT payload::text FROM outbox_events")
                for (text,) in result:
                    self._scan_text(text, "outbox payloads")
                    self.secrets["outbox_payloads_scanned"] = self.secrets.get("outbox_payloads_scanned", 0) + 1
        finally:
            engine.dispose()

    def _scan_text(self, text: str, where: str) -> None:
        hits = self.secrets.setdefault("hits", [])
        if self.key_text and self.key_text in text:
            hits.append(f"encryption key in {where}")
        if self.pg.password in text:
            hits.append(f"database password in {where}")
        for found in checker._DATE.findall(text):
            if found in self.dobs and not self._benign_date(found):
                hits.append(f"a decrypted date of birth ({found[:4]}-**-**) in {where}")
                break

    def _benign_date(self, text: str) -> bool:
        """Dates the product prints on purpose: run dates and dates around today (timestamps)."""
        try:
            day = date.fromisoformat(text)
        except ValueError:
            return True
        return abs((day - self.run_date).days) <= 2

    def secret_scan(self) -> None:
        """stdout/stderr of every command, every file of the Dagster instance and the relay's sink files."""
        assert self.product is not None
        for result in self.product.outputs:
            self._scan_text(result.stdout + result.stderr, "CLI output")
        self.secrets["cli_outputs_scanned"] = len(self.product.outputs)
        files = 0
        for path in sorted(self.home.rglob("*")):
            if not path.is_file() or path.suffix in (".key",):
                continue
            files += 1
            where = "Dagster instance" if "dagster_home" in path.parts else f"{path.name}"
            self._scan_text(path.read_bytes().decode("utf-8", "replace"), f"{where} ({path.name})")
        self.secrets["home_files_scanned"] = files
        for body in self.secrets.get("stub_bodies", []):
            self._scan_text(body, "limits-service requests")
        self.secrets["hits"] = sorted(set(self.secrets.get("hits", [])))


PRIVILEGES_PAGE = Path(__file__).resolve().parents[1] / "docs" / "production" / "privileges.md"


def _page_grants(block: str) -> str:
    """The ```sql block after `<!-- grants:BLOCK -->` on the privileges page (the grants a DBA runs)."""
    import re

    after = PRIVILEGES_PAGE.read_text().split(f"<!-- grants:{block} -->", 1)[1]
    found = re.match(r"\s*```sql\n(.*?)\n```", after, re.DOTALL)
    if found is None:
        raise RuntimeError(f"{PRIVILEGES_PAGE}: no ```sql block after grants:{block}")
    return found.group(1)


WRITTEN_COUNTS = {
    "computed": "SELECT count(*) FROM customers WHERE age_category IS NOT NULL",
    "events": "SELECT count(*) FROM outbox_events", "triggers": "SELECT count(*) FROM review_triggers",
    "claimed": "SELECT count(*) FROM payments WHERE status <> 'NEW' OR attempts > 0",
    "queue state": "SELECT count(*) FROM ba_queue_state",
    "checkpoints": "SELECT count(*) FROM ba_checkpoints", "run history": "SELECT count(*) FROM ba_run_history",
    "locks": "SELECT count(*) FROM ba_job_locks", "leases": "SELECT count(*) FROM ba_leases",
}
"""What a refused job must not have written: counted before and after it."""


def _written_counts(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {name: int(conn.exec_driver_sql(query).scalar() or 0) for name, query in WRITTEN_COUNTS.items()}


def _refusal_violation(result: CliResult, named: str, before: dict[str, int], after: dict[str, int]) -> str | None:
    """What a run refused for lacking grant `named` did wrong: its exit, its stderr line, anything it wrote."""
    wrong = []
    if result.rc != EXIT_USAGE or result.status != "FAILURE":
        wrong.append(f"exit {result.rc} {result.status}, not 2 FAILURE")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    expected = f"error: database: permission denied: the role needs {named} (docs: production/privileges)"
    if lines != [expected]:
        wrong.append(f"stderr {len(lines)} line(s): {(lines or [''])[-1][:160]}")
    changed = {name: (count, after[name]) for name, count in before.items() if after[name] != count}
    if changed:
        wrong.append(f"written: {changed}")
    return "; ".join(wrong) or None


def plan(sizes: Sizes, rng: random.Random, *, quick: bool, redis: bool,
         brokers: tuple[str, ...] = ()) -> list[FaultSpec]:
    """The seeded list of faults: kinds, modes and injection points."""
    def at() -> float:
        return round(rng.uniform(0.1, 0.8), 2)

    def workers() -> int:
        return rng.choice((1, 2, 4))

    if quick:
        # Fifteen faults, one of each family, within the CI budget (~7 min on 2 cores).
        return [
            FaultSpec("sweep", "concurrent", "full", 0.0, workers()),
            FaultSpec("sweep", "hostile", "full", at(), workers()),
            FaultSpec("queue", "hostile", None, at()),
            FaultSpec("sweep", "terminate", "full", at(), workers()),
            FaultSpec("sweep", "restart_fast", "delta", at(), workers()),
            FaultSpec("sweep", "kill9", "config-change", at(), workers()),
            FaultSpec("sweep", "write_errors", "delta", 0.0, workers()),
            FaultSpec("sweep", "missing_privileges", "full", 0.0, workers()),
            FaultSpec("queue", "missing_privileges", None, 0.0),
            FaultSpec("queue", "limits_flaky", None, at()),
            FaultSpec("expiry", "kill9", None, at()),
            FaultSpec("relay", "restart_immediate", None, at()),
            FaultSpec("sweep", "redis_between_ranges", "full", 0.0, 2) if redis
            else FaultSpec("sweep", "sigterm", "full", at(), workers()),
            *([FaultSpec("relay", "broker_cut", brokers[0], at())] if brokers else []),
            FaultSpec("decl", "hostile_decl", rng.choice(QUICK_CASES)),  # last: the draws above stay the seed's
        ]
    specs = []
    for mode in ("full", "delta", "config-change"):
        for fault in PG_FAULTS:
            for _ in range(2):
                specs.append(FaultSpec("sweep", fault, mode, at(), workers()))
        specs.append(FaultSpec("sweep", "write_errors", mode, 0.0, workers()))
    if redis:
        specs += [
            FaultSpec("sweep", "redis_down", "full", 0.0, workers()),
            FaultSpec("sweep", "redis_restart_empty", "full", at(), workers()),
            FaultSpec("sweep", "redis_restart_empty", "delta", at(), workers()),
            FaultSpec("sweep", "redis_between_ranges", "full", 0.0, 2),
            FaultSpec("sweep", "redis_between_ranges", "config-change", 0.0, 2),
        ]
    # Other services writing while the jobs run (docs/reference/tables.md): at EDIT_RATE edits/s, a full sweep of
    # FULL.customers lasts long enough for ~8k edits, so the eight give well over 10k.
    for mode, n in (("full", 3), ("delta", 3), ("config-change", 2)):
        for _ in range(n):
            specs.append(FaultSpec("sweep", "concurrent", mode, 0.0, workers()))
    for mode in ("full", "delta", "config-change"):
        specs.append(FaultSpec("sweep", "hostile", mode, at(), workers()))
        specs.append(FaultSpec("sweep", "missing_privileges", mode, 0.0, workers()))
    for fault in ("kill9", "sigterm", "terminate", "restart_fast", "limits_down", "limits_hang", "limits_flaky",
                  "limits_503", "hostile", "hostile", "hostile", "missing_privileges"):
        specs.append(FaultSpec("queue", fault, None, at()))
    for fault in ("kill9", "sigterm", "terminate", "restart_fast", "restart_immediate"):
        specs.append(FaultSpec("expiry", fault, None, at()))
    for fault in ("kill9", "sigterm", "terminate", "restart_immediate"):
        specs.append(FaultSpec("relay", fault, None, at()))
    if redis:
        specs.append(FaultSpec("relay", "redis_restart_empty", None, at()))
    specs += [FaultSpec("decl", "hostile_decl", case.name) for case in CATALOGUE]
    return specs + _broker_specs(brokers, at) + _hosts_specs()


def _hosts_specs() -> list[FaultSpec]:
    """The several-hosts rig (full campaign only, ~12 min): when this machine can host it (root, ip netns, RabbitMQ)."""
    if hosts.unavailable_reason() is not None or not RabbitVhost.available(*hosts.DEFAULT_AMQP):
        return []
    return [FaultSpec("hosts", "host_lost", None, 0.35, 2)]


def _broker_specs(brokers: tuple[str, ...], at: Callable[[], float]) -> list[FaultSpec]:
    """The relay to each broker: unreachable, cut, mute, and (the campaign's own NATS) stopped mid-batch."""
    return [FaultSpec("relay", fault, broker, 0.0 if fault == "broker_down" else at())
            for broker in brokers for fault in BROKER_FAULTS if fault != "broker_stop" or broker == "nats"]


def make_root() -> Path:
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="ba-faults-"))
    root.chmod(0o755)
    return root


def remove_root(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
