"""Fixtures of the declared-job tests: the example's accounts table in the test's own database, and a folder
of the team's functions on sys.path (as BATCH_ASSETS_DEFS_DIR is)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "loyalty"


@pytest.fixture
def accounts(engine: sa.Engine) -> sa.Engine:
    """The README example's table and rows (examples/loyalty/accounts.sql): 1,000 OPEN accounts, one without
    points, and 10 CLOSED ones."""
    with engine.begin() as conn:
        conn.exec_driver_sql((EXAMPLE / "accounts.sql").read_text())
    return engine


@pytest.fixture
def functions(tmp_path: Path) -> Iterator[Path]:
    """A folder first on sys.path, for the test's own compute modules (`write_module`)."""
    folder = tmp_path / "functions"
    folder.mkdir()
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        for name in [n for n, m in sys.modules.items() if str(folder) in str(getattr(m, "__file__", "") or "")]:
            del sys.modules[name]


@pytest.fixture
def defs_dir(tmp_path: Path) -> Path:
    """A copy of the README example (defs.yaml + tiers.py) as the team's folder."""
    folder = tmp_path / "team_defs" / "loyalty"
    shutil.copytree(EXAMPLE, folder)
    return folder.parent


@pytest.fixture
def env(cli_env: dict[str, str], defs_dir: Path, accounts: sa.Engine) -> dict[str, str]:
    """The CLI's environment with the example's folder as BATCH_ASSETS_DEFS_DIR."""
    return {**cli_env, "BATCH_ASSETS_DEFS_DIR": str(defs_dir)}
