"""The public API: `batch_assets` exports what its docs page lists, every name resolves, and a team's function that
imports its signals loads no Dagster."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import batch_assets

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_api_page_lists_exactly_the_public_names() -> None:
    """docs/reference/api.md names every public name once, and no other."""
    listed = re.findall(r"^\| `(\w+)` \|", (REPO / "docs" / "reference" / "api.md").read_text(), re.M)
    public = [name for name in batch_assets.__all__ if name != "__version__"]
    assert sorted(listed) == sorted(public)
    assert len(set(listed)) == len(listed)


def test_every_public_name_resolves() -> None:
    """Each name of __all__ is importable from the root, as `from batch_assets import NAME`."""
    for name in batch_assets.__all__:
        assert getattr(batch_assets, name) is not None, name
    with pytest.raises(AttributeError):
        batch_assets.no_such_name  # noqa: B018


def test_a_teams_function_importing_the_signals_loads_no_dagster() -> None:
    """`from batch_assets import RowFailure, PermanentFailure, RetryAfter` imports neither Dagster nor SQLAlchemy."""
    code = ("import sys; from batch_assets import RowFailure, PermanentFailure, RetryAfter; "
            "print(sorted(m for m in ('dagster', 'sqlalchemy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
