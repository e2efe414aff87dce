"""`batch-assets ui` and `make ui` (dg dev) with real processes: a quiet start-up, and SIGTERM stops everything.

The webserver, the daemon and the code servers are children of dg dev; SIGTERM sent to the command the user
started (not to its group) must still leave none of them running.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from ui_server import BIN, REPO, UiServer, wait_gone

from batch_assets.cli.ui import still_running
from batch_assets.orchestration.instance_home import instance_template
from batch_assets.settings import environ_without_product

pytestmark = [pytest.mark.dagster]

# A stop takes dg dev a few seconds (it waits for its daemon threads and code servers); the CLI kills the rest
# after its own 30 s.
STOP_TIMEOUT_S = 60.0

NOTICE = re.compile(r"(BetaWarning|PreviewWarning|SupersessionWarning|is superseded|is currently in (beta|preview))")


@pytest.mark.slow
@pytest.mark.parametrize("make", [False, True], ids=["batch-assets ui", "make ui"])
def test_the_ui_starts_without_api_notices_and_sigterm_stops_every_process_it_started(
    start_ui: Callable[..., AbstractContextManager[UiServer]], make: bool
) -> None:
    with start_ui(make=make) as server:
        processes = server.note_descendants()
        commands = " ".join(" ".join(p.cmdline()) for p in still_running(processes))
        # dg dev (not the superseded `dagster dev`), with its webserver, daemon and code server under it.
        assert "dagster_dg_cli.cli dev" in commands and "dagster_webserver" in commands, commands
        assert "dagster._daemon" in commands and "code-server" in commands, commands
        notices = [line for line in server.output().splitlines() if NOTICE.search(line)]
        assert notices == [], "\n".join(notices)

        server.popen.send_signal(signal.SIGTERM)  # to the command only, as a service manager or `kill PID` does
        left = wait_gone([*processes, *server.note_descendants()], STOP_TIMEOUT_S)
        assert left == [], f"still running after SIGTERM: {[(p.pid, p.name()) for p in left]}\n{server.output()}"
        assert server.popen.wait(timeout=STOP_TIMEOUT_S) != 0
        assert "stopping the Dagster UI" in server.output()


LOAD_CODE_LOCATION = """
import batch_assets.definitions as definitions
definitions.defs().get_repository_def()  # what a code server and each run worker do
print("loaded")
"""


def _clean_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_bytes(instance_template("dagster.yaml"))
    env = environ_without_product()
    env.update(DAGSTER_HOME=str(home))
    return env


def test_loading_the_code_location_raises_no_api_notice(tmp_path: Path) -> None:
    """Python's warnings on "always": a notice raised once per sensor or asset would print once per raise
    (`dagster definitions validate` and `dg check defs` hide them; a code server and a run worker do not)."""
    done = subprocess.run([str(BIN / "python"), "-W", "always", "-c", LOAD_CODE_LOCATION], cwd=REPO,
                          env=_clean_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr
    notices = [line for line in done.stderr.splitlines() if NOTICE.search(line)]
    assert notices == [], "\n".join(notices)


def test_dg_check_defs_loads_the_project_of_tool_dg(tmp_path: Path) -> None:
    """CI's `dg check defs`: [tool.dg] in pyproject.toml names the code location batch_assets.definitions."""
    done = subprocess.run([str(BIN / "dg"), "check", "defs"], cwd=REPO, env=_clean_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "All definitions loaded successfully" in output
    assert "virtual environment" not in output  # [tool.dg.cli] suppress_warnings
