"""Hostile declarations: the CLI against a BATCH_ASSETS_DEFS_DIR holding one declaration a careless or hostile
author wrote (docs/reference/declarations.md, "A defs.yaml is code").

Each `Case` of CATALOGUE is the campaign's valid declaration (a sweep over its team table `accounts`, or a queue
over `team_jobs`) changed in one way, with the outcome the product must give it:

- refused: every command that would act on it exits 2 with one stderr line naming the file and the attribute
  (a bad `--set` value: the field), and writes nothing (`checker.database_state` before and after);
- counted: the run goes on; the hostile rows are counted under a named kind and left as they were, the others
  are the team's rule (`checker.team_tier`), and a SUCCESS counts exactly the hostile rows;
- literal: `where` holding a template is taken as written (harmless: the row whose status is the key's text is
  never read) or refused naming `where`.

Whatever the outcome, no canary (a row's `points` or `code`, the encryption key) may be in the commands' stdout
and stderr, the product's tables (its `ba_` tables, the outbox) or the files of the Dagster instance the case
changed (event logs, compute logs, step outputs). Then the valid declaration takes the hostile one's place and
must succeed over the same table: what the hostile one left (a lock, a lease, a checkpoint) must not stand in
its way.
"""

from __future__ import annotations

import random
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
import yaml

from faults import checker
from faults.product import CliResult
from faults.services import APP_ROLE

if TYPE_CHECKING:
    from faults.campaign import Campaign, FaultResult, FaultSpec

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MARK = 10
"""A row-level case's hostile rows: `points` (a sweep) or `id` (a queue) divisible by MARK. 10 %: under the
breaker's ratio of systemic failures, so such a run may end SUCCESS and then must count each one."""
OPEN_ROWS, CLOSED_ROWS, JOBS = 240, 20, 60
SWEEP_NAME, QUEUE_NAME = "team_tier", "team_jobs"

SWEEP: dict[str, Any] = {
    "name": SWEEP_NAME, "table": "accounts", "key": "id", "columns": ["id", "points", "code", "tier", "tier_review_on"],
    "where": "status = 'OPEN'", "due": "tier_review_on", "compute": "team_tiers:compute",
    "writes": ["tier", "tier_review_on"], "sensitive": ["points", "code"], "event": "team_tier_changed",
}
QUEUE: dict[str, Any] = {
    "name": QUEUE_NAME, "table": "team_jobs", "key": "id", "columns": ["id", "body"], "handler": "team_handler:handle",
    "max_attempts": 3, "backoff": {"base_s": 60, "max_s": 600}, "concurrency": 4,
}
QUEUE_COLUMNS = ("status text NOT NULL DEFAULT 'NEW', attempts int NOT NULL DEFAULT 0, "
                 "next_attempt_at timestamptz NOT NULL DEFAULT now(), claimed_until timestamptz NULL, "
                 "last_error text NULL, processed_at timestamptz NULL")
TABLES = (
    # `number` is UNIQUE and may be NULL (one row's is): a key a careless author may pick.
    "CREATE TABLE accounts (id uuid PRIMARY KEY, number integer UNIQUE, status text NOT NULL, "
    "points integer NOT NULL, code text NOT NULL, tier text, tier_review_on date)",
    f"CREATE TABLE team_jobs (id bigint PRIMARY KEY, body text NOT NULL, {QUEUE_COLUMNS})",
    f"CREATE TABLE team_jobs_dup (id integer NOT NULL, body text NOT NULL, {QUEUE_COLUMNS})",
    f"CREATE TABLE team_jobs_null (id integer UNIQUE, body text NOT NULL, {QUEUE_COLUMNS})",
)
MODULES = {
    "team_tiers.py": '''"""The team's rule (the campaign's checker has its own: checker.team_tier)."""
from datetime import timedelta

TIERS = ("BRONZE", "SILVER", "GOLD")


def compute(row, run_date):
    return {"tier": TIERS[row["points"] % 3], "tier_review_on": run_date + timedelta(days=30)}
''',
    "team_handler.py": '''"""The team's queue handler: every job succeeds."""


def handle(*, id, body, attempts):
    return None
''',
    "hostile.py": '''"""What a careless or hostile author wrote: the team's rule, but for the rows whose points (a
job: id) are divisible by MARK."""
from batch_assets import RowFailure
from team_tiers import compute as rule

MARK = __MARK__


def kind_of_value(row, run_date):
    if row["points"] % MARK == 0:
        raise RowFailure(f"p{row['points']}")
    return rule(row, run_date)


def exits(row, run_date):
    if row["points"] % MARK == 0:
        raise SystemExit(f"v={row['code']}")
    return rule(row, run_date)


def int_for_text(row, run_date):
    if row["points"] % MARK == 0:
        return {"tier": row["points"], "tier_review_on": run_date}
    return rule(row, run_date)


def refused_by_table(row, run_date):
    if row["points"] % MARK == 0:
        return {"tier": "PLATINUM", "tier_review_on": run_date}
    return rule(row, run_date)


def handler_exits(*, id, body, attempts):
    if id % MARK == 0:
        raise SystemExit(f"v={body}")
'''.replace("__MARK__", str(MARK)),
}


@dataclass(frozen=True)
class Case:
    """One hostile declaration: the valid one changed by `change` (or padded, or declared twice), and its outcome."""

    name: str
    title: str  # what the author wrote (markdown)
    component: str  # sweep | queue
    change: dict[str, Any] = field(default_factory=dict)
    expect: str = "refused"  # refused | field | counted | literal
    attribute: str = ""  # refused, literal: the attribute the line names; field: the --set field
    kind: str = ""  # counted: the kind the hostile rows are counted under
    set_args: tuple[str, ...] = ()
    twice: bool = False  # a second folder declaring the same name
    pad_to: int = 0  # a comment makes the file this many bytes
    setup: tuple[str, ...] = ()  # SQL on the team's tables first (as the product's role)
    known: str = ""  # a failure of the product today, reported (never hidden); empty: it must pass

    @property
    def expected(self) -> str:
        if self.expect == "refused":
            return f"exit 2, one line naming the file and `{self.attribute}`, nothing written"
        if self.expect == "field":
            return f"`jobs run` exit 2, one line naming `{self.attribute}`, nothing written"
        if self.expect == "literal":
            return f"taken as written (no row but the OPEN ones read) or refused naming `{self.attribute}`"
        if self.component == "queue":
            return f"runs; the hostile jobs counted as `{self.kind}` and not DONE, the others DONE"
        return f"runs; the hostile rows counted as `{self.kind}` and left as they were, the others the rule's"


CATALOGUE: tuple[Case, ...] = (
    Case("where_breakout", "`where: \"status = 'CLOSED') OR (true\"`", "sweep",
         {"where": "status = 'CLOSED') OR (true"}, attribute="where"),
    Case("where_second_statement", "`where: \"status = 'OPEN'; UPDATE accounts SET tier = 'PWNED'\"`", "sweep",
         {"where": "status = 'OPEN'; UPDATE accounts SET tier = 'PWNED'"}, attribute="where"),
    Case("where_key_template", "`where: \"status IN ('OPEN', '{{ env.BATCH_ASSETS_ENCRYPTION_KEY }}')\"` (a row's "
         "status is the key's text)", "sweep",
         {"where": "status IN ('OPEN', '{{ env.BATCH_ASSETS_ENCRYPTION_KEY }}')"}, expect="literal",
         attribute="where"),
    Case("sweep_nullable_unique_key", "`key: number`, UNIQUE but nullable (one row's is NULL)", "sweep",
         {"key": "number", "columns": ["number", "points", "code", "tier", "tier_review_on"]}, attribute="key"),
    Case("sensitive_key", "`sensitive: [id, points, code]` (the key)", "sweep",
         {"sensitive": ["id", "points", "code"]}, attribute="sensitive"),
    Case("sweep_named_customer_status_sweep", "a sweep named `customer_status_sweep` (the product's own)", "sweep",
         {"name": "customer_status_sweep"}, attribute="name"),
    Case("defs_yaml_2mb", "the valid sweep padded to 2 MB with a comment", "sweep", pad_to=2 * 1024 * 1024,
         attribute="size"),
    Case("failure_kind_of_value", "`raise RowFailure(f\"p{points}\")` on 10 % of the rows", "sweep",
         {"compute": "hostile:kind_of_value"}, expect="counted", kind="invalid_failure_kind"),
    Case("compute_exits", "`raise SystemExit(f\"v={code}\")` on 10 % of the rows", "sweep",
         {"compute": "hostile:exits"}, expect="counted", kind="compute_error"),
    Case("int_for_text", "compute returns `points` (an int) for the text column `tier` on 10 % of the rows", "sweep",
         {"compute": "hostile:int_for_text"}, expect="counted", kind="invalid_result"),
    Case("write_refused_by_check", "compute returns a tier the table's CHECK refuses on 10 % of the rows "
         "(PostgreSQL's error quotes the whole row)", "sweep", {"compute": "hostile:refused_by_table"},
         expect="counted", kind="write_error",
         setup=("ALTER TABLE accounts ADD CONSTRAINT accounts_tier_known "
                "CHECK (tier IN ('BRONZE', 'SILVER', 'GOLD'))",)),
    Case("set_mode_object", "`jobs run team_tier --set 'mode={\"a\":1}'`", "sweep",
         set_args=("--set", 'mode={"a":1}'), expect="field", attribute="mode"),
    Case("set_workers_null", "`jobs run team_tier --set workers=null`", "sweep",
         set_args=("--set", "workers=null"), expect="field", attribute="workers"),
    Case("queue_key_not_unique", "a queue whose `key` is not unique (ids 1, 1, 2, 2, ...)", "queue",
         {"table": "team_jobs_dup"}, attribute="key"),
    Case("queue_key_nullable", "a queue whose `key` is UNIQUE but nullable (one row's is NULL)", "queue",
         {"table": "team_jobs_null"}, attribute="key"),
    Case("queue_named_payments", "a queue named `payments` (the product's own)", "queue", {"name": "payments"},
         attribute="name",
         setup=("INSERT INTO payments (id, amount_cents) SELECT gen_random_uuid(), 100 + g "
                "FROM generate_series(1, 20) AS g",)),
    Case("two_queues_one_name", "two folders declaring the queue `team_jobs`", "queue", twice=True,
         attribute="name"),
    Case("handler_exits", "a handler that raises `SystemExit(f\"v={body}\")` on 10 % of the jobs", "queue",
         {"handler": "hostile:handler_exits"}, expect="counted", kind="handler_SystemExit"),
)
CASES = {case.name: case for case in CATALOGUE}
QUICK_CASES = tuple(case.name for case in CATALOGUE if not case.known)
"""The quick campaign draws one of these: a known failure, reported in docs/reliability.md, does not fail CI."""


# --- setting up ------------------------------------------------------------------------------------------


def create_team_tables(engine: sa.Engine, rng: random.Random, key_text: str,
                       owner: str | None = APP_ROLE) -> checker.Canaries:
    """The team's tables, owned by `owner` (the product's role), with a canary in every row; one row's status is
    the key's text."""
    codes: list[str] = []
    points: list[int] = []
    with engine.begin() as conn:
        if owner is not None:
            conn.exec_driver_sql(f"SET LOCAL ROLE {owner}")
        for statement in TABLES:
            conn.exec_driver_sql(statement)
        accounts = []
        for i in range(OPEN_ROWS + CLOSED_ROWS + 1):
            status = "OPEN" if i < OPEN_ROWS else "CLOSED" if i < OPEN_ROWS + CLOSED_ROWS else key_text
            value = rng.randrange(100_000_000, 999_999_999)
            if i == 0:
                value -= value % MARK  # at least one hostile row
            code = checker.Canaries.code(rng)
            codes.append(code)
            points.append(value)
            accounts.append({"id": _uuid(rng), "number": i or None, "status": status, "points": value, "code": code})
        conn.execute(sa.text("INSERT INTO accounts (id, number, status, points, code) "
                             "VALUES (:id, :number, :status, :points, :code)"), accounts)
        for table, ids in (("team_jobs", range(1, JOBS + 1)), ("team_jobs_dup", [(i + 1) // 2 for i in range(JOBS)]),
                           ("team_jobs_null", [None, *range(1, JOBS)])):
            bodies = [checker.Canaries.code(rng) for _ in ids]
            codes.extend(bodies)
            conn.execute(sa.text(f"INSERT INTO {table} (id, body) VALUES (:id, :body)"),  # noqa: S608
                         [{"id": jid, "body": body} for jid, body in zip(ids, bodies, strict=True)])
    return checker.Canaries(frozenset(codes), frozenset(str(p) for p in points), key_text)


def _uuid(rng: random.Random) -> Any:
    import uuid

    return uuid.UUID(int=rng.getrandbits(128), version=4)


def write_declaration(folder: Path, case: Case | None, component: str) -> Path:
    """The declaration (the valid one when `case` is None) in `folder`/<name>/defs.yaml with the team's modules
    beside it; returns the file the product must name (the second of two when declared twice)."""
    if folder.exists():
        shutil.rmtree(folder)
    attributes = dict(SWEEP if component == "sweep" else QUEUE)
    attributes.update(case.change if case is not None else {})
    kind = "batch_assets.SweepComponent" if component == "sweep" else "batch_assets.TableQueueComponent"
    text = yaml.safe_dump({"type": kind, "attributes": attributes}, sort_keys=False, width=200)
    if case is not None and case.pad_to:
        line = "# " + "x" * 1021 + "\n"
        text += line * ((case.pad_to - len(text)) // len(line) + 1)
    paths = []
    for sub in ("a_team", "b_team") if case is not None and case.twice else ("a_team",):
        path = folder / sub / "defs.yaml"
        path.parent.mkdir(parents=True)
        path.write_text(text)
        for module, source in MODULES.items():
            (path.parent / module).write_text(source)
        paths.append(path)
    return paths[-1].resolve()


def commands(case: Case, run_date: str) -> list[tuple[tuple[str, ...], str]]:
    """The commands run against the declaration, each with what it must do:
    refused | field | quiet (exit 0, nothing written) | quiet_or_refused | ran | ran_or_refused | installs."""
    refused = case.expect == "refused"
    if case.component == "queue":
        return [(("db", "migrate"), "refused" if refused else "installs"),
                (("jobs", "list"), "refused" if refused else "quiet"),
                (("queue", "work", "--queue", str(case.change.get("name", QUEUE_NAME)), "--drain"),
                 "refused" if refused else "ran")]
    name = str(case.change.get("name", SWEEP_NAME))
    run = {"refused": "refused", "field": "field", "counted": "ran", "literal": "ran_or_refused"}[case.expect]
    return [(("db", "migrate"), "quiet_or_refused" if refused else "quiet"),
            (("jobs", "list"), {"refused": "refused", "literal": "quiet_or_refused"}.get(case.expect, "quiet")),
            (("jobs", "run", name, "--set", "mode=full", "--set", f"run_date={run_date}", *case.set_args), run)]


# --- judging -----------------------------------------------------------------------------------------------


def refusal_problems(result: CliResult, how: str, path: Path, attribute: str, changed: list[str]) -> list[str]:
    """What a command that must be refused did wrong: its exit, its stderr line, a run, anything written."""
    wrong = []
    if result.rc != EXIT_USAGE:
        wrong.append(f"exit {result.rc}, not 2")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    line = lines[0] if len(lines) == 1 else ""
    if len(lines) != 1:
        wrong.append(f"{len(lines)} stderr lines, not 1")
    elif how == "field" and not line.startswith(f"error: {attribute}: "):
        wrong.append(f"the line does not name `{attribute}`")
    elif how != "field" and (str(path) not in line or f": {attribute}:" not in line):
        wrong.append(f"the line does not name {path.parent.name}/{path.name} and `{attribute}`")
    if (result.summary or {}).get("run_id"):
        wrong.append("a run was started")
    if changed:
        wrong.append(f"written: {', '.join(changed)}")
    return wrong


def judge_run(case: Case, result: CliResult, hostile_rows: int, report: checker.Report) -> list[str]:
    """A run of a counted case: SUCCESS counts exactly the hostile rows under the kind (and `changed` the rows the
    checker saw written); FAILURE (the breaker) counts some of them; no other kind. A queue counts a transient
    failure (what a handler raised) in `retried_by_type`, a row's last attempt in `failed_by_type`: both count."""
    summary = result.summary or {}
    by_type: dict[str, int] = {}
    for counted in ("failed_by_type", "retried_by_type"):
        for k, v in (summary.get(counted) or {}).items():
            if int(v or 0):
                by_type[k] = by_type.get(k, 0) + int(v)
    got = by_type.pop(case.kind, 0)
    wrong = []
    success = result.rc == EXIT_OK and summary.get("status") == "SUCCESS"
    if not success and not (result.rc == EXIT_FAILED and summary.get("status") == "FAILURE"):
        wrong.append(f"exit {result.rc} {summary.get('status')}, not 0 SUCCESS or 1 FAILURE")
    if success and got != hostile_rows or not success and not 0 < got <= hostile_rows:
        wrong.append(f"`{case.kind}` {got}, the hostile rows {hostile_rows}")
    if by_type:
        shown = {k if KIND_SHOWN.fullmatch(k) else "(a kind that is no word)" for k in by_type}
        wrong.append(f"counted under other kinds too: {sorted(shown)}")
    written = report.info["team_rows_written"] if case.component == "sweep" else report.info["team_jobs_done"]
    if success and case.component == "sweep" and summary.get("changed") != written:
        wrong.append(f"changed {summary.get('changed')}, the checker saw {written} rows written")
    return wrong


KIND_SHOWN = re.compile(r"[A-Za-z][A-Za-z_]{0,60}")


def _brief(result: CliResult, how: str, attribute: str, problems: list[str]) -> str:
    words = " ".join(result.args[:2])
    summary = result.summary or {}
    retried = summary.get("retried_by_type") or {}
    if result.rc == EXIT_USAGE:
        text = f"{words}: exit 2, one line naming `{attribute}`" if not problems else f"{words}: exit 2"
    elif how in ("ran", "ran_or_refused"):
        # A kind made of a row's value (a product that let one through) is not repeated here.
        counted = {k if KIND_SHOWN.fullmatch(k) else "(a kind that is no word)": v
                   for counts in ("failed_by_type", "retried_by_type")
                   for k, v in (summary.get(counts) or {}).items() if v}
        kinds = [f"{k} {v}" + (" retried" if k in retried else "") for k, v in sorted(counted.items())]
        text = (f"{words}: exit {result.rc} {summary.get('status')}, changed {summary.get('changed')}"
                + (f", {', '.join(kinds)}" if kinds else ""))
    else:
        text = f"{words}: exit {result.rc}" + (", nothing written" if how.startswith("quiet") and not problems else "")
    return text + (f" ({'; '.join(problems)})" if problems else "")


# --- the scenario ------------------------------------------------------------------------------------------


def run_case(c: Campaign, spec: FaultSpec, res: FaultResult) -> None:
    """One hostile declaration (spec.mode names it): its commands, then the valid declaration; rows and canaries."""
    case = CASES[str(spec.mode)]
    db = c.clone("tpl_fresh")
    since = time.time() - 1
    first_output = len(c.product.outputs) if c.product is not None else 0
    folder = c.root / "declarations" / db
    engine = c.admin(db)
    outcome = checker.DeclarationOutcome(case.name, case.title, case.component, case.expected, known=case.known)
    res.declaration = outcome
    rd = c.run_date.isoformat()
    try:
        canaries = create_team_tables(engine, random.Random(res.seed), c.key_text)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"SET LOCAL ROLE {APP_ROLE}")
            for statement in case.setup:
                conn.exec_driver_sql(statement)
        path = write_declaration(folder, case, case.component)
        env = {**c.env_for(db), "BATCH_ASSETS_DEFS_DIR": str(folder)}
        with engine.connect() as conn:
            before = checker.team_accounts(conn)
            state = checker.database_state(conn)
        res.injected, res.injected_note = True, f"{case.title}, in {path.parent.name}/{path.name}"
        for args, how in commands(case, rd):
            result = c.cli(db, *args, env=env, timeout=180)
            with engine.connect() as conn:
                after = checker.database_state(conn)
            problems = _judge(case, how, result, path, checker.changed_tables(state, after), engine, before, res,
                              c.run_date)
            state = after
            outcome.observed.append(_brief(result, how, case.attribute, problems))
            outcome.problems.extend(f"{' '.join(args[:2])}: {p}" for p in problems)
        for problem in outcome.problems:
            res.report.add("command_not_as_expected", problem)
        res.faulted = "; ".join(outcome.observed)
        _recover(c, db, case, folder, env, res)
        texts = _texts(c, engine, first_output, since)
        for where, text in texts:
            for what in canaries.found(text):
                res.report.add("canary_leak", f"{what} in {where}")
        res.notes.append(f"canaries searched in {len(texts)} texts: stdout and stderr of every command, the "
                         "product's tables, the Dagster instance's files the case changed")
        if case.known and res.report.ok and res.recovered:
            res.report.add("known_failure_passes", f"{case.name} passes: take its known failure off the catalogue")
    finally:
        engine.dispose()
        c.pg.drop_database(db)
        shutil.rmtree(folder, ignore_errors=True)


def _judge(case: Case, how: str, result: CliResult, path: Path, changed: list[str], engine: sa.Engine,
           before: dict[Any, checker.Account], res: FaultResult, run_date: date) -> list[str]:
    if how in ("refused", "field") or how.endswith("_or_refused") and result.rc == EXIT_USAGE:
        return refusal_problems(result, "field" if how == "field" else "refused", path, case.attribute, changed)
    # The report never quotes the product's output here: it may hold a canary (the case's work dir keeps it).
    if how in ("quiet", "quiet_or_refused"):
        wrong = [] if result.rc == EXIT_OK else [f"exit {result.rc}, not 0"]
        return wrong + ([f"written: {', '.join(changed)}"] if changed else [])
    if how == "installs":
        return [] if result.rc == EXIT_OK else [f"exit {result.rc}, not 0"]
    # A run: the team's rows, and (counted) its counts.
    with engine.connect() as conn:
        if case.component == "sweep":
            summary = result.summary or {}
            success = result.rc == EXIT_OK and summary.get("status") == "SUCCESS"
            hostile = (lambda points: points % MARK == 0) if case.expect == "counted" else None
            report = checker.check_team_accounts(before, checker.team_accounts(conn), run_date,
                                                 hostile=hostile, complete=success)
            hostile_rows = sum(1 for a in before.values() if a.status == "OPEN" and hostile is not None
                               and hostile(a.points))
        else:
            drained = result.rc == EXIT_OK and result.status == "SUCCESS"
            report = checker.check_team_jobs(checker.team_jobs(conn), hostile=lambda jid: jid % MARK == 0,
                                             complete=drained)
            hostile_rows = sum(1 for jid in range(1, JOBS + 1) if jid % MARK == 0)
    res.report.merge(report)
    if case.expect == "literal":
        wrong = [] if result.rc == EXIT_OK and result.status == "SUCCESS" else [f"exit {result.rc}, not 0"]
        return wrong + [f"{n} row(s) {k}" for k, n in report.violations.items()]
    return judge_run(case, result, hostile_rows, report) + [f"{n} row(s) {k}" for k, n in report.violations.items()]


def _recover(c: Campaign, db: str, case: Case, folder: Path, env: dict[str, str], res: FaultResult) -> None:
    """The valid declaration in the hostile one's place, run until SUCCESS; then every row in its scope is the rule's
    and every other as the hostile commands left it (what they wrote is counted once, with them)."""
    write_declaration(folder, None, case.component)
    engine = c.admin(db)
    try:
        if case.component == "sweep":
            with engine.connect() as conn:
                before = checker.team_accounts(conn)
            args = ["jobs", "run", SWEEP_NAME, "--set", "mode=full", "--set", f"run_date={c.run_date.isoformat()}"]
            c.recover(db, args, res, time.monotonic(), env=env)
            with engine.connect() as conn:
                res.report.merge(checker.check_team_accounts(before, checker.team_accounts(conn), c.run_date,
                                                             complete=True))
            return
        migrated = c.cli(db, "db", "migrate", env=env)
        if migrated.rc != EXIT_OK:
            res.notes.append(f"db migrate of the valid queue: {migrated.brief()} {migrated.stderr_tail(1)[:160]}")

        def fast_forward() -> None:
            # Backoff and claim leases run in minutes: their time passes while no worker runs.
            with engine.begin() as conn:
                conn.exec_driver_sql("UPDATE team_jobs SET next_attempt_at = now() WHERE status = 'NEW'")
                conn.exec_driver_sql("UPDATE team_jobs SET claimed_until = now() - interval '1 second' "
                                     "WHERE status = 'PROCESSING'")

        def all_done(_: CliResult) -> bool:
            with engine.connect() as conn:
                return not conn.exec_driver_sql("SELECT count(*) FROM team_jobs WHERE status <> 'DONE'").scalar()

        c.recover(db, ["queue", "work", "--queue", QUEUE_NAME, "--drain"], res, time.monotonic(), env=env,
                  before_each=fast_forward, done=all_done)
        with engine.connect() as conn:
            res.report.merge(checker.check_team_jobs(checker.team_jobs(conn), complete=True))
    finally:
        engine.dispose()


def _texts(c: Campaign, engine: sa.Engine, first_output: int, since: float) -> list[tuple[str, str]]:
    """Every text the case's commands left: their stdout and stderr, the product's tables, the instance's files."""
    assert c.product is not None
    outputs = c.product.outputs[first_output:]
    texts = [(f"the output of `{' '.join(r.args[:2])}`", r.stdout + r.stderr) for r in outputs]
    with engine.connect() as conn:
        texts += [(name, text) for name, text in checker.bookkeeping_texts(conn)]
    run_ids = {str((r.summary or {}).get("run_id")) for r in outputs if (r.summary or {}).get("run_id")}
    texts += list(instance_texts(c.home, since, run_ids))
    return texts


def instance_texts(home: Path, since: float, run_ids: set[str]) -> Iterator[tuple[str, str]]:
    """The files under BATCH_ASSETS_HOME changed since `since`: SQLite stores (the Dagster instance's runs and event
    logs) row by row, the runs' rows only where a table has a run_id; every other file (compute logs, step outputs,
    sink files) as it is."""
    for path in sorted(home.rglob("*")):
        if not path.is_file() or path.suffix == ".key" or path.stat().st_mtime < since:
            continue
        if path.suffix == ".db" and path.parent.name == "runs":
            run_ids = run_ids | ({path.stem} if len(path.stem) == 36 else set())
        text = sqlite_text(path, run_ids) if path.suffix == ".db" else path.read_bytes().decode("utf-8", "replace")
        yield f"the Dagster instance ({path.relative_to(home)})", text


def sqlite_text(path: Path, run_ids: set[str]) -> str:
    """Every row of a SQLite file as text (a value split over overflow pages is whole here); a table with a run_id
    column only for `run_ids`. The raw bytes when it is no SQLite file."""
    import sqlite3

    parts: list[str] = []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for table in tables:
                quoted = '"' + table.replace('"', '""') + '"'  # a name from the file's own catalog
                columns = [r[1] for r in conn.execute(f"PRAGMA table_info({quoted})")]
                if "run_id" in columns:
                    if not run_ids:
                        continue
                    marks = ",".join("?" * len(run_ids))
                    rows = conn.execute(f"SELECT * FROM {quoted} WHERE run_id IN ({marks})",  # noqa: S608
                                        tuple(sorted(run_ids)))
                else:
                    rows = conn.execute(f"SELECT * FROM {quoted}")  # noqa: S608
                parts.extend(" ".join(str(v) for v in row) for row in rows)
        finally:
            conn.close()
    except sqlite3.Error:
        return path.read_bytes().decode("utf-8", "replace")
    return "\n".join(parts)
