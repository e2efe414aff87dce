"""batch_assets in a team's own Dagster project: the CLI acts on the project it is run in, migrates only the library's
own objects, runs the declarations as the team's own jobs, and the declarations bring what their jobs need."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from team_project import MAIL, QUEUE, RISK, SWEEP, TeamProject, table_state, team_database, team_project

from batch_assets.db.engine import create_engine
from batch_assets.settings import environ_without_product

pytestmark = [pytest.mark.integration, pytest.mark.dagster]

THE_TEAMS_TABLES = ("customers", "payments", "outbox_events")


@pytest.fixture
def team_db(empty_db_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(empty_db_url, pool_size=2)
    team_database(engine)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def project(tmp_path: Path) -> TeamProject:
    project = team_project(tmp_path)
    project.declare("order_risk", SWEEP, risk=RISK)
    project.declare("emails", QUEUE, mail=MAIL)
    return project


def cli(project: TeamProject, env: dict[str, str], *args: str) -> tuple[int, dict, str]:
    """`batch-assets ARGS` run in the project's directory: exit code, the JSON last line, stderr."""
    done = subprocess.run([sys.executable, "-m", "batch_assets.cli", *args], cwd=project.root, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    return done.returncode, (json.loads(lines[-1]) if lines else {}), done.stderr


def team_env(url: str | None, home: Path) -> dict[str, str]:
    env = {**environ_without_product(), "DAGSTER_HOME": str(home)}
    if url is not None:
        env["APP_DATABASE_URL"] = url
    return env


def test_the_cli_migrates_the_library_alone_and_runs_the_declarations_as_the_teams_jobs(
    project: TeamProject, team_db: sa.Engine, empty_db_url: str, tmp_path: Path
) -> None:
    """In the project's directory: `db migrate` adds only ba_* objects and the queue's install, and leaves the team's
    customers, payments and outbox_events (other columns, rows) as they were; `jobs list` shows the declarations;
    `jobs run` and `queue work` run them as runs of the team's code location on the team's DAGSTER_HOME, whose
    dagster.yaml no command rewrites; the sweep's events go to the library's ba_outbox_events."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    instance_file = home / "dagster.yaml"
    instance_file.write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    before = {table: table_state(team_db, table) for table in THE_TEAMS_TABLES}
    env = team_env(empty_db_url, home)

    code, migrated, err = cli(project, env, "db", "migrate")
    assert code == 0, err
    assert migrated["applied"] == ["batch_assets/0001_library"] and migrated["queues"] == ["emails"]
    with team_db.connect() as conn:
        tables = set(conn.exec_driver_sql(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").scalars())
    assert {t for t in tables if not t.startswith("ba_")} == {*THE_TEAMS_TABLES, "orders", "outgoing_emails"}
    assert {table: table_state(team_db, table) for table in THE_TEAMS_TABLES} == before

    code, listed, err = cli(project, env, "jobs", "list")
    assert code == 0, err
    assert {job["name"] for job in listed["jobs"]} == {"order_risk", "emails_queue_job"}

    code, swept, err = cli(project, env, "jobs", "run", "order_risk", "--set", "mode=full")
    assert code == 0, err
    assert (swept["status"], swept["scanned"], swept["changed"], swept["audit_events"]) == ("SUCCESS", 300, 300, 300)
    code, drained, err = cli(project, env, "queue", "work", "--queue", "emails", "--drain")
    assert code == 0, err
    assert (drained["status"], drained["changed"]) == ("SUCCESS", 40)
    with team_db.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM orders WHERE risk IS NOT NULL").scalar_one() == 300
        assert conn.exec_driver_sql("SELECT count(*) FROM ba_outbox_events").scalar_one() == 300
    # The relay sends this repository's outbox_events only: refused here in one line, before a sink (a file of the
    # team's folder) is made, and the events stay PENDING for the team's consumer.
    code, relayed, err = cli(project, env, "outbox", "relay")
    assert code == 2 and relayed["status"] == "FAILURE", err
    [line] = [text for text in err.splitlines() if text.startswith("error:")]
    assert "no outbox relay" in line and "ba_outbox_events" in line and "Traceback" not in err
    with team_db.connect() as conn:
        assert conn.exec_driver_sql(
            "SELECT count(*) FROM ba_outbox_events WHERE status = 'PENDING'").scalar_one() == 300
    assert {table: table_state(team_db, table) for table in THE_TEAMS_TABLES} == before
    assert instance_file.read_text(encoding="utf-8") == "telemetry:\n  enabled: false\n"
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = {run.run_id: run for run in instance.get_runs()}
    for run_id in (swept["run_id"], drained["run_id"]):
        origin = runs[run_id].remote_job_origin
        assert origin is not None and origin.location_name == "team", run_id
    assert not (project.root / ".batch_assets").exists()


def test_a_job_run_before_migrating_says_to_run_db_migrate(project: TeamProject, team_db: sa.Engine,
                                                           empty_db_url: str, tmp_path: Path) -> None:
    """Before `db migrate`: exit 2 with one line telling the user to run it, not a driver trace; nothing written."""
    code, summary, err = cli(project, team_env(empty_db_url, tmp_path / "home"), "jobs", "run", "order_risk")
    assert code == 2
    [line] = [text for text in err.splitlines() if text.startswith("error:")]
    assert "batch-assets db migrate" in line and "Traceback" not in err
    assert summary["status"] == "FAILURE"
    with team_db.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM orders WHERE risk IS NOT NULL").scalar_one() == 0


def test_without_any_database_url_the_error_names_database_url_and_no_server_starts(
    project: TeamProject, team_db: sa.Engine, tmp_path: Path
) -> None:
    """Neither the declaration's variable nor BATCH_ASSETS_DATABASE_URL: exit 2 naming database_url, and no
    embedded server nor .batch_assets folder in the team's project."""
    code, _, err = cli(project, team_env(None, tmp_path / "home"), "jobs", "list")
    assert code == 2
    [line] = [text for text in err.splitlines() if text.startswith("error:")]
    assert "database_url" in line
    assert not (project.root / ".batch_assets").exists() and not (tmp_path / ".batch_assets").exists()


def _team_definitions(project: TeamProject, monkeypatch: pytest.MonkeyPatch) -> dg.Definitions:
    """The project's definitions as Dagster loads them (`dg dev`, `dg check defs`)."""
    monkeypatch.syspath_prepend(str(project.root / "src"))
    return dg.load_from_defs_folder(path_within_project=project.root)


SECOND_SWEEP = SWEEP.replace("name: order_risk", "name: order_risk_again").replace(
    'schedules: {delta: "0 2 * * *", timezone: Europe/Berlin}',
    'schedules: {full: "0 3 * * 0", status: RUNNING}\n  asset_key: analytics/order_risk_again')


def test_declarations_bring_their_resources_keys_and_stopped_schedules(
    project: TeamProject, team_db: sa.Engine, empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each declaration brings its own resources under keys of its own; its database URL reaches the resource as the
    variable's name only (never the value: no password in what the UI shows); schedules start STOPPED unless the
    declaration says RUNNING; asset keys can be set, and two sweeps over one table share one source asset."""
    password_url = empty_db_url.replace("postgres@", "postgres:pw-never-shown@")
    monkeypatch.setenv("APP_DATABASE_URL", password_url)
    project.declare("order_risk_again", SECOND_SWEEP, risk=RISK)
    defs = _team_definitions(project, monkeypatch)
    repository = defs.get_repository_def()
    assert {"order_risk__database", "order_risk__job_lock", "emails__database",
            "order_risk_again__database"} <= set(defs.resources or {})
    database = (defs.resources or {})["order_risk__database"]
    assert "pw-never-shown" not in repr(database) and "pw-never-shown" not in json.dumps(
        database.model_dump(mode="json"), default=str)
    schedules = {s.name: s.default_status for s in repository.schedule_defs}
    assert schedules == {"order_risk_delta_schedule": dg.DefaultScheduleStatus.STOPPED,
                         "order_risk_again_full_schedule": dg.DefaultScheduleStatus.RUNNING}
    keys = {key.to_user_string() for key in repository.asset_graph.get_all_asset_keys()}
    assert {"order_risk", "analytics/order_risk_again", "public/orders"} <= keys
    assert sum(1 for key in keys if key.endswith("orders")) == 1


def test_a_function_beside_its_defs_yaml_wins_over_one_of_the_same_name_elsewhere(
    project: TeamProject, team_db: sa.Engine, empty_db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`compute: risk:compute` is the risk.py beside the defs.yaml, even when another `risk` module is on the path."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "risk.py").write_text("def compute(row, run_date):\n    raise RuntimeError('the wrong risk')\n")
    monkeypatch.syspath_prepend(str(elsewhere))
    monkeypatch.setenv("APP_DATABASE_URL", empty_db_url)
    defs = _team_definitions(project, monkeypatch)
    assert defs.resolve_job_def("order_risk") is not None
    from dagster.components.core.component_tree import ComponentTree

    from batch_assets.orchestration.components.sweep_component import SweepComponent

    [component] = ComponentTree.for_project(project.root).get_all_components(of_type=SweepComponent)
    function = component.located(project.defs / "order_risk").function()
    assert function({"amount": 5000}, __import__("datetime").date(2026, 1, 1))["risk"] == "high"
