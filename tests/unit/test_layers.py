"""The package's layers hold (pyproject.toml, [tool.importlinter]): CLI → reference project → orchestration →
engines (sweep, queue, outbox, retention) → locking → db → core, no Dagster below orchestration."""

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


def test_every_orchestration_module_is_in_a_layer() -> None:
    """A module of batch_assets.orchestration that no layer names is checked by no layer (the watchdog and the
    instance home were): each one is placed in the layers contract."""
    import re
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    [layers] = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    named = {name.strip("() ") for layer in layers["layers"] for name in re.split(r"[|:]", layer)}
    package = REPO / "batch_assets" / "orchestration"
    modules = {f"batch_assets.orchestration.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {f"batch_assets.orchestration.{p.name}" for p in package.iterdir() if (p / "__init__.py").exists()}
    assert sorted(modules - named) == []
