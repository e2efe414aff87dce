"""The README's "Sweep your own table" runs as written: its command block (after the marker
`<!-- sweep-your-own-table:commands -->`), verbatim, in bash, on a fresh database, from the repository root.
The README and this test cannot drift: the commands are read from README.md itself."""

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
import sqlalchemy as sa

from batch_assets.settings import environ_without_product

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- sweep-your-own-table:commands -->"


def readme_commands() -> str:
    text = (REPO / "README.md").read_text()
    after = text.split(MARKER, 1)[1]
    block = re.match(r"\s*```sh\n(.*?)\n```", after, re.DOTALL)
    assert block is not None, "the marker must be followed by a ```sh block"
    return block.group(1)


def readme_json_line() -> dict:
    section = (REPO / "README.md").read_text().split(MARKER, 1)[1]
    return json.loads(re.search(r"```json\n(.*?)\n```", section, re.DOTALL).group(1))  # type: ignore[union-attr]


@pytest.mark.skipif(shutil.which("psql") is None, reason="the README's commands create the table with psql")
def test_readme_sweep_your_own_table(empty_db_url: str, key_text: str, tmp_path: Path) -> None:
    commands = readme_commands()
    assert "batch-assets jobs run loyalty_tier" in commands
    env = environ_without_product()
    env.update(BATCH_ASSETS_DATABASE_URL=empty_db_url, BATCH_ASSETS_ENCRYPTION_KEY=key_text,
               BATCH_ASSETS_HOME=str(tmp_path / "home"), PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    script = "set -euo pipefail\n" + commands
    proc = subprocess.Popen(["bash", "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    listed, full, delta = lines[-3], lines[-2], lines[-1]
    assert "loyalty_tier" in {job["name"] for job in listed["jobs"]}
    shown = readme_json_line()
    for key in ("status", "mode", "scanned", "changed", "failed", "failed_by_type", "conflicts", "pages", "ranges",
                "audit_events", "resumed_from"):
        assert full[key] == shown[key], f"the README's JSON line says {key}={shown[key]!r}, the run {full[key]!r}"
    assert set(full) == set(shown), "the README shows every key of the JSON line"
    assert (delta["scanned"], delta["changed"], delta["failed"]) == (1, 0, 1)
    engine = sa.create_engine(empty_db_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM accounts WHERE tier IS NOT NULL")).scalar_one() == 999
            events = conn.execute(sa.text("SELECT payload FROM outbox_events WHERE event_type = 'tier_changed'")).all()
    finally:
        engine.dispose()
    assert len(events) == 999 and all("points" not in json.dumps(e.payload) for e in events)
