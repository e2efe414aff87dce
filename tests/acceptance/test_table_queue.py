"""Acceptance: a team's own queue, declared as a batch_assets.TableQueueComponent (docs/reference/declarations.md).

The declaration is examples/notifications (its defs.yaml, handler and DDL), copied to a folder of the test's
own and named by BATCH_ASSETS_DEFS_DIR; everything is driven through `batch-assets` as real processes against
the test's database: `db migrate` installs the wake-up trigger and claim index, a resident `queue work
--queue notifications` (its own process group) is woken by rows another connection inserts, and `queue
stats|dlq list|dlq replay --queue notifications` see the results. Declarations that cannot work exit 2.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import sqlalchemy as sa
from _cli import EXIT_OK, EXIT_USAGE, REPO, CliProcess, execute, ok, rows, run_cli, scalar, wait_for

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "notifications"


@pytest.fixture
def defs(tmp_path: Path) -> Path:
    """A copy of examples/notifications (so its handler writes sent.jsonl under tmp_path)."""
    folder = tmp_path / "defs" / "notifications"
    shutil.copytree(EXAMPLE, folder)
    return folder


@pytest.fixture
def queue_env(cli_env: dict[str, str], defs: Path, tmp_path: Path) -> dict[str, str]:
    return {**cli_env, "BATCH_ASSETS_DEFS_DIR": str(defs.parent), "NOTIFICATIONS_SENT": str(tmp_path / "sent.jsonl")}


def _create_table(engine: sa.Engine, ddl: str | None = None) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(ddl or (EXAMPLE / "schema.sql").read_text())


def _statuses(engine: sa.Engine) -> dict[str, int]:
    return {r[0]: int(r[1]) for r in rows(engine, "SELECT status, count(*) FROM notifications GROUP BY status")}


def _listening(engine: sa.Engine) -> bool:
    return bool(scalar(engine, "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                               "'batch_assets_listener' AND query = 'LISTEN \"batch_assets_queue_notifications_due\"' "
                               "AND datname = current_database()"))


def test_declared_queue_end_to_end(queue_env: dict[str, str], engine: sa.Engine, tmp_path: Path) -> None:
    """migrate installs trigger + index (twice: idempotent); a resident worker is woken by direct inserts, calls the
    handler with the declared columns, fails a PermanentFailure at once; stats, DLQ list and replay see it."""
    _create_table(engine)
    for _ in range(2):
        assert "notifications" in ok(queue_env, "db", "migrate")["queues"]
    triggers = {r[0] for r in rows(engine, "SELECT tgname FROM pg_trigger WHERE tgrelid = 'notifications'::regclass "
                                           "AND NOT tgisinternal")}
    assert triggers == {"ba_q_notifications_notify_due_insert", "ba_q_notifications_notify_due_update"}
    index = scalar(engine, "SELECT indexdef FROM pg_indexes WHERE indexname = 'ba_q_notifications_claim_rank_idx'")
    assert "ba_queue_claim_rank(next_attempt_at" in index and "WHERE (status = 'NEW'" in index

    worker = CliProcess(queue_env, ["queue", "work", "--queue", "notifications"], tmp_path / "worker")
    try:
        wait_for(lambda: _listening(engine), timeout=90, what="the worker's LISTEN", alive=worker)
        execute(engine, "INSERT INTO notifications (recipient, body, priority) VALUES "
                        "('ana@example.com', 'hello', 0), ('bo@example.com', 'urgent', 5), "
                        "('cy@example.com', 'hi', 0), ('nobody', 'bounces', 0)")
        wait_for(lambda: _statuses(engine) == {"DONE": 3, "FAILED": 1}, timeout=60, what="3 DONE and 1 FAILED",
                 alive=worker)
        worker.signal(signal.SIGTERM)
        result = worker.wait(timeout=90)
    finally:
        worker.kill_group()
    assert result.returncode == EXIT_OK, result.describe()
    summary = result.summary
    assert summary is not None and summary["status"] == "SUCCESS" and summary["queue"] == "notifications"
    assert (summary["changed"], summary["failed"], summary["failed_by_type"]) == (3, 1, {"permanent_failure": 1})

    sent = [json.loads(line) for line in (tmp_path / "sent.jsonl").read_text().splitlines()]
    assert sorted(s["recipient"] for s in sent) == ["ana@example.com", "bo@example.com", "cy@example.com"]
    assert {s["attempts"] for s in sent} == {1}
    stats = ok(queue_env, "queue", "stats", "--queue", "notifications")
    assert stats["queue"] == "notifications" and stats["dlq_size"] == 1
    assert stats["by_status"] == {"NEW": 0, "PROCESSING": 0, "DONE": 3, "FAILED": 1}
    [item] = ok(queue_env, "queue", "dlq", "list", "--queue", "notifications")["items"]
    assert item["recipient"] == "nobody" and item["last_error"].startswith("PermanentFailure: not an address")
    replayed = ok(queue_env, "queue", "dlq", "replay", "--queue", "notifications", "--id", str(item["id"]))
    assert replayed["replayed"] == 1
    [row] = rows(engine, "SELECT status, attempts FROM notifications WHERE id = :id", id=item["id"])
    assert tuple(row) == ("NEW", 0)
    # The payments queue is untouched, and still the default.
    assert ok(queue_env, "queue", "stats")["queue"] == "payments"


def test_migrate_refuses_a_table_lacking_a_column(queue_env: dict[str, str], engine: sa.Engine, defs: Path) -> None:
    """A declared table without claimed_until: exit 2, one line naming the file, the table and the column;
    nothing is installed on it."""
    _create_table(engine, (EXAMPLE / "schema.sql").read_text().replace("claimed_until   timestamptz NULL,", ""))
    result = run_cli(queue_env, "db", "migrate")
    assert result.returncode == EXIT_USAGE, result.describe()
    line = result.stderr.strip().splitlines()[-1]
    assert str(defs / "defs.yaml") in line and "notifications" in line and "claimed_until" in line, line
    assert scalar(engine, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'notifications'::regclass "
                          "AND NOT tgisinternal") == 0
    assert scalar(engine, "SELECT count(*) FROM pg_attribute WHERE attrelid = 'notifications'::regclass "
                          "AND attname IN ('ba_claim_token', 'claim_token')") == 0
    # The worker refuses it the same way, before anything is claimed.
    result = run_cli(queue_env, "queue", "work", "--queue", "notifications", "--drain")
    assert result.returncode == EXIT_USAGE and "claimed_until" in result.stderr, result.describe()


@pytest.mark.parametrize(
    ("edit", "attribute"),
    [
        (lambda text: text + "  retries: 3\n", "retries"),  # an unknown attribute
        (lambda text: text.replace("notify:send", "notify_missing:send"), "handler"),  # cannot be imported
        (lambda text: text.replace("max_attempts: 3", "max_attempts: 0"), "max_attempts"),  # out of bounds
        (lambda text: text.replace("columns: [id, recipient, body]", "columns: [id, status]"), "columns"),
    ],
)
def test_a_declaration_that_cannot_work_exits_2(
    queue_env: dict[str, str], engine: sa.Engine, defs: Path, edit: object, attribute: str
) -> None:
    """exit 2, one line naming the file and the attribute, from queue work and queue stats; nothing claimed."""
    path = defs / "defs.yaml"
    path.write_text(edit(path.read_text()))  # type: ignore[operator]
    _create_table(engine)
    for command in (["queue", "work", "--queue", "notifications", "--drain"], ["queue", "stats", "--queue",
                                                                              "notifications"]):
        result = run_cli(queue_env, *command)
        assert result.returncode == EXIT_USAGE, result.describe()
        line = result.stderr.strip().splitlines()[-1]
        assert str(path) in line and attribute in line, line


def test_an_unknown_queue_exits_2(queue_env: dict[str, str]) -> None:
    result = run_cli(queue_env, "queue", "stats", "--queue", "nosuch")
    assert result.returncode == EXIT_USAGE and "queue" in result.stderr and "nosuch" in result.stderr, result.describe()


def test_jobs_list_shows_the_declared_queue_job(queue_env: dict[str, str], engine: sa.Engine) -> None:
    """The declared queue is a job of the code location: `<name>_queue_job`, with the worker's run config."""
    _create_table(engine)
    jobs = {job["name"]: job for job in ok(queue_env, "jobs", "list")["jobs"]}
    assert "notifications_queue_job" in jobs and "payment_queue_drain_job" in jobs
    fields = jobs["notifications_queue_job"]["fields"]
    names = {f["name"] for f in fields} if isinstance(fields, list) else set(fields)
    assert {"concurrency", "max_seconds", "drain", "batch_size", "db_outage_s"} <= names, fields
