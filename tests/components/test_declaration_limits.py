"""What a declared sweep may be (declared sweeps (docs/reference/declarations.md), version 4), driven as an outside
test drives it: `jobs list` and
`jobs run` with a team's defs.yaml under BATCH_ASSETS_DEFS_DIR, their exit codes, stderr lines and JSON lines, and
the rows, run history and checkpoints they leave. The README example's table and defs.yaml, edited per test."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
from _cli import EXIT_OK, EXIT_USAGE, CliResult, run_cli  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "loyalty"
RUN_DATE = "2026-12-01"
FULL = ("jobs", "run", "loyalty_tier", "--set", "mode=full", "--set", f"run_date={RUN_DATE}")


def edit(defs_dir: Path, old: str, new: str) -> Path:
    path = defs_dir / "loyalty" / "defs.yaml"
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))
    return path


def one_line(result: CliResult) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.describe()
    return lines[0]


def refused(result: CliResult, path: Path, attribute: str) -> str:
    """Exit 2 with one stderr line naming the file and the attribute."""
    assert result.returncode == EXIT_USAGE, result.describe()
    line = one_line(result)
    assert str(path) in line and f": {attribute}:" in line, line
    return line


def counts(engine: sa.Engine) -> tuple[int, int, int]:
    """(accounts with a tier, run history rows, outbox events): what a refused command must leave as it was."""
    with engine.connect() as conn:
        return (conn.execute(sa.text("SELECT count(*) FROM accounts WHERE tier IS NOT NULL")).scalar_one(),
                conn.execute(sa.text("SELECT count(*) FROM ba_run_history")).scalar_one(),
                conn.execute(sa.text("SELECT count(*) FROM outbox_events")).scalar_one())


# --- where ---------------------------------------------------------------------------------------------------------


def test_where_is_sql_as_written_never_a_template(env: dict[str, str], defs_dir: Path, accounts: sa.Engine) -> None:
    """Parentheses, IN (...), a subquery, a comment and `{{` inside a string literal: one condition, run as written.
    A variable named in `{{ env.NAME }}` is never substituted into it: with TEAM_STATUS=CLOSED the CLOSED rows would
    be read (1,010 rows) if it were."""
    where = ("(status = 'OPEN' OR status = '{{ env.TEAM_STATUS }}') AND status IN ('OPEN', 'CLOSED') "
             "AND id NOT IN (SELECT a.id FROM accounts AS a WHERE a.status = 'GONE') -- not a ) nor a ;")
    edit(defs_dir, "where: \"status = 'OPEN'\"", f"where: {json.dumps(where)}")
    result = run_cli({**env, "TEAM_STATUS": "CLOSED"}, *FULL)
    assert result.returncode == EXIT_OK, result.describe()
    summary = result.summary
    assert summary is not None and (summary["scanned"], summary["changed"]) == (1000, 999), summary
    with accounts.connect() as conn:
        closed = conn.execute(sa.text("SELECT count(*) FROM accounts WHERE status = 'CLOSED' AND tier IS NOT NULL"))
        assert closed.scalar_one() == 0


def test_a_template_never_shows_the_value_it_rendered(env: dict[str, str], defs_dir: Path) -> None:
    """`name: "{{ env.BATCH_ASSETS_ENCRYPTION_KEY }}"` is refused naming `name`, without the key."""
    path = edit(defs_dir, "name: loyalty_tier", 'name: "{{ env.BATCH_ASSETS_ENCRYPTION_KEY }}"')
    result = run_cli(env, "jobs", "list")
    refused(result, path, "name")
    secret = env["BATCH_ASSETS_ENCRYPTION_KEY"]
    assert secret not in result.stderr and secret not in result.stdout, result.describe()


# --- the key -------------------------------------------------------------------------------------------------------


def test_a_nullable_unique_key_is_refused(env: dict[str, str], defs_dir: Path, accounts: sa.Engine) -> None:
    """A unique index on a nullable column: a NULL-key row can never be named, so the key is refused."""
    with accounts.begin() as conn:
        conn.execute(sa.text("ALTER TABLE accounts ADD COLUMN number integer UNIQUE"))
        conn.execute(sa.text("UPDATE accounts SET number = n FROM (SELECT id, row_number() OVER (ORDER BY id) AS n "
                             "FROM accounts) AS x WHERE x.id = accounts.id AND x.n > 1"))
    path = edit(defs_dir, "key: id", "key: number")
    edit(defs_dir, "columns: [id, points", "columns: [number, points")
    before = counts(accounts)
    for args in (("jobs", "list"), FULL):
        line = refused(run_cli(env, *args), path, "key")
        assert "NOT NULL" in line, line
    assert counts(accounts) == before


# --- names ---------------------------------------------------------------------------------------------------------


def test_the_locations_own_names_are_reserved() -> None:
    """Every name the reference location's jobs lock, checkpoint, materialize or queue under is reserved (the list
    is derived from its job names: this checks the derivation against the names its modules really use)."""
    from batch_assets.orchestration.outbox_job import OUTBOX_RELAY_JOB_KEY
    from batch_assets.reference.customer_status.names import NAMES
    from batch_assets.reference.payments.declaration import PAYMENTS_QUEUE
    from batch_assets.reference.project import PROJECT
    from batch_assets.reference.subscriptions.expiry import JOB_LOCK_NAME
    from batch_assets.reference.subscriptions.sweep import SWEEP_NAME

    reserved = PROJECT.reserved_names()
    used = {NAMES.lock, NAMES.checkpoint, NAMES.asset, JOB_LOCK_NAME, SWEEP_NAME, OUTBOX_RELAY_JOB_KEY,
            PAYMENTS_QUEUE.name, "retention"}
    used.update(name for spec in PROJECT.own_specs() for name in spec.job_names)
    assert used <= reserved, sorted(used - reserved)


@pytest.mark.parametrize("name", ["customer_status", "subscription_expiry", "outbox_relay", "payments"])
def test_a_name_of_the_locations_own_is_refused(env: dict[str, str], defs_dir: Path, name: str) -> None:
    path = edit(defs_dir, "name: loyalty_tier", f"name: {name}")
    line = refused(run_cli(env, "jobs", "list"), path, "name")
    assert repr(name) in line, line


def test_two_declarations_of_one_name_refuse_the_second(env: dict[str, str], defs_dir: Path) -> None:
    """A sweep and a queue share one namespace (a name is a lock, a checkpoint and a queue): the second file, in
    path order, is named."""
    queue = defs_dir / "z_queue"
    queue.mkdir()
    (queue / "defs.yaml").write_text(
        "type: batch_assets.TableQueueComponent\nattributes:\n  name: loyalty_tier\n  table: accounts\n  key: id\n"
        "  columns: [id, points]\n  handler: tiers:compute\n")
    for args in (("jobs", "list"), FULL):
        line = refused(run_cli(env, *args), queue / "defs.yaml", "name")
        assert str(defs_dir / "loyalty" / "defs.yaml") in line, line


# --- failure kinds -------------------------------------------------------------------------------------------------


def test_a_failure_kind_made_of_values_is_counted_under_invalid_failure_kind(
    env: dict[str, str], defs_dir: Path, accounts: sa.Engine
) -> None:
    """`RowFailure(f"p{points}")` over 999 rows: one key, and no value anywhere the run leaves text."""
    (defs_dir / "loyalty" / "leaky.py").write_text(
        "from batch_assets import RowFailure\n\n\n"
        "def compute(row, run_date):\n"
        "    if row['points'] is None:\n"
        "        raise RowFailure('missing_points')\n"
        "    raise RowFailure(f\"p{row['points']}\")\n")
    edit(defs_dir, "compute: tiers:compute", "compute: leaky:compute")
    result = run_cli(env, *FULL)
    assert result.returncode == EXIT_OK, result.describe()
    summary = result.summary
    assert summary is not None
    assert {k: v for k, v in summary["failed_by_type"].items() if v} == {"invalid_failure_kind": 999,
                                                                        "missing_points": 1}, summary
    texts = run_texts(result, accounts)
    value = re.compile(r"(?<![A-Za-z0-9_])p\d+(?![A-Za-z0-9_])")
    for where, text in texts.items():
        assert not value.search(text), (where, value.search(text))
    assert "invalid_failure_kind" in texts["ba_run_history"]


def run_texts(result: CliResult, accounts: sa.Engine) -> dict[str, str]:
    """What a run leaves as text outside the Dagster instance: its output, run history and checkpoints."""
    with accounts.connect() as conn:
        history = conn.execute(sa.text("SELECT string_agg(h::text, ' ') FROM ba_run_history AS h")).scalar_one()
        checkpoints = conn.execute(sa.text("SELECT string_agg(c::text, ' ') FROM ba_checkpoints AS c")).scalar_one()
    return {"stdout": result.stdout, "stderr": result.stderr, "ba_run_history": history or "",
            "ba_checkpoints": checkpoints or ""}


def test_a_compute_that_exits_is_a_compute_error_and_shows_no_value(
    env: dict[str, str], defs_dir: Path, accounts: sa.Engine
) -> None:
    """`raise SystemExit(f"v={points}")` on 100 of the 1,000 rows: counted `compute_error` like any other defect of
    the function (10 %: under the breaker's ratio, so the run ends SUCCESS with the 899 others written), never ends
    the range's step, and no value is anywhere the run leaves text: stdout, stderr, run history, checkpoints and
    the Dagster instance (event log and compute logs)."""
    (defs_dir / "loyalty" / "exits.py").write_text(
        "import tiers\n\n\n"
        "def compute(row, run_date):\n"
        "    if row['points'] is not None and row['points'] % 10 == 0:\n"
        "        raise SystemExit(f\"v={row['points']}\")\n"
        "    return tiers.compute(row, run_date)\n")
    edit(defs_dir, "compute: tiers:compute", "compute: exits:compute")
    result = run_cli(env, *FULL)
    assert result.returncode == EXIT_OK, result.describe()
    summary = result.summary
    assert summary is not None
    assert {k: v for k, v in summary["failed_by_type"].items() if v} == {"compute_error": 100,
                                                                        "missing_points": 1}, summary
    assert summary["changed"] == 899, summary
    for where, text in run_texts(result, accounts).items():
        assert not re.search(r"v=[0-9]", text), where
    instance = Path(env["BATCH_ASSETS_HOME"])
    files = [path for path in instance.rglob("*") if path.is_file()]
    assert any(path.suffix == ".db" for path in files), "the run's event log is under BATCH_ASSETS_HOME"
    for path in files:
        assert not re.search(rb"v=[0-9]", path.read_bytes()), path


# --- the command line ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("assignment", ['mode={"a":1}', "mode=[1]", 'workers={"a":1}', "workers=[1]",
                                        "run_date=[1]", "workers=null", "mode=null"])
def test_a_value_of_the_wrong_json_type_is_exit_2_naming_the_field(
    env: dict[str, str], accounts: sa.Engine, assignment: str
) -> None:
    before = counts(accounts)
    result = run_cli(env, "jobs", "run", "loyalty_tier", "--set", assignment)
    assert result.returncode == EXIT_USAGE, result.describe()
    field = assignment.split("=")[0]
    assert one_line(result).startswith(f"error: {field}: "), result.describe()
    assert counts(accounts) == before


def test_the_page_size_bound_jobs_list_shows_is_the_one_jobs_run_enforces(
    env: dict[str, str], accounts: sa.Engine
) -> None:
    listed = run_cli(env, "jobs", "list")
    assert listed.returncode == EXIT_OK, listed.describe()
    [job] = [job for job in (listed.summary or {})["jobs"] if job["name"] == "loyalty_tier"]
    [page_size] = [f for f in job["fields"] if f["name"] == "page_size"]
    highest = page_size["le"]
    before = counts(accounts)
    over = run_cli(env, *FULL, "--set", f"page_size={highest + 1}")
    assert over.returncode == EXIT_USAGE and one_line(over).startswith("error: page_size: "), over.describe()
    assert counts(accounts) == before, "refused before a run starts"
    at = run_cli(env, *FULL, "--set", f"page_size={highest}")
    assert at.returncode == EXIT_OK, at.describe()
    assert (at.summary or {}).get("changed") == 999


def test_a_defs_yaml_past_the_size_limit_is_refused_unread(env: dict[str, str], defs_dir: Path) -> None:
    """A valid declaration padded past 1 MiB with a comment: exit 2 naming the file, from both commands."""
    path = defs_dir / "loyalty" / "defs.yaml"
    path.write_text(path.read_text() + ("# " + "x" * 1022 + "\n") * 1100)
    for args in (("jobs", "list"), FULL):
        line = refused(run_cli(env, *args), path, "size")
        assert "at most" in line, line


def test_compute_results_are_never_cast_into_their_column(env: dict[str, str], defs_dir: Path,
                                                          accounts: sa.Engine) -> None:
    """An int for the text column `tier`: counted `invalid_result` (systemic: the breaker stops the run), nothing
    written, no value shown."""
    (defs_dir / "loyalty" / "text_as_int.py").write_text(
        "def compute(row, run_date):\n"
        "    return {'tier': 7, 'tier_review_on': run_date}\n")
    edit(defs_dir, "compute: tiers:compute", "compute: text_as_int:compute")
    result = run_cli(env, *FULL, "--set", "breaker_min_rows=100000")
    summary = result.summary
    assert summary is not None and summary["failed_by_type"].get("invalid_result") == 1000, result.describe()
    assert summary["changed"] == 0
    assert counts(accounts)[0] == 0, "nothing written: no tier stored as '7'"


# --- in a team's own Dagster project -------------------------------------------------------------------------------

TEAM_PYPROJECT = """[project]
name = "team"
version = "0.1"

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "team"
"""
TEAM_DEFINITIONS = """from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
"""


@pytest.fixture
def team(tmp_path: Path) -> Path:
    """A team's dg project whose defs folder holds the README example (as `loyalty`)."""
    root = tmp_path / "team_project"
    (root / "team" / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(TEAM_PYPROJECT)
    (root / "team" / "__init__.py").write_text("")
    (root / "team" / "defs" / "__init__.py").write_text("")
    (root / "team" / "definitions.py").write_text(TEAM_DEFINITIONS)
    shutil.copytree(EXAMPLE, root / "team" / "defs" / "loyalty")
    return root


def run_in(root: Path, env: dict[str, str], *args: str) -> CliResult:
    import subprocess

    from _cli import cli_command

    proc = subprocess.run(cli_command(*args), env=env, cwd=root, capture_output=True, text=True, timeout=120)
    return CliResult(args, proc.returncode, proc.stdout, proc.stderr)


def test_a_teams_project_refuses_the_same_declarations(cli_env: dict[str, str], accounts: sa.Engine,
                                                       team: Path) -> None:
    """The CLI in a team's dg project reads its declarations as Dagster loads them: a hostile `where`, a second
    declaration of one name and a defs.yaml past the size limit are each exit 2 naming the file and the attribute,
    as under BATCH_ASSETS_DEFS_DIR."""
    defs = team / "team" / "defs"
    assert run_in(team, cli_env, "jobs", "list").returncode == EXIT_OK
    loyalty = defs / "loyalty" / "defs.yaml"
    original = loyalty.read_text()
    loyalty.write_text(original.replace("where: \"status = 'OPEN'\"", "where: \"status = 'CLOSED') OR (true\""))
    refused(run_in(team, cli_env, "jobs", "list"), loyalty, "where")
    loyalty.write_text(original)
    shutil.copytree(defs / "loyalty", defs / "other")
    refused(run_in(team, cli_env, "jobs", "list"), defs / "other" / "defs.yaml", "name")
    shutil.rmtree(defs / "other")
    loyalty.write_text(original + ("# " + "x" * 1022 + "\n") * 1100)
    refused(run_in(team, cli_env, "jobs", "list"), loyalty, "size")
