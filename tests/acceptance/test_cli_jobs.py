"""Acceptance: subscription expiry, payment queue and outbox relay through `batch-assets` (docs/reference/cli.md,
docs/guide/subscriptions.md, docs/guide/payment-queue.md)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import date, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from _cli import (
    COMMON_KEYS,
    EXIT_OK,
    EXIT_SKIPPED,
    assert_summary_keys,
    execute,
    expire_locks,
    ok,
    rows,
    run_cli,
    scalar,
    seed_customers,
    summary_run_date,
    write_scalar,
)

pytestmark = pytest.mark.integration

RUN_DATE = date(2026, 6, 15)


# --- subscriptions -------------------------------------------------------------------------------


def insert_subscriptions(engine, specs: list[tuple[date | None, str]], enrollments_each: int = 2) -> list[int]:
    """Insert subscriptions (expiry_date, status) with enrollments, as another service would."""
    ids = []
    for expiry, status in specs:
        sub_id = write_scalar(engine, "INSERT INTO subscriptions (customer_id, expiry_date, status) "
                                "VALUES (:c, :e, :s) RETURNING id", c=uuid.uuid4(), e=expiry, s=status)
        ids.append(sub_id)
        for course in range(enrollments_each):
            execute(engine, "INSERT INTO enrollments (subscription_id, course_id) VALUES (:s, :c)",
                    s=sub_id, c=course + 1)
    return ids


def sub_state(engine) -> dict[int, tuple]:
    return {
        r.id: (r.status, r.retry_count, r.last_error, r.n)
        for r in rows(engine, "SELECT s.id, s.status, s.retry_count, s.last_error, "
                              "(SELECT count(*) FROM enrollments e WHERE e.subscription_id = s.id) AS n "
                              "FROM subscriptions s")
    }


def test_subscriptions_expire_expires_past_due_atomically_and_isolates_failures(cli_env, engine):
    """expire: ACTIVE with expiry_date < run date → EXPIRED with enrollments deleted; a failing one → FAILED alone."""
    past = insert_subscriptions(engine, [(RUN_DATE - timedelta(days=d), "ACTIVE") for d in range(1, 21)])
    on_day = insert_subscriptions(engine, [(RUN_DATE, "ACTIVE")] * 3)
    future = insert_subscriptions(engine, [(RUN_DATE + timedelta(days=d), "ACTIVE") for d in range(1, 11)])
    no_date = insert_subscriptions(engine, [(None, "ACTIVE")])
    already = insert_subscriptions(engine, [(RUN_DATE - timedelta(days=40), "EXPIRED")], enrollments_each=0)
    # Another service's table references one expired subscription's enrollment: its delete fails.
    execute(engine, "CREATE TABLE other_service_certificates (enrollment_id bigint REFERENCES enrollments (id))")
    blocked = past[7]
    execute(engine, "INSERT INTO other_service_certificates SELECT id FROM enrollments WHERE subscription_id = :s",
            s=blocked)

    result = run_cli(cli_env, "subscriptions", "expire", "--run-date", RUN_DATE.isoformat())
    s = result.summary
    assert s is not None, result.describe()
    assert_summary_keys(s)
    assert result.returncode == {"SUCCESS": 0, "FAILURE": 1}[s["status"]], result.describe()
    assert s["changed"] == len(past) - 1 and s["failed"] == 1, s
    assert sum(s["failed_by_type"].values()) == 1, s

    state = sub_state(engine)
    for sid in past:
        if sid == blocked:
            status, retries, error, n = state[sid]
            assert (status, retries, n) == ("FAILED", 1, 2) and error, state[sid]
        else:
            assert state[sid][0] == "EXPIRED" and state[sid][3] == 0, state[sid]
    for sid in on_day + future + no_date:
        assert state[sid] == ("ACTIVE", 0, None, 2), state[sid]
    assert state[already[0]][0] == "EXPIRED"

    # Lock-at-least-for: a run right after is skipped (exit 75) without reading a row.
    skipped = run_cli(cli_env, "subscriptions", "expire", "--run-date", RUN_DATE.isoformat())
    assert skipped.returncode == EXIT_SKIPPED, skipped.describe()
    assert skipped.summary["status"] == "SKIPPED" and skipped.summary["scanned"] == 0, skipped.summary
    assert sub_state(engine) == state

    # Later (simulated): the nightly run does not select the FAILED one again; nothing else is left to do.
    expire_locks(engine)
    again = ok(cli_env, "subscriptions", "expire", "--run-date", RUN_DATE.isoformat())
    assert again["status"] == "SUCCESS" and again["changed"] == 0 and again["failed"] == 0, again
    assert sub_state(engine)[blocked][:2] == ("FAILED", 1)

    # Once the blocker is gone, --retry-failed expires it.
    execute(engine, "DELETE FROM other_service_certificates")
    expire_locks(engine)
    retried = ok(cli_env, "subscriptions", "expire", "--run-date", RUN_DATE.isoformat(), "--retry-failed")
    assert retried["changed"] == 1, retried
    assert sub_state(engine)[blocked][0] == "EXPIRED" and sub_state(engine)[blocked][3] == 0


def test_subscriptions_expire_rejects_a_bad_run_date(cli_env, engine):
    """`subscriptions expire --run-date 2026-02-30` exits 2 and expires nothing."""
    insert_subscriptions(engine, [(RUN_DATE - timedelta(days=1), "ACTIVE")])
    result = run_cli(cli_env, "subscriptions", "expire", "--run-date", "2026-02-30")
    assert result.returncode == 2, result.describe()
    assert scalar(engine, "SELECT count(*) FROM subscriptions WHERE status = 'ACTIVE'") == 1


# --- the payment queue ---------------------------------------------------------------------------


class LimitsService:
    """A local limits service: answers 200, 500 or 400 by payment id (or 200 for all), records calls."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.all_ok = False
        self._lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with service._lock:
                    service.calls.append({"path": self.path, "body": body,
                                          "key": self.headers.get("Idempotency-Key"),
                                          "content_type": self.headers.get("Content-Type")})
                code = service.code_for(str(body.get("payment_id")))
                payload = json.dumps({"ok": code == 200}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @staticmethod
    def planned(payment_id: str) -> int:
        # Fewer than 5 transient answers in all (with the enqueue seed below), so the outage
        # breaker of the payment queue (docs/guide/payment-queue.md) (5 transient failures in a row) cannot open in
        # this test.
        digit = uuid.UUID(payment_id).int % 10
        return 500 if digit == 0 else 400 if digit in (1, 2, 3) else 200

    def code_for(self, payment_id: str) -> int:
        try:
            return 200 if self.all_ok else self.planned(payment_id)
        except ValueError:
            return 422

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/limits"


@pytest.fixture
def limits() -> Iterator[LimitsService]:
    service = LimitsService()
    service.thread.start()
    yield service
    service.server.shutdown()
    service.server.server_close()


def payments(engine) -> dict:
    return {r.id: r for r in rows(engine, "SELECT id, amount_cents, status, attempts, next_attempt_at, "
                                          "last_error, processed_at FROM payments")}


def test_payment_queue_enqueue_work_dlq_list_and_replay(cli_env, engine, limits):
    """2xx → DONE, 400 → FAILED at once (DLQ), 500 → retried later; dlq list/replay bring FAILED back to DONE."""
    env = dict(cli_env, BATCH_ASSETS_LIMITS_URL=limits.url)
    enq = ok(env, "queue", "enqueue", "--count", "30", "--seed", "1")
    assert enq["status"] == "SUCCESS"
    assert scalar(engine, "SELECT count(*) FROM payments WHERE status = 'NEW'") == 30
    before = payments(engine)
    plan = {pid: limits.planned(str(pid)) for pid in before}
    assert set(plan.values()) == {200, 400, 500}, "the seed must exercise every answer"

    result = run_cli(env, "queue", "work", "--concurrency", "4", "--max-seconds", "20", "--drain")
    s = result.summary
    assert s is not None, result.describe()
    assert_summary_keys(s, COMMON_KEYS)
    assert result.returncode == EXIT_OK and s["status"] == "SUCCESS", result.describe()

    after = payments(engine)
    for pid, code in plan.items():
        row = after[pid]
        if code == 200:
            assert row.status == "DONE" and row.attempts == 1 and row.processed_at is not None, row
        elif code == 400:
            assert row.status == "FAILED" and row.attempts == 1 and row.last_error, row
        else:
            assert row.status in ("NEW", "PROCESSING") and row.attempts == 1, row
            assert row.last_error, row
            assert scalar(engine, "SELECT next_attempt_at > now() FROM payments WHERE id = :id", id=pid), row
    assert s["changed"] == sum(1 for c in plan.values() if c == 200), s
    calls = {c["key"]: c for c in limits.calls}
    for pid in plan:
        call = calls[str(pid)]
        assert call["body"] == {"payment_id": str(pid), "amount_cents": before[pid].amount_cents}, call
    assert len(limits.calls) == 30, "one call per due payment"

    dead = {pid for pid, code in plan.items() if code == 400}
    listed = ok(env, "queue", "dlq", "list")
    listed_ids = {uuid.UUID(str(item["id"])) for item in listed.get("items", [])}
    assert listed_ids == dead, listed
    assert listed.get("count", len(listed_ids)) == len(dead)

    limits.all_ok = True
    one = sorted(dead)[0]
    replay_one = ok(env, "queue", "dlq", "replay", "--id", str(one))
    assert replay_one["status"] == "SUCCESS"
    assert payments(engine)[one].status == "NEW"
    assert {pid for pid, r in payments(engine).items() if r.status == "FAILED"} == dead - {one}
    ok(env, "queue", "work", "--max-seconds", "20", "--drain")
    assert payments(engine)[one].status == "DONE"

    ok(env, "queue", "dlq", "replay")
    assert scalar(engine, "SELECT count(*) FROM payments WHERE status = 'FAILED'") == 0
    ok(env, "queue", "work", "--max-seconds", "20", "--drain")
    final = payments(engine)
    assert all(final[pid].status == "DONE" for pid in dead)
    assert ok(env, "queue", "dlq", "list").get("count", 0) == 0
    # A payment is marked DONE at most once: the DONE ones were never called again.
    done_first = [pid for pid, code in plan.items() if code == 200]
    assert all(sum(1 for c in limits.calls if c["key"] == str(pid)) == 1 for pid in done_first)


def test_queue_enqueue_rejects_a_non_positive_count(cli_env, engine):
    """`queue enqueue --count 0` exits 2 and enqueues nothing."""
    result = run_cli(cli_env, "queue", "enqueue", "--count", "0")
    assert result.returncode == 2, result.describe()
    assert scalar(engine, "SELECT count(*) FROM payments") == 0


# --- the outbox relay -----------------------------------------------------------------------------


def test_outbox_relay_sends_pending_events_to_the_json_lines_sink(cli_env, engine):
    """outbox relay: each PENDING event → one JSON line under BATCH_ASSETS_HOME → SENT; a rerun sends nothing."""
    seeded = seed_customers(cli_env, 300, "--seed", "31")
    run_date = summary_run_date(seeded)
    ok(cli_env, "sweep", "customer-status", "--mode", "delta", "--run-date", run_date.isoformat())
    pending = {r.id: r for r in rows(engine, "SELECT id, aggregate_id, payload FROM outbox_events "
                                             "WHERE status = 'PENDING'")}
    assert len(pending) == 300

    result = run_cli(cli_env, "outbox", "relay")
    s = result.summary
    assert result.returncode == 0 and s is not None, result.describe()
    assert_summary_keys(s)
    assert s["status"] == "SUCCESS", s
    states = rows(engine, "SELECT status, sent_at IS NOT NULL AS sent, count(*) AS n FROM outbox_events "
                          "GROUP BY 1, 2")
    assert [tuple(r) for r in states] == [("SENT", True, 300)]

    home = Path(cli_env["BATCH_ASSETS_HOME"])
    files = sorted(home.rglob("*.jsonl"))
    assert len(files) == 1, files
    messages = [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]
    by_id = {int(m["id"]): m for m in messages}
    assert len(messages) == 300 and set(by_id) == set(pending)
    for event_id, event in pending.items():
        message = by_id[event_id]
        assert str(message["aggregate_id"]) == str(event.aggregate_id)
        assert message["payload"] == event.payload

    again = run_cli(cli_env, "outbox", "relay")
    assert again.returncode == 0 and again.summary["status"] == "SUCCESS", again.describe()
    assert len(files[0].read_text().splitlines()) == 300, "nothing is sent twice"
