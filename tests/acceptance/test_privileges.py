"""The grants of docs/production/privileges.md, run as written: the owner migrates, the run role gets exactly the
blocks of the page (read from the page itself, so the page and this test cannot drift), and a declared sweep (full,
then delta) and a declared queue (drain) run through the CLI with that role. A role that lacks a grant is refused
before the job starts: exit 2, one line naming the grant, nothing written."""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from _cli import EXIT_OK, EXIT_USAGE, REPO, CliResult, run_cli, scalar
from sqlalchemy.engine import make_url

from batch_assets.settings import environ_without_product

pytestmark = pytest.mark.integration

PAGE = REPO / "docs" / "production" / "privileges.md"
RUN_DATE = "2026-12-01"


def grants(block: str) -> str:
    """The ```sql block after `<!-- grants:BLOCK -->` on the privileges page."""
    after = PAGE.read_text().split(f"<!-- grants:{block} -->", 1)[1]
    found = re.match(r"\s*```sql\n(.*?)\n```", after, re.DOTALL)
    assert found is not None, f"the marker grants:{block} must be followed by a ```sql block"
    return found.group(1)


@dataclass
class Roles:
    """The test's roles (cluster-wide, so named uniquely) and its database."""

    owner: str
    runner: str
    team: str
    database: str
    url: str
    engine: sa.Engine
    """The test database as the superuser (checks)."""

    def sql(self, block: str) -> str:
        """A block of the page with this test's names in place of the page's."""
        text = grants(block)
        for page_name, name in (("batch_owner", self.owner), ("batch_runner", self.runner),
                                ("team_owner", self.team)):
            text = re.sub(rf"\b{page_name}\b", f'"{name}"', text)
        return re.sub(r"\bDATABASE app\b", f'DATABASE "{self.database}"', text)

    def url_of(self, role: str) -> str:
        return make_url(self.url).set(username=role, password=None).render_as_string(hide_password=False)


@contextmanager
def roles_on(url: str) -> Iterator[Roles]:
    """Three roles of this test on the database `url` (the team's, the owner, the runner); each is dropped with what
    it owns and was granted, also when the test fails."""
    suffix = uuid.uuid4().hex[:10]
    database = str(make_url(url).database)
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    found = Roles(f"ba_own_{suffix}", f"ba_run_{suffix}", f"ba_team_{suffix}", database, url, engine)
    try:
        yield found
    finally:
        with engine.connect() as conn:
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename IN (%(a)s, %(b)s, %(c)s)",
                {"a": found.owner, "b": found.runner, "c": found.team})
            for role in (found.runner, found.owner, found.team):
                exists = conn.exec_driver_sql("SELECT 1 FROM pg_roles WHERE rolname = %(r)s", {"r": role}).first()
                if exists:
                    conn.exec_driver_sql(f'DROP OWNED BY "{role}" CASCADE')
                    conn.exec_driver_sql(f'DROP ROLE "{role}"')
        engine.dispose()


@pytest.fixture
def roles(empty_db_url: str) -> Iterator[Roles]:
    """A new database whose example tables (accounts, notifications) the team's role owns."""
    with roles_on(empty_db_url) as found, found.engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE ROLE "{found.team}" NOLOGIN')
        conn.exec_driver_sql(f'GRANT CREATE ON SCHEMA public TO "{found.team}"')
        conn.exec_driver_sql(f'SET ROLE "{found.team}"')
        conn.exec_driver_sql((REPO / "examples" / "loyalty" / "accounts.sql").read_text())
        conn.exec_driver_sql((REPO / "examples" / "notifications" / "schema.sql").read_text())
        conn.exec_driver_sql(
            "INSERT INTO notifications (recipient, body) SELECT 'user' || g || '@example.com', 'hello' "
            "FROM generate_series(1, 40) AS g")
        conn.exec_driver_sql("RESET ROLE")
        yield found


@pytest.fixture
def defs(tmp_path: Path) -> Path:
    """The two examples as the team's declarations (loyalty: a sweep; notifications: a queue)."""
    folder = tmp_path / "defs"
    for example in ("loyalty", "notifications"):
        shutil.copytree(REPO / "examples" / example, folder / example)
    return folder


def env_for(url: str, defs: Path, tmp_path: Path, key_text: str) -> dict[str, str]:
    env = environ_without_product()
    env.update(BATCH_ASSETS_DATABASE_URL=url, BATCH_ASSETS_ENCRYPTION_KEY=key_text,
               BATCH_ASSETS_HOME=str(tmp_path / "home"), BATCH_ASSETS_DEFS_DIR=str(defs),
               NOTIFICATIONS_SENT=str(tmp_path / "sent.jsonl"))
    return env


def run_as_superuser(url: str, sql: str) -> None:
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


def migrated(roles: Roles, defs: Path, tmp_path: Path, key_text: str) -> None:
    """The page's migrate block, then `db migrate` as the owner (the library's set, the reference project's, the
    queue's claim token, indexes and trigger on the team's table)."""
    run_as_superuser(roles.url, roles.sql("migrate"))
    result = run_cli(env_for(roles.url_of(roles.owner), defs, tmp_path, key_text), "db", "migrate")
    assert result.returncode == EXIT_OK, result.describe()
    assert result.summary is not None and "notifications" in result.summary["queues"]


def one_line(result: CliResult) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.describe()
    return lines[0]


def test_the_pages_grants_run_a_declared_sweep_and_a_declared_queue(
    roles: Roles, defs: Path, tmp_path: Path, key_text: str
) -> None:
    """Exactly the page's grants: a full sweep, a delta and a queue drain succeed with the right rows."""
    migrated(roles, defs, tmp_path, key_text)
    run_as_superuser(roles.url, "\n".join(roles.sql(b) for b in ("every-job", "sweep", "queue")))
    env = env_for(roles.url_of(roles.runner), defs, tmp_path, key_text)

    full = run_cli(env, "jobs", "run", "loyalty_tier", "--set", "mode=full", "--set", f"run_date={RUN_DATE}")
    assert full.returncode == EXIT_OK, full.describe()
    assert full.summary is not None
    assert (full.summary["status"], full.summary["changed"], full.summary["failed"]) == ("SUCCESS", 999, 1)
    assert scalar(roles.engine, "SELECT count(*) FROM accounts WHERE tier IS NOT NULL") == 999
    assert scalar(roles.engine, "SELECT count(*) FROM outbox_events WHERE event_type = 'tier_changed'") == 999

    delta = run_cli(env, "jobs", "run", "loyalty_tier", "--set", "mode=delta", "--set", f"run_date={RUN_DATE}")
    assert delta.returncode == EXIT_OK, delta.describe()
    assert delta.summary is not None and (delta.summary["scanned"], delta.summary["changed"]) == (1, 0)

    drained = run_cli(env, "queue", "work", "--queue", "notifications", "--drain")
    assert drained.returncode == EXIT_OK, drained.describe()
    assert scalar(roles.engine, "SELECT count(*) FROM notifications WHERE status = 'DONE'") == 40
    assert len((tmp_path / "sent.jsonl").read_text().splitlines()) == 40


def test_a_role_with_only_the_tables_grants_is_refused_naming_the_ledger(
    roles: Roles, defs: Path, tmp_path: Path, key_text: str
) -> None:
    """Only what the job's own tables need (no grant on the library's bookkeeping): exit 2, one line naming the
    ledger grant, and nothing written (not a row, not an event, no run history)."""
    migrated(roles, defs, tmp_path, key_text)
    tables_only = "\n".join(line for block in ("every-job", "sweep", "queue") for line in roles.sql(block).splitlines()
                            if " ba_" not in line and "ba_rate_take" not in line)
    run_as_superuser(roles.url, tables_only)
    env = env_for(roles.url_of(roles.runner), defs, tmp_path, key_text)
    for args in (("jobs", "run", "loyalty_tier", "--set", "mode=full", "--set", f"run_date={RUN_DATE}"),
                 ("queue", "work", "--queue", "notifications", "--drain")):
        result = run_cli(env, *args)
        assert result.returncode == EXIT_USAGE, result.describe()
        assert one_line(result) == ("error: database: permission denied: the role needs SELECT on ba_migrations "
                                    "(docs: production/privileges)")
        assert result.summary is not None and result.summary["status"] == "FAILURE"
    assert scalar(roles.engine, "SELECT count(*) FROM accounts WHERE tier IS NOT NULL") == 0
    assert scalar(roles.engine, "SELECT count(*) FROM outbox_events") == 0
    assert scalar(roles.engine, "SELECT count(*) FROM notifications WHERE status <> 'NEW'") == 0
    assert scalar(roles.engine, "SELECT count(*) FROM ba_run_history") == 0


@pytest.mark.parametrize(("revoked", "named"), [
    ("REVOKE INSERT ON ba_run_history FROM {runner}", "INSERT on ba_run_history"),
    ("REVOKE UPDATE (tier_review_on) ON accounts FROM {runner}", "UPDATE (tier_review_on) on accounts"),
    ("REVOKE USAGE ON SEQUENCE outbox_events_id_seq FROM {runner}", "USAGE on sequence outbox_events_id_seq"),
])
def test_each_missing_grant_of_a_sweep_is_named(
    roles: Roles, defs: Path, tmp_path: Path, key_text: str, revoked: str, named: str
) -> None:
    """The page's grants less one: exit 2, one line naming exactly that grant, nothing written."""
    migrated(roles, defs, tmp_path, key_text)
    run_as_superuser(roles.url, "\n".join(roles.sql(b) for b in ("every-job", "sweep")))
    run_as_superuser(roles.url, revoked.format(runner=f'"{roles.runner}"'))
    env = env_for(roles.url_of(roles.runner), defs, tmp_path, key_text)
    result = run_cli(env, "jobs", "run", "loyalty_tier", "--set", "mode=full", "--set", f"run_date={RUN_DATE}")
    assert result.returncode == EXIT_USAGE, result.describe()
    assert one_line(result) == f"error: database: permission denied: the role needs {named} " \
                               "(docs: production/privileges)"
    assert scalar(roles.engine, "SELECT count(*) FROM accounts WHERE tier IS NOT NULL") == 0
    assert scalar(roles.engine, "SELECT count(*) FROM ba_run_history") == 0


REVOKE_FUNCTION = """
CREATE FUNCTION test_revoke_run_history() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF TG_TABLE_NAME = 'ba_checkpoints'
       OR (SELECT count(*) FROM ba_run_history WHERE run_id = (SELECT max(run_id) FROM new_rows)) >= 4 THEN
        EXECUTE 'REVOKE INSERT ON ba_run_history FROM ' || quote_ident(TG_ARGV[0]);
    END IF;
    RETURN NULL;
END $$;
"""


@pytest.mark.parametrize("when", ["at the plan", "after every range recorded its own"])
def test_a_run_whose_run_history_is_revoked_mid_run_counts_what_it_committed(
    roles: Roles, defs: Path, tmp_path: Path, key_text: str, when: str
) -> None:
    """INSERT on ba_run_history revoked while the run works (after the CLI's check passed): the run ends FAILURE
    (exit 1, its record is missing) and its JSON line counts exactly the rows and events it committed: not 0 when
    no summary could be recorded, and not twice when the ranges' records are there but the run's is not."""
    migrated(roles, defs, tmp_path, key_text)
    run_as_superuser(roles.url, "\n".join(roles.sql(b) for b in ("every-job", "sweep")))
    table = "ba_checkpoints" if when == "at the plan" else "ba_run_history"
    run_as_superuser(roles.url, REVOKE_FUNCTION + f"""
        CREATE TRIGGER test_revoke AFTER INSERT ON {table} REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION test_revoke_run_history('{roles.runner}');""")
    env = env_for(roles.url_of(roles.runner), defs, tmp_path, key_text)

    result = run_cli(env, "jobs", "run", "loyalty_tier", "--set", "mode=full", "--set", f"run_date={RUN_DATE}")
    assert result.returncode == 1, result.describe()
    line = result.summary
    assert line is not None and line["status"] == "FAILURE", result.describe()
    assert "not recorded in run history" in line["error"] and "ba_run_history" in line["error"], line["error"]
    written = scalar(roles.engine, "SELECT count(*) FROM accounts WHERE tier IS NOT NULL")
    events = scalar(roles.engine, "SELECT count(*) FROM outbox_events WHERE event_type = 'tier_changed'")
    assert (written, events) == (999, 999)
    assert (line["scanned"], line["changed"], line["failed"], line["audit_events"]) == (1000, written, 1, events)
    recorded = scalar(roles.engine, "SELECT count(*) FROM ba_run_history")
    assert recorded == (0 if when == "at the plan" else 4), "the ranges' records are there, the run's is not"


def test_the_pages_grants_run_the_reference_jobs(db_url: str, tmp_path: Path, key_text: str) -> None:
    """This repository's own jobs with the page's grants for them (every job's and the reference block), on a database
    the owner migrated: the customer-status sweep, the subscription expiry, the payments queue, the outbox relay and
    retention each succeed."""
    with roles_on(db_url) as found:
        (tmp_path / "no_defs").mkdir()
        env = env_for(db_url, tmp_path / "no_defs", tmp_path, key_text)
        for seed in (("seed", "customers", "--rows", "300", "--run-date", RUN_DATE),
                     ("seed", "subscriptions", "--rows", "50", "--run-date", RUN_DATE),
                     ("seed", "payments", "--rows", "30")):
            seeded = run_cli(env, *seed)
            assert seeded.returncode == EXIT_OK, seeded.describe()
        run_as_superuser(db_url, "\n".join(found.sql(b) for b in ("every-job", "reference")))
        runner = {**env, "BATCH_ASSETS_DATABASE_URL": found.url_of(found.runner),
                  "BATCH_ASSETS_OUTBOX_SINK": f"file:{tmp_path / 'sink.jsonl'}"}
        for job in (("sweep", "customer-status", "--mode", "full", "--run-date", RUN_DATE),
                    ("sweep", "customer-status", "--mode", "delta", "--run-date", RUN_DATE),
                    ("subscriptions", "expire", "--run-date", RUN_DATE),
                    ("queue", "work", "--drain"),
                    ("outbox", "relay"),
                    ("retention", "run")):
            result = run_cli(runner, *job)
            assert result.returncode == EXIT_OK, result.describe()
            assert result.summary is not None and result.summary["status"] == "SUCCESS", result.describe()
        assert scalar(found.engine, "SELECT count(*) FROM customers WHERE age_category IS NULL") \
            <= scalar(found.engine, "SELECT count(*) FROM customers WHERE review_failure IS NOT NULL")
        assert scalar(found.engine, "SELECT count(*) FROM subscriptions WHERE status = 'EXPIRED'") > 0
        # The simulated handler fails some attempts on purpose: those wait for their backoff, nothing stays claimed.
        assert scalar(found.engine, "SELECT count(*) FROM payments WHERE status = 'DONE'") > 0
        assert scalar(found.engine, "SELECT count(*) FROM payments WHERE status = 'PROCESSING'") == 0
        assert scalar(found.engine, "SELECT count(*) FROM outbox_events WHERE status = 'PENDING'") == 0


@pytest.mark.parametrize(("job", "revoked", "named"), [
    (("sweep", "customer-status", "--mode", "full", "--run-date", RUN_DATE),
     "REVOKE SELECT ON review_triggers FROM {runner}", "SELECT (customer_id) on review_triggers"),
    (("subscriptions", "expire", "--run-date", RUN_DATE),
     "REVOKE DELETE ON enrollments FROM {runner}", "DELETE on enrollments"),
])
def test_a_reference_job_missing_a_grant_on_its_own_tables_is_refused(
    db_url: str, tmp_path: Path, key_text: str, job: tuple[str, ...], revoked: str, named: str
) -> None:
    """The reference block less one grant on the reference project's own tables: exit 2 naming it, not a run whose
    every row fails to write."""
    with roles_on(db_url) as found:
        (tmp_path / "no_defs").mkdir()
        env = env_for(db_url, tmp_path / "no_defs", tmp_path, key_text)
        for seed in (("seed", "customers", "--rows", "100", "--run-date", RUN_DATE),
                     ("seed", "subscriptions", "--rows", "20", "--run-date", RUN_DATE)):
            assert run_cli(env, *seed).returncode == EXIT_OK
        run_as_superuser(db_url, "\n".join(found.sql(b) for b in ("every-job", "reference")))
        run_as_superuser(db_url, revoked.format(runner=f'"{found.runner}"'))
        result = run_cli({**env, "BATCH_ASSETS_DATABASE_URL": found.url_of(found.runner)}, *job)
        assert result.returncode == EXIT_USAGE, result.describe()
        assert one_line(result) == f"error: database: permission denied: the role needs {named} " \
                                   "(docs: production/privileges)"
        assert scalar(found.engine, "SELECT count(*) FROM ba_run_history") == 0
