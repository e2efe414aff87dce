"""The README's "Queue your own table" runs as written: its command block (after the marker
`<!-- queue-your-own-table:commands -->`), verbatim, in bash, on a fresh database, from the repository root.
Commands are read from README.md itself, and the `queue stats` line it shows is compared with the real one."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from batch_assets.settings import environ_without_product

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- queue-your-own-table:commands -->"

pytestmark = pytest.mark.integration


def _section() -> str:
    return (REPO / "README.md").read_text().split(MARKER, 1)[1]


def readme_commands() -> str:
    block = re.match(r"\s*```sh\n(.*?)\n```", _section(), re.DOTALL)
    assert block is not None, "the marker must be followed by a ```sh block"
    return block.group(1)


def readme_stats_line() -> dict:
    return json.loads(re.search(r"```json\n(.*?)\n```", _section(), re.DOTALL).group(1))  # type: ignore[union-attr]


def test_example_files_are_the_readmes() -> None:
    """The DDL and YAML the README shows are the example folder's files."""
    readme = (REPO / "README.md").read_text()
    folder = REPO / "examples" / "notifications"
    assert (folder / "defs.yaml").read_text().strip() in readme
    ddl = (folder / "schema.sql").read_text()
    assert ddl[ddl.index("CREATE TABLE"):].strip() in readme


@pytest.mark.skipif(shutil.which("psql") is None, reason="the README's commands create the table with psql")
def test_readme_queue_your_own_table(empty_db_url: str, key_text: str, tmp_path: Path) -> None:
    commands = readme_commands()
    assert "batch-assets queue work --queue notifications" in commands
    env = environ_without_product()
    env.update(BATCH_ASSETS_DATABASE_URL=empty_db_url, BATCH_ASSETS_ENCRYPTION_KEY=key_text,
               BATCH_ASSETS_HOME=str(tmp_path / "home"), NOTIFICATIONS_SENT=str(tmp_path / "sent.jsonl"),
               PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    proc = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + commands], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    migrated, work, stats, dlq = lines[-4:]
    assert "notifications" in migrated["queues"]
    assert (work["status"], work["changed"], work["failed"], work["failed_by_type"]) == (
        "SUCCESS", 2, 1, {"permanent_failure": 1})
    shown = readme_stats_line()
    for key, value in shown.items():
        assert stats[key] == value, f"the README's stats line says {key}={value!r}, the command {stats[key]!r}"
    assert [item["recipient"] for item in dlq["items"]] == ["nobody"]
    sent = [json.loads(line) for line in (tmp_path / "sent.jsonl").read_text().splitlines()]
    assert sorted(s["recipient"] for s in sent) == ["ana@example.com", "bo@example.com"]
