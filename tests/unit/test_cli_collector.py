"""Start-up: the CLI's collector is paused only in a process started as the CLI, and resumed frozen."""

from __future__ import annotations

import gc
import sys

import pytest

from batch_assets.cli import startup

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("argv", "orig_argv", "expected"), [
    (["/venv/bin/batch-assets", "sweep"], ["/venv/bin/python", "/venv/bin/batch-assets", "sweep"], True),
    (["-m", "sweep"], ["python", "-m", "batch_assets.cli", "sweep"], True),
    (["-m"], ["python", "-X", "importtime", "-m", "batch_assets.cli"], True),
    (["pytest"], ["python", "-m", "pytest", "tests"], False),
    (["-c"], ["python", "-c", "import batch_assets.cli"], False),
    (["-m"], ["python", "-m"], False),
])
def test_started_as_cli(monkeypatch: pytest.MonkeyPatch, argv: list[str], orig_argv: list[str],
                        expected: bool) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert startup.started_as_cli() is expected


def test_this_process_keeps_its_collector() -> None:
    """Importing the CLI (as the tests do) left the collector of this process on."""
    assert gc.isenabled()


def test_resume_freezes_what_was_imported_and_turns_collection_on() -> None:
    frozen = gc.get_freeze_count()
    gc.disable()
    try:
        startup.resume_collector()
        assert gc.isenabled()
        assert gc.get_freeze_count() > frozen
    finally:
        gc.enable()
        gc.unfreeze()


def test_resume_leaves_a_running_collector_alone() -> None:
    frozen = gc.get_freeze_count()
    startup.resume_collector()
    assert gc.isenabled() and gc.get_freeze_count() == frozen
