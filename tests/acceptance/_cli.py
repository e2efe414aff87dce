"""Shared helpers of the acceptance tests: drive `batch-assets` as a subprocess, poll, check rows.

Everything here talks to the product only through its external surfaces (docs/reference/):
the command line, its exit codes and JSON summary, and the tables (docs/reference/tables.md). The
age-category oracle below is written from the age-category rule (docs/reference/rules.md) on purpose, independently of
`batch_assets.reference.customer_status.rules`, so a bug there cannot hide itself.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from helpers import SUITE_LAUNCHER, kill_session
from helpers import scalar as scalar  # the acceptance tests' one-value query, re-exported
from helpers import wait_for as wait_for  # the acceptance tests' poll, re-exported

REPO = Path(__file__).resolve().parents[2]
SENTINEL = date(9999, 12, 31)
DEFAULT_RULES: tuple[tuple[str, int], ...] = (("MINOR", 0), ("YOUNG_ADULT", 18), ("ADULT", 26), ("SENIOR", 65))
COMMON_KEYS = ("status", "run_id", "scanned", "changed", "unchanged", "failed", "failed_by_type", "duration_s")
SWEEP_KEYS = COMMON_KEYS + ("mode", "run_date", "pages", "decrypted", "triggers", "audit_events", "resumed_from")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 75
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


# --- running the CLI ------------------------------------------------------------------------------


@dataclass
class CliResult:
    args: Sequence[str]
    returncode: int
    stdout: str
    stderr: str

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

    def describe(self) -> str:
        return (
            f"`batch-assets {' '.join(self.args)}` exited {self.returncode}\n"
            f"--- stdout (tail) ---\n{self.stdout[-3000:]}\n--- stderr (tail) ---\n{self.stderr[-4000:]}"
        )


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "batch_assets.cli", *args]


def run_cli(env: Mapping[str, str], *args: str, timeout: float = 120) -> CliResult:
    """Run `batch-assets ARGS` to completion (through the test process's resident launcher: helpers.SuiteLauncher)."""
    proc = subprocess.run(
        cli_command(*args), env=SUITE_LAUNCHER.env(env), capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    return CliResult(args, proc.returncode, proc.stdout, proc.stderr)


def ok(env: Mapping[str, str], *args: str, timeout: float = 120) -> dict[str, Any]:
    """Run a command that must succeed (exit 0) and return its JSON summary."""
    result = run_cli(env, *args, timeout=timeout)
    assert result.returncode == EXIT_OK, result.describe()
    summary = result.summary
    assert summary is not None, "no JSON object on the last line of stdout\n" + result.describe()
    return summary


class CliProcess:
    """`batch-assets ARGS` running in its own session; output goes to files (no pipe can fill up)."""

    def __init__(self, env: Mapping[str, str], args: Sequence[str], workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex[:8]
        self.args = list(args)
        self.out_path = workdir / f"cli-{tag}.out"
        self.err_path = workdir / f"cli-{tag}.err"
        self._out = self.out_path.open("w")
        self._err = self.err_path.open("w")
        self.popen = subprocess.Popen(
            cli_command(*args), env=dict(env), stdout=self._out, stderr=self._err, cwd=REPO,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        os.kill(self.popen.pid, sig)

    def wait(self, timeout: float = 120) -> CliResult:
        try:
            returncode = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            raise AssertionError(f"`batch-assets {' '.join(self.args)}` did not end within {timeout}s") from None
        self._out.close()
        self._err.close()
        return CliResult(self.args, returncode, self.out_path.read_text(), self.err_path.read_text())

    def kill_group(self) -> None:
        """SIGKILL the session this process leads (only processes started here)."""
        kill_session(self.popen)

    def output(self) -> str:
        return self.err_path.read_text()[-4000:] if self.err_path.exists() else ""

    def __enter__(self) -> CliProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_group()
        self._out.close()
        self._err.close()


def dagster_event_text(home: Path) -> tuple[int, str]:
    """Every event of every run on the CLI's Dagster instance (and its run configs), as text."""
    import dagster as dg
    from dagster._serdes import serialize_value

    texts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with dg.DagsterInstance.from_config(str(home / "dagster_home")) as instance:
            runs = instance.get_runs()
            for run in runs:
                texts.append(repr(run.run_config))
                texts.append(repr(run.tags))
                for record in instance.all_logs(run.run_id):
                    texts.append(serialize_value(record))
                    texts.append(record.message or "")
    return len(runs), "\n".join(texts)


# --- the database ----------------------------------------------------------------------------------


def rows(engine: sa.Engine, query: str, **params: Any) -> list[sa.Row]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(query), params).all())


def write_scalar(engine: sa.Engine, query: str, **params: Any) -> Any:
    """Run a writing statement (e.g. INSERT ... RETURNING) in its own committed transaction."""
    with engine.begin() as conn:
        return conn.execute(sa.text(query), params).scalar()


def execute(engine: sa.Engine, query: str, **params: Any) -> int:
    with engine.begin() as conn:
        return conn.execute(sa.text(query), params).rowcount


def expire_locks(engine: sa.Engine) -> None:
    """Simulate the passage of time: every job lock (lock-at-most-for and lock-at-least-for) and every
    lease has expired. The CLI cannot shorten these TTLs, and the tests cannot wait minutes."""
    execute(engine, "UPDATE ba_job_locks SET lock_until = now() - interval '1 second', "
                    "min_until = least(min_until, now() - interval '1 second')")
    execute(engine, "UPDATE ba_leases SET expires_at = now() - interval '1 second'")


def customers_snapshot(engine: sa.Engine) -> dict[uuid.UUID, tuple]:
    """Every customer row with its row version (xmin): equal snapshots mean nothing was written."""
    return {
        r.id: (r.xmin, r.status, r.age_category, r.next_review_date, r.updated_at)
        for r in rows(engine, "SELECT id, xmin::text AS xmin, status, age_category, next_review_date, updated_at "
                              "FROM customers")
    }


def table_counts(engine: sa.Engine) -> dict[str, int]:
    return {
        "review_triggers": scalar(engine, "SELECT count(*) FROM review_triggers"),
        "outbox_events": scalar(engine, "SELECT count(*) FROM outbox_events"),
    }


def today_utc() -> date:
    return datetime.now(UTC).date()


# --- the age-category rule (docs/reference/rules.md), written independently ----------------------------------


def _birthday(dob: date, year: int) -> date:
    """The day in `year` on which a new age is reached (29 Feb → 1 Mar in common years)."""
    if dob.month == 2 and dob.day == 29 and not calendar.isleap(year):
        return date(year, 3, 1)
    return dob.replace(year=year)


def age_on(dob: date, day: date) -> int:
    years = day.year - dob.year
    return years - 1 if day < _birthday(dob, day.year) else years


@dataclass(frozen=True)
class Expected:
    category: str
    next_review_date: date
    since: date
    """The date on which `category` began: a review trigger's effective_date."""


def oracle(dob: date, run_date: date, rules: Sequence[tuple[str, int]] = DEFAULT_RULES) -> Expected:
    age = age_on(dob, run_date)
    index = max(i for i, (_, min_age) in enumerate(rules) if min_age <= age)
    category, min_age = rules[index]
    since = _birthday(dob, dob.year + min_age)
    if index + 1 < len(rules):
        next_review = _birthday(dob, dob.year + rules[index + 1][1])
    else:
        next_review = SENTINEL
    return Expected(category, next_review, since)


@dataclass
class Classified:
    """Customers split into the evaluable ones (with their DOB) and the failures by kind (docs/reference/rules.md)."""

    good: dict[uuid.UUID, date] = field(default_factory=dict)
    bad: dict[uuid.UUID, str] = field(default_factory=dict)

    def kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for kind in self.bad.values():
            counts[kind] = counts.get(kind, 0) + 1
        return counts


def classify(engine: sa.Engine, cipher: Any, run_date: date, where: str = "status = 'ACTIVE'") -> Classified:
    """Decrypt every ACTIVE row with the test's key (the way another holder of the key would)."""
    from batch_assets.errors import DecryptError

    out = Classified()
    for r in rows(engine, f"SELECT id, encrypted_dob FROM customers WHERE {where}"):
        if r.encrypted_dob is None:
            out.bad[r.id] = "missing_data"
            continue
        try:
            text = cipher.decrypt_text(r.id, bytes(r.encrypted_dob))
        except DecryptError:
            out.bad[r.id] = "decrypt_failure"
            continue
        try:
            if len(text) != 10 or not DATE_RE.fullmatch(text):
                raise ValueError(text)
            dob = date.fromisoformat(text)
        except ValueError:
            out.bad[r.id] = "invalid_value"
            continue
        if dob > run_date:
            out.bad[r.id] = "invalid_value"
            continue
        out.good[r.id] = dob
    return out


def mismatches(
    engine: sa.Engine, classified: Classified, run_date: date, rules: Sequence[tuple[str, int]] = DEFAULT_RULES,
    ids: Iterable[uuid.UUID] | None = None,
) -> list[str]:
    """Rows whose stored (age_category, next_review_date) differ from the age-category rule
    (docs/reference/rules.md); failed rows must stay due."""
    stored = {r.id: r for r in rows(engine, "SELECT id, age_category, next_review_date FROM customers")}
    wanted = set(ids) if ids is not None else set(classified.good) | set(classified.bad)
    problems = []
    for cid in sorted(wanted):
        row = stored[cid]
        if cid in classified.good:
            exp = oracle(classified.good[cid], run_date, rules)
            if (row.age_category, row.next_review_date) != (exp.category, exp.next_review_date):
                problems.append(
                    f"{cid}: stored ({row.age_category}, {row.next_review_date}) expected "
                    f"({exp.category}, {exp.next_review_date})"
                )
        elif row.next_review_date is not None and row.next_review_date > run_date:
            problems.append(f"{cid}: failed row ({classified.bad[cid]}) is no longer due: {row.next_review_date}")
    return problems


def assert_summary_keys(summary: Mapping[str, Any], keys: Sequence[str] = COMMON_KEYS) -> None:
    missing = [k for k in keys if k not in summary]
    assert not missing, f"summary lacks {missing}: {summary}"
    assert summary["status"] in ("SUCCESS", "FAILURE", "SKIPPED"), summary
    assert isinstance(summary["failed_by_type"], dict), summary
    for key in ("scanned", "changed", "unchanged", "failed"):
        assert isinstance(summary[key], int) and summary[key] >= 0, (key, summary)
    assert isinstance(summary["duration_s"], int | float) and summary["duration_s"] >= 0, summary


def nonzero(counts: Mapping[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


def seed_customers(env: Mapping[str, str], rows_: int, *extra: str) -> dict[str, Any]:
    return ok(env, "seed", "customers", "--rows", str(rows_), *extra)


def summary_run_date(seed_summary: Mapping[str, Any]) -> date:
    """The date the seed settled the table for (an extra key of the seed summary), else today in UTC."""
    text = seed_summary.get("run_date")
    return date.fromisoformat(text) if isinstance(text, str) else today_utc()


def outbox_per_customer(engine: sa.Engine) -> dict[uuid.UUID, int]:
    return {r.aggregate_id: r.n for r in rows(engine, "SELECT aggregate_id, count(*) AS n FROM outbox_events "
                                                       "GROUP BY aggregate_id")}
