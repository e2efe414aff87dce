"""The package's layers hold: CLI → orchestration → domains → engine/locking/outbox → db → core, no Dagster below."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    """import-linter checks every contract of pyproject.toml ([tool.importlinter]); a broken one names the import."""
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
