"""The UI tests' fixtures: `batch-assets ui` (dg dev) on this test's database, stopped by its process group.

Each server gets a free port, a DAGSTER_HOME of its own (SQLite under the test's tmp_path, through
BATCH_ASSETS_HOME) and the test's own database; automation is off, so only what the test does starts a run.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from ui_server import BIN, UiServer, free_port, ui_process


@pytest.fixture
def ui_env(cli_env: dict[str, str]) -> dict[str, str]:
    """The CLI's environment on this test's database, with automation off (no schedule or sensor starts a run)
    and the tests' fixed run date (2025-06-01) inside the allowed window."""
    return dict(cli_env, BATCH_ASSETS_AUTOMATION="off", BATCH_ASSETS_RUN_DATE_WINDOW_DAYS="36500")


@pytest.fixture
def start_ui(ui_env: dict[str, str], tmp_path: Path) -> Callable[..., AbstractContextManager[UiServer]]:
    """`start_ui()` starts `batch-assets ui` on a free port; `start_ui(make=True)` starts it as `make ui`."""

    def start(*, make: bool = False) -> AbstractContextManager[UiServer]:
        port = free_port()
        if make:
            # -o: the venv is installed; never let the test reinstall it.
            cmd = ["make", "--no-print-directory", "-o", ".venv/.installed", "ui", f"UI_ARGS=--port {port}"]
        else:
            cmd = [str(BIN / "batch-assets"), "ui", "--port", str(port)]
        return ui_process(cmd, ui_env, tmp_path, port)

    return start
