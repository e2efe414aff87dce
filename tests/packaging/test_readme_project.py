"""The README's "Add batch_assets to your Dagster project", followed as a team would: the wheel built from this
checkout, installed (not editable, no extra) on Python 3.12 beside another Dagster 1.13 patch and pandas 2, in a
project made by `create-dagster project my-project`, against a database that already holds tables of its own named
`customers`, `payments` and `outbox_events`.

The section's blocks are read from README.md and run in order: each line of a `sh` block as a command in the
project's directory, each file block (its first line is `# path`) written to that path. What the test changes, and
only that: `pip install batch-assets` installs the built wheel (the package is not on an index here), the database
URL the section exports is the test's database, and `dg dev` gets a free port; it is stopped by its process group
once the UI answered. Skipped, saying why, without Python 3.12 or a package index.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
from helpers import wait_for
from team_project import TEAM_TABLES, table_state
from test_wheel import DAGSTER, TEAM_PINS, _build_wheel, _pip_install, _python312, _require_index, _run

from batch_assets.db.engine import create_engine
from batch_assets.settings import environ_without_product

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- dagster-project:commands -->", "<!-- dagster-project:end -->"
BLOCK_RE = re.compile(r"```(\w+)\n(.*?)```", re.S)
THE_TEAMS_TABLES = ("customers", "payments", "outbox_events")
RUNS_QUERY = ('{ runsOrError(filter: {pipelineName: "order_risk"}) { ... on Runs { results { runId status '
              'repositoryOrigin { repositoryLocationName } } } } }')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def section_blocks() -> list[tuple[str, str]]:
    """The section's fenced blocks, in order: (language, text)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    return [(language, body) for language, body in BLOCK_RE.findall(section)]


def test_the_section_has_commands_and_files() -> None:
    """What the README path test runs is there: the install, scaffold, migrate, check, launch, CLI and UI commands,
    and the declaration with its function."""
    blocks = section_blocks()
    commands = [line for language, body in blocks if language == "sh" for line in body.splitlines() if line]
    files = [body.splitlines()[0] for language, body in blocks if language != "sh"]
    assert commands[0] == "pip install batch-assets" and "dg dev" in commands
    for needed in ("dg scaffold defs batch_assets.SweepComponent", "batch-assets db migrate", "dg check defs",
                   "dg launch --job order_risk", "batch-assets jobs run order_risk"):
        assert any(command.startswith(needed) for command in commands), needed
    assert files == ["# src/my_project/defs/order_risk/defs.yaml", "# src/my_project/defs/order_risk/risk.py"]


def test_the_readmes_dagster_project_path_runs_as_written(tmp_path: Path, empty_db_url: str) -> None:
    """Every command of the section exits 0 as written; the team's tables keep their columns and rows; the sweep's
    runs (dg launch, the CLI) are SUCCESS runs of the team's code location on the team's DAGSTER_HOME, whose
    dagster.yaml is never rewritten, and the UI serves the job with them."""
    python = _python312()
    _require_index(tmp_path)
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    _run([python, "-m", "venv", venv], cwd=tmp_path)
    # The team's environment: its Dagster pins and the tools a Dagster project has (create-dagster, the webserver).
    _pip_install(venv, *TEAM_PINS, f"create-dagster=={DAGSTER}", f"dagster-webserver=={DAGSTER}")
    engine = create_engine(empty_db_url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(TEAM_TABLES)
        before = {table: table_state(engine, table) for table in THE_TEAMS_TABLES}
        home = tmp_path / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
        env = environ_without_product()
        env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", COLUMNS="200",
                   DAGSTER_HOME=str(home))
        _run([venv / "bin" / "create-dagster", "project", "my-project", "--no-uv-sync"], cwd=tmp_path, env=env)
        project = tmp_path / "my-project"
        _pip_install(venv, "-e", project)  # what create-dagster's own `uv sync` makes: the project installed

        outputs = follow_section(project, env, wheel, empty_db_url)

        migrated = json.loads(outputs["batch-assets db migrate"].splitlines()[-1])
        assert migrated["status"] == "SUCCESS" and migrated["applied"] == ["batch_assets/0001_library"]
        assert "batch_assets.SweepComponent" in outputs["dg list components"]
        summary = json.loads(outputs["batch-assets jobs run order_risk --set mode=delta"].splitlines()[-1])
        assert summary["status"] == "SUCCESS" and summary["mode"] == "delta"
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM orders WHERE risk IS NULL").scalar_one() == 0
        assert {table: table_state(engine, table) for table in THE_TEAMS_TABLES} == before
        assert (home / "dagster.yaml").read_text(encoding="utf-8") == "telemetry:\n  enabled: false\n"
        assert not (project / ".batch_assets").exists()
    finally:
        engine.dispose()


def follow_section(project: Path, env: dict[str, str], wheel: Path, database_url: str) -> dict[str, str]:
    """Run the section's blocks in `project`; each command's stdout by its text as written."""
    outputs: dict[str, str] = {}
    for language, body in section_blocks():
        if language != "sh":
            path_line, _, content = body.partition("\n")
            path = project / path_line.removeprefix("# ").strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
            continue
        for command in filter(None, body.splitlines()):
            if command.startswith("export "):
                name, _, value = command.removeprefix("export ").partition("=")
                env[name] = database_url if name == "APP_DATABASE_URL" else shlex.split(value)[0]
                continue
            if command == "dg dev":
                outputs[command] = serve_ui(project, env)
                continue
            run = command.replace("pip install batch-assets", f"pip install {wheel}")
            outputs[command] = _run(["bash", "-c", run], cwd=project, env=env).stdout
    return outputs


class Watched:
    """`dg dev` as `wait_for` watches it: it fails at once, with the log, when the process ended."""

    def __init__(self, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.popen = popen
        self.log = log

    def running(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]


def serve_ui(project: Path, env: dict[str, str]) -> str:
    """`dg dev` on a free port until the UI lists the sweep's runs under the team's code location; then its process
    group is stopped, whatever happened."""
    port = free_port()
    log = project / "dg_dev.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(["dg", "dev", "--port", str(port)], cwd=project, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def runs() -> list[dict] | None:
            try:
                response = httpx.post(f"http://127.0.0.1:{port}/graphql", json={"query": RUNS_QUERY}, timeout=5)
                results = response.json()["data"]["runsOrError"]["results"]
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                return None
            return results or None

        try:
            found = wait_for(runs, timeout=180, what="the UI listing order_risk's runs", interval=1.0,
                             alive=Watched(popen, log))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log.read_text(errors='replace')[-5000:]}") from None
        assert len(found) >= 2 and {r["status"] for r in found} == {"SUCCESS"}, found
        # The CLI's run is created under the team's code location (dg launch executes in its own way, without one).
        cli_runs = [r for r in found if r["repositoryOrigin"] is not None]
        assert cli_runs and {r["repositoryOrigin"]["repositoryLocationName"] for r in cli_runs} == {"my-project"}
        return json.dumps(found)
    finally:
        try:
            os.killpg(popen.pid, signal.SIGTERM)
            popen.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            popen.wait(timeout=30)
