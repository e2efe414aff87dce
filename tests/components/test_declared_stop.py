"""SIGTERM and a call that does not return: a declared sweep whose `compute` and a declared queue whose `handler`
sleep for minutes on one row still end within their drain time plus 30 s, give back lock and lease (or the claim),
and the next run finishes the rows. Driven as an outside test drives them: `batch-assets` processes in their own
sessions with BATCH_ASSETS_DEFS_DIR, stopped by their own id."""

from __future__ import annotations

import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import write_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
from _cli import EXIT_OK, CliProcess, execute, ok, rows, run_cli, scalar, wait_for  # noqa: E402

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LOYALTY = REPO / "examples" / "loyalty"
NOTIFICATIONS = REPO / "examples" / "notifications"
RUN_DATE = "2026-12-01"
DRAIN_S = 5
SLACK_S = 30
"""What a stopped run may take past its drain time: record the low watermark, give back lock and lease, report."""

# The compute sleeps 10 minutes on one row (the key in SLOW_KEY) while the file SLOW_FLAG exists, and says so by
# creating SLOW_STARTED first. Every other row is the README example's.
SLOW_COMPUTE = """
    import os, time
    from datetime import timedelta
    from pathlib import Path

    from batch_assets import RowFailure

    def compute(row, run_date):
        if Path(os.environ["SLOW_FLAG"]).exists() and str(row["id"]) == Path(os.environ["SLOW_KEY"]).read_text():
            Path(os.environ["SLOW_STARTED"]).touch()
            time.sleep(600)
        if row["points"] is None:
            raise RowFailure("missing_points")
        return {"tier": "GOLD" if row["points"] >= 10000 else "SILVER" if row["points"] >= 1000 else "BRONZE",
                "tier_review_on": run_date + timedelta(days=30)}
"""

SLOW_HANDLER = """
    import os, time
    from pathlib import Path

    def send(*, id, recipient, body, attempts):
        if recipient == "slow@example.com" and Path(os.environ["SLOW_FLAG"]).exists():
            Path(os.environ["SLOW_STARTED"]).touch()
            time.sleep(600)
        with open(os.environ["NOTIFICATIONS_SENT"], "a", encoding="utf-8") as out:
            out.write(f"{id}\\n")
"""


def _held(engine: sa.Engine) -> list[Any]:
    """Live job locks and leases (a released one is gone, or expired)."""
    return rows(engine, "SELECT 'lock', name, owner FROM ba_job_locks WHERE lock_until > now() "
                        "UNION ALL SELECT 'lease', name, owner FROM ba_leases WHERE expires_at > now()")


def _stopped_within(process: CliProcess, started: Path, limit_s: float) -> tuple[Any, float]:
    """Wait until the slow call started, SIGTERM the process, and wait for it (at most `limit_s` + a margin that
    only keeps a failing test from hanging): its result and how long it took after the signal."""
    wait_for(started.exists, timeout=120, what="the slow call to start", alive=process)
    signalled = time.monotonic()
    process.signal(signal.SIGTERM)
    result = process.wait(timeout=limit_s + 60)
    return result, time.monotonic() - signalled


@pytest.fixture
def sweep_env(cli_env: dict[str, str], accounts: sa.Engine, tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "team_defs" / "loyalty"
    shutil.copytree(LOYALTY, folder)
    write_module(folder, "tiers", SLOW_COMPUTE)
    (tmp_path / "slow.flag").touch()
    return {**cli_env, "BATCH_ASSETS_DEFS_DIR": str(folder.parent), "SLOW_FLAG": str(tmp_path / "slow.flag"),
            "SLOW_KEY": str(tmp_path / "slow.key"), "SLOW_STARTED": str(tmp_path / "slow.started")}


def test_sigterm_ends_a_declared_sweep_whose_compute_does_not_return(
    sweep_env: dict[str, str], accounts: sa.Engine, tmp_path: Path
) -> None:
    """A compute stuck for 10 minutes on the 500th row: SIGTERM ends the run within drain + 30 s, lock and lease are
    free, the checkpoint stays before the unfinished row, and the next run resumes from it and finishes."""
    slow_key = scalar(accounts, "SELECT id::text FROM accounts WHERE status = 'OPEN' ORDER BY id OFFSET 500 LIMIT 1")
    Path(sweep_env["SLOW_KEY"]).write_text(slow_key)
    args = ["jobs", "run", "loyalty_tier", "--set", "mode=full", "--set", "ranges=1", "--set", f"run_date={RUN_DATE}",
            "--set", "page_size=50", "--set", "workers=2", "--set", "window=2", "--set", f"drain_timeout_s={DRAIN_S}",
            "--set", "checkpoint_every_s=0.01"]
    with CliProcess(sweep_env, args, tmp_path / "first") as first:
        result, took = _stopped_within(first, Path(sweep_env["SLOW_STARTED"]), DRAIN_S + SLACK_S)
    assert took <= DRAIN_S + SLACK_S, f"took {took:.0f}s after SIGTERM\n{result.describe()}"
    assert result.summary is not None and result.summary["status"] == "FAILURE", result.describe()
    assert _held(accounts) == [], "lock and lease given back"
    [cursor] = rows(accounts, "SELECT cursor FROM ba_checkpoints WHERE sweep = 'loyalty_tier'")
    assert cursor[0] is not None and cursor[0] < slow_key, "the low watermark never passes an unfinished row"
    assert scalar(accounts, "SELECT tier FROM accounts WHERE id = :id", id=slow_key) is None

    Path(sweep_env["SLOW_FLAG"]).unlink()
    second = run_cli(sweep_env, *args[:-4])
    assert second.returncode == EXIT_OK, second.describe()
    summary = second.summary
    assert summary is not None and summary["resumed_from"] == cursor[0], summary
    assert scalar(accounts, "SELECT count(*) FROM accounts WHERE status = 'OPEN' AND tier IS NOT NULL") == 999


@pytest.fixture
def queue_env(cli_env: dict[str, str], engine: sa.Engine, tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "defs" / "notifications"
    shutil.copytree(NOTIFICATIONS, folder)
    write_module(folder, "notify", SLOW_HANDLER)
    # The call's own bound is longer than the drain: the stop, not the call timeout, ends the call.
    defs = folder / "defs.yaml"
    defs.write_text(defs.read_text() + "  call_timeout_s: 300\n")
    with engine.begin() as conn:
        conn.exec_driver_sql((NOTIFICATIONS / "schema.sql").read_text())
    (tmp_path / "slow.flag").touch()
    return {**cli_env, "BATCH_ASSETS_DEFS_DIR": str(folder.parent), "NOTIFICATIONS_SENT": str(tmp_path / "sent"),
            "SLOW_FLAG": str(tmp_path / "slow.flag"), "SLOW_STARTED": str(tmp_path / "slow.started")}


def test_sigterm_ends_a_declared_queue_worker_whose_handler_does_not_return(
    queue_env: dict[str, str], engine: sa.Engine, tmp_path: Path
) -> None:
    """A handler stuck for 10 minutes: SIGTERM ends the worker within its drain time (30 s) + 30 s with exit 0, the
    stuck row is given back (attempt undone) and the next drain finishes it."""
    ok(queue_env, "db", "migrate")
    execute(engine, "INSERT INTO notifications (recipient, body) VALUES ('slow@example.com', 'a'), "
                    "('ana@example.com', 'b'), ('bo@example.com', 'c')")
    with CliProcess(queue_env, ["queue", "work", "--queue", "notifications"], tmp_path / "worker") as worker:
        result, took = _stopped_within(worker, Path(queue_env["SLOW_STARTED"]), 30 + SLACK_S)
    assert took <= 30 + SLACK_S, f"took {took:.0f}s after SIGTERM\n{result.describe()}"
    assert result.returncode == EXIT_OK, result.describe()
    [slow] = rows(engine, "SELECT status, attempts FROM notifications WHERE recipient = 'slow@example.com'")
    assert tuple(slow) == ("NEW", 0), "the row whose call was in flight is given back, its attempt undone"

    Path(queue_env["SLOW_FLAG"]).unlink()
    ok(queue_env, "queue", "work", "--queue", "notifications", "--drain")
    assert {r[0] for r in rows(engine, "SELECT status FROM notifications")} == {"DONE"}


def test_call_timeout_s_is_declared_shown_with_its_bounds_and_enforced(
    sweep_env: dict[str, str], tmp_path: Path
) -> None:
    """`jobs list` shows call_timeout_s with the bounds `jobs run` enforces before a run starts; a declaration's own
    call_timeout_s outside its bounds is exit 2 naming the file and the attribute."""
    listed = run_cli(sweep_env, "jobs", "list")
    assert listed.returncode == EXIT_OK, listed.describe()
    jobs = {job["name"]: job for job in (listed.summary or {})["jobs"]}
    field = {f["name"]: f for f in jobs["loyalty_tier"]["fields"]}["call_timeout_s"]
    assert (field["gt"], field["le"], field["default"]) == (0, 3600, None), field
    for bad in ("0", "3601"):
        refused = run_cli(sweep_env, "jobs", "run", "loyalty_tier", "--set", f"call_timeout_s={bad}")
        assert refused.returncode == 2 and "call_timeout_s" in refused.stderr, refused.describe()
    defs = Path(sweep_env["BATCH_ASSETS_DEFS_DIR"]) / "loyalty" / "defs.yaml"
    defs.write_text(defs.read_text() + "  call_timeout_s: 0\n")
    broken = run_cli(sweep_env, "jobs", "list")
    assert broken.returncode == 2 and f"{defs}: call_timeout_s:" in broken.stderr, broken.describe()
