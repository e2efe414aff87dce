"""When the resident launcher's imports cannot stand for a client's (cli/launcher.py `refusal`): the client then
runs its command itself. The launcher itself is driven in tests/integration/test_launcher.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from batch_assets.cli import launcher
from batch_assets.cli.launcher_wire import interpreter


def request(**changes: Any) -> dict[str, Any]:
    base = {"argv": ["rules", "show"], "env": dict(os.environ), "cwd": os.getcwd(), **interpreter()}
    return {**base, **changes}


def test_a_client_like_the_launcher_is_served() -> None:
    assert launcher.refusal(request(), {}) is None


def test_what_is_read_at_run_time_may_differ() -> None:
    """Settings (BATCH_ASSETS_*) and DAGSTER_HOME are read in the forked process, from the client's environment."""
    env = {**os.environ, "BATCH_ASSETS_DATABASE_URL": "postgresql://elsewhere/db", "DAGSTER_HOME": "/elsewhere",
           "BATCH_ASSETS_TIMEZONE": "Asia/Tokyo", "HOME": "/nowhere"}
    assert launcher.refusal(request(env=env), {}) is None


def test_what_imports_read_must_be_the_same() -> None:
    for name in ("PYTHONPATH", "DAGSTER_SOME_FLAG", "LD_PRELOAD", "LC_ALL", "LANG"):
        env = {**os.environ, name: "/a/value/of/its/own"}
        reason = launcher.refusal(request(env=env), {})
        assert reason is not None and name in reason, (name, reason)
    missing = {k: v for k, v in os.environ.items() if k != "PATH"}
    assert launcher.refusal(request(env={**missing, "PYTHONHASHSEED": "7"}), {}) is not None


def test_another_python_or_other_options_are_refused() -> None:
    assert "executable" in (launcher.refusal(request(executable=sys.executable + "3"), {}) or "")
    flags = list(interpreter()["flags"])
    flags[0] = 1 - int(flags[0])
    assert "flags" in (launcher.refusal(request(flags=flags), {}) or "")
    assert "warnoptions" in (launcher.refusal(request(warnoptions=["error"]), {}) or "")


def test_a_source_changed_since_the_launcher_started_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text("x = 1\n")
    seen = {str(source): os.stat(source).st_mtime}
    assert launcher.refusal(request(), seen) is None
    os.utime(source, (0, 1))
    reason = launcher.refusal(request(), seen)
    assert reason is not None and str(source) in reason and "restart" in reason
    source.unlink()
    assert launcher.refusal(request(), seen) is not None


def test_a_malformed_request_is_refused() -> None:
    assert launcher.refusal(request(env="PATH=/bin"), {}) == "a malformed request"
    assert launcher.refusal(request(argv="rules show"), {}) == "a malformed request"
