"""Text the team controls never carries a value: a compute raising `SystemExit(f"points={points}")` or any other
exception, a write PostgreSQL refuses with a message that echoes the value (`invalid input syntax for type date:
"..."`), and a handler raising with a value in its message. Each value is a canary that must appear nowhere: not
in stdout or stderr, run history, checkpoints, the Dagster instance's event log or any file of the instance. The
one place a handler's own message goes is its row's `last_error` (the queue's dead letters show it)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import write_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
from _cli import EXIT_FAILED, EXIT_OK, dagster_event_text, execute, ok, rows, run_cli  # noqa: E402

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RUN_DATE = "2026-12-01"
EXITS, RAISES, UNWRITABLE, HANDLER = "91000095", "91000094", "91000096", "91000097"
CANARIES = (EXITS, RAISES, UNWRITABLE, HANDLER)

COMPUTE = """
    from datetime import timedelta

    def compute(row, run_date):
        points = row["points"]
        if points == 91000095:
            raise SystemExit(f"points={points}")
        if points == 91000094:
            raise ValueError(f"cannot rank points={points}")
        if points == 91000096:  # not a label of the tier enum: PostgreSQL's refusal of the page's write quotes it
            return {"tier": f"x{points}", "tier_review_on": run_date + timedelta(days=30)}
        return {"tier": "SILVER", "tier_review_on": run_date + timedelta(days=30)}
"""

HANDLER_SOURCE = """
    def send(*, id, recipient, body, attempts):
        if recipient.startswith("91000097"):
            raise SystemExit(f"cannot send to {recipient}")
"""


@pytest.fixture
def env(cli_env: dict[str, str], accounts: sa.Engine, tmp_path: Path) -> dict[str, str]:
    loyalty = tmp_path / "team_defs" / "loyalty"
    shutil.copytree(REPO / "examples" / "loyalty", loyalty)
    write_module(loyalty, "tiers", COMPUTE)
    notifications = tmp_path / "team_defs" / "notifications"
    shutil.copytree(REPO / "examples" / "notifications", notifications)
    write_module(notifications, "notify", HANDLER_SOURCE)
    with accounts.begin() as conn:
        conn.exec_driver_sql((REPO / "examples" / "notifications" / "schema.sql").read_text())
        # An enum column: a str passes the result's type check, and PostgreSQL's refusal of a value that is not one of
        # its labels quotes the value in its first line (`invalid input value for enum tier_kind: "x91000096"`).
        conn.exec_driver_sql("CREATE TYPE tier_kind AS ENUM ('BRONZE', 'SILVER', 'GOLD')")
        conn.exec_driver_sql("ALTER TABLE accounts ALTER COLUMN tier TYPE tier_kind USING tier::tier_kind")
    for i, canary in enumerate((EXITS, RAISES, UNWRITABLE)):
        execute(accounts, f"UPDATE accounts SET points = {canary} WHERE id = (SELECT id FROM accounts "  # noqa: S608
                          f"WHERE status = 'OPEN' ORDER BY id OFFSET {100 + i} LIMIT 1)")
    return {**cli_env, "BATCH_ASSETS_DEFS_DIR": str(loyalty.parent)}


def _everything_kept(engine: sa.Engine, home: Path) -> str:
    """ba_run_history, ba_checkpoints, the instance's event log and every file under the CLI's home, as text."""
    texts = [json.dumps([list(map(str, r)) for r in rows(engine, f"SELECT * FROM {table}")])  # noqa: S608
             for table in ("ba_run_history", "ba_checkpoints")]
    runs, events = dagster_event_text(home)
    assert runs >= 2, "the commands ran as Dagster runs on the CLI's instance"
    texts.append(events)
    texts += [path.read_bytes().decode("latin-1") for path in home.rglob("*") if path.is_file()]
    return "\n".join(texts)


def test_no_value_in_any_text_an_exception_or_a_refused_write_makes(env: dict[str, str], accounts: sa.Engine) -> None:
    sweep = run_cli(env, "jobs", "run", "loyalty_tier", "--set", "mode=full", "--set", f"run_date={RUN_DATE}",
                    "--set", "page_size=50")
    # The refused write keeps its page from moving the low watermark: FAILURE, resumable (a full sweep never
    # passes a row it could not write).
    assert sweep.returncode == EXIT_FAILED, sweep.describe()
    summary = sweep.summary
    assert summary is not None and summary["failed_by_type"]["compute_error"] == 2, sweep.describe()
    assert summary["failed_by_type"]["write_error"] == 1 and summary["changed"] == 1000 - 3, summary
    assert "page write failed (invalid_text_representation" in sweep.stderr, \
        "the refused write is named by its SQLSTATE condition:\n" + sweep.stderr

    execute(accounts, "INSERT INTO notifications (recipient, body) VALUES ('91000097@example.com', 'a'), "
                      "('ana@example.com', 'b')")
    ok(env, "db", "migrate")
    work = run_cli(env, "queue", "work", "--queue", "notifications", "--drain")
    assert work.returncode == EXIT_OK, work.describe()
    [(status, attempts, last_error)] = rows(accounts, "SELECT status, attempts, last_error FROM notifications "
                                                      "WHERE recipient LIKE '91000097%'")
    assert (status, attempts) == ("NEW", 1), "a handler's SystemExit is a transient failure of its attempt"
    assert last_error.startswith("SystemExit: cannot send to 91000097"), "the handler's own text: its last_error"

    shown = sweep.stdout + sweep.stderr + work.stdout + work.stderr
    kept = _everything_kept(accounts, Path(env["BATCH_ASSETS_HOME"]))
    for canary in CANARIES:
        assert canary not in shown, f"{canary} printed:\n{shown[-3000:]}"
        assert canary not in kept, f"{canary} kept in run history, checkpoints or the Dagster instance"
