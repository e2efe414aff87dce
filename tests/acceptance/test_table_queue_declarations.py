"""Acceptance: what a declared queue may be (declared queues (docs/reference/declarations.md), version 4), through
`batch-assets` as real processes.

A queue's key must be unique and NOT NULL, or `db migrate` refuses the declaration (exit 2 naming `key`) with
nothing installed on the table; a queue may not take a name of the code location's own (`payments`), and two
declarations of one name refuse the second file, from `jobs list`, `db migrate` and `queue work` alike.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa
from _cli import EXIT_USAGE, REPO, CliResult, execute, rows, run_cli, scalar

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "notifications"
QUEUE_COLUMNS = ("status text NOT NULL DEFAULT 'NEW', attempts int NOT NULL DEFAULT 0, "
                 "next_attempt_at timestamptz NOT NULL DEFAULT now(), claimed_until timestamptz NULL, "
                 "last_error text NULL, processed_at timestamptz NULL")
HANDLER = """from batch_assets import PermanentFailure


def handle(*, id, body, attempts):
    if body == "two":
        raise PermanentFailure("two is refused")
"""


def declare(folder: Path, *, name: str, table: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "jobs_handler.py").write_text(HANDLER)
    path = folder / "defs.yaml"
    path.write_text(f"type: batch_assets.TableQueueComponent\nattributes:\n  name: {name}\n  table: {table}\n"
                    "  key: id\n  columns: [id, body]\n  handler: jobs_handler:handle\n")
    return path


def one_line(result: CliResult) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == EXIT_USAGE and len(lines) == 1, result.describe()
    return lines[0]


def nothing_installed(engine: sa.Engine, table: str) -> bool:
    triggers = scalar(engine, "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(:t) AND NOT tgisinternal",
                      t=table)
    token = scalar(engine, "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(:t) "
                           "AND attname IN ('ba_claim_token', 'claim_token')", t=table)
    return triggers == 0 and token == 0


@pytest.mark.parametrize(("key", "second", "problem"), [("id integer", "1", "unique"),
                                                      ("id integer UNIQUE", "NULL", "NOT NULL")])
def test_migrate_refuses_a_key_that_is_not_unique_and_not_null(
    cli_env: dict[str, str], engine: sa.Engine, tmp_path: Path, key: str, second: str, problem: str
) -> None:
    """Rows (1,'one'), (1,'two'), (2,'three') with no unique key; a unique key that may be NULL: `db migrate` exits 2
    naming the file and `key`, installs nothing, and `queue work` refuses the queue the same way."""
    execute(engine, f"CREATE TABLE jobs ({key}, body text NOT NULL, {QUEUE_COLUMNS})")
    execute(engine, f"INSERT INTO jobs (id, body) VALUES (1, 'one'), ({second}, 'two'), (2, 'three')")  # noqa: S608
    path = declare(tmp_path / "defs" / "jobs", name="jobs", table="jobs")
    env = {**cli_env, "BATCH_ASSETS_DEFS_DIR": str(path.parent.parent)}
    for command in (("db", "migrate"), ("queue", "work", "--queue", "jobs", "--drain")):
        line = one_line(run_cli(env, *command))
        assert str(path) in line and ": key:" in line and problem in line, line
    assert nothing_installed(engine, "jobs")
    assert {r[0] for r in rows(engine, "SELECT DISTINCT status FROM jobs")} == {"NEW"}, "nothing claimed"


def test_a_queue_named_payments_is_refused_not_dropped(cli_env: dict[str, str], engine: sa.Engine,
                                                       tmp_path: Path) -> None:
    """A declared queue may not take the name of the location's own queue: exit 2 naming `name` from every command
    that would act on it, and from `queue work` on the default (payments) queue too."""
    with engine.begin() as conn:
        conn.exec_driver_sql((EXAMPLE / "schema.sql").read_text())
    path = declare(tmp_path / "defs" / "mine", name="payments", table="notifications")
    shutil.copy(EXAMPLE / "notify.py", path.parent / "notify.py")
    env = {**cli_env, "BATCH_ASSETS_DEFS_DIR": str(path.parent.parent)}
    for command in (("jobs", "list"), ("db", "migrate"), ("queue", "work", "--queue", "payments", "--drain"),
                    ("queue", "work", "--drain"), ("queue", "stats", "--queue", "payments")):
        line = one_line(run_cli(env, *command))
        assert str(path) in line and ": name:" in line and "'payments'" in line, (command, line)
    assert nothing_installed(engine, "notifications")


def test_two_queues_of_one_name_refuse_the_second_file(cli_env: dict[str, str], engine: sa.Engine,
                                                       tmp_path: Path) -> None:
    """Two declarations of queue `jobs` on two tables: `jobs list`, `db migrate` and `queue work --queue jobs` each
    exit 2 naming the second file; the worker never starts on either table."""
    for table in ("jobs_a", "jobs_b"):
        execute(engine, f"CREATE TABLE {table} (id integer PRIMARY KEY, body text NOT NULL, {QUEUE_COLUMNS})")
        execute(engine, f"INSERT INTO {table} (id, body) VALUES (1, 'one'), (2, 'three')")  # noqa: S608
    first = declare(tmp_path / "defs" / "a", name="jobs", table="jobs_a")
    second = declare(tmp_path / "defs" / "b", name="jobs", table="jobs_b")
    env = {**cli_env, "BATCH_ASSETS_DEFS_DIR": str(first.parent.parent)}
    for command in (("jobs", "list"), ("db", "migrate"), ("queue", "work", "--queue", "jobs", "--drain")):
        line = one_line(run_cli(env, *command))
        assert str(second) in line and ": name:" in line and str(first) in line, (command, line)
    assert nothing_installed(engine, "jobs_a") and nothing_installed(engine, "jobs_b")
    for table in ("jobs_a", "jobs_b"):
        assert {r[0] for r in rows(engine, f"SELECT DISTINCT status FROM {table}")} == {"NEW"}  # noqa: S608
