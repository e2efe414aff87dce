"""The payment queue on a real PostgreSQL: claim, fencing, retries, DLQ, worker stop conditions."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from batch_assets.errors import ConfigError
from batch_assets.queue.claims import Claim, Result, planned_result
from batch_assets.queue.handler import Outcome, OutcomeKind
from batch_assets.queue.settings import QueueSettings
from batch_assets.reference.payments import queue
from batch_assets.reference.payments.handler import SimulatedHandler
from batch_assets.reference.payments.seed import seed_payments
from batch_assets.reference.payments.store import PAYMENTS
from batch_assets.reference.payments.worker import run_worker

pytestmark = pytest.mark.integration


def _statuses(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT status, count(*) FROM payments GROUP BY status")).all())


def _row(engine: sa.Engine, payment_id: uuid.UUID) -> sa.Row:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT * FROM payments WHERE id = :id"), {"id": payment_id}).one()


def _make_due(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE payments SET next_attempt_at = now() - interval '1 second' WHERE status = 'NEW'"))


def _expire_leases(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE payments SET claimed_until = now() - interval '1 second' WHERE status = 'PROCESSING'")
        )


def _complete(engine: sa.Engine, claim: Claim) -> bool:
    """DONE through the store's fenced result statement; False when the claim was lost."""
    return len(PAYMENTS.write_results(engine, [Result(claim, "DONE")])) == 1


def _retry_or_fail(engine: sa.Engine, claim: Claim, error: str, settings: QueueSettings, permanent: bool) -> str | None:
    """What the worker writes after a failed call (NEW after the backoff, or FAILED); None when the claim was lost."""
    planned = planned_result(claim, settings, permanent)
    written = PAYMENTS.write_results(engine, [Result(claim, planned.status, delay_s=planned.delay_s, error=error)])
    return planned.status if written else None


class ScriptedHandler:
    """Returns outcomes from a function of the claim; records every call."""

    def __init__(self, decide: Callable[[Claim], Outcome]) -> None:
        self.decide = decide
        self.calls: list[Claim] = []
        self._lock = threading.Lock()

    def handle(self, claim: Claim) -> Outcome:
        with self._lock:
            self.calls.append(claim)
        return self.decide(claim)

    def close(self) -> None:
        return None


def test_settings_have_real_defaults_and_invalid_values_name_the_field() -> None:
    """QueueSettings: a missing knob is its default; 0 is no default but a value (refused where it is not
    allowed); bad values raise ConfigError naming the field."""
    s = QueueSettings(max_attempts=3)
    assert (s.batch_size, s.concurrency, s.max_attempts) == (50, 8, 3)
    for field in ("batch_size", "concurrency", "claim_lease_s"):
        with pytest.raises(ConfigError) as info:
            QueueSettings(**{field: 0})
        assert info.value.field == field
    assert QueueSettings(rate_limit_per_s=0, max_in_flight=0, backoff_jitter=0).backoff_jitter == 0
    with pytest.raises(ConfigError) as info:
        QueueSettings(concurrency=-1)
    assert info.value.field == "concurrency"
    with pytest.raises(ConfigError) as info:
        QueueSettings(batch_size=2.5)
    assert info.value.field == "batch_size"
    # The lease is renewed while the claim is held, so it may be shorter than a call, not shorter than 1 s.
    assert QueueSettings(claim_lease_s=5, http_timeout_s=10).claim_lease_s == 5
    for field, bad in (("claim_lease_s", 0.5), ("backoff_jitter", 1.5), ("rate_limit_per_s", -1),
                       ("max_in_flight", 2.5)):
        with pytest.raises(ConfigError) as info:
            QueueSettings(**{field: bad})
        assert info.value.field == field
    with pytest.raises(ConfigError) as info:
        QueueSettings(bogus=1)
    assert info.value.field == "bogus"


def test_backoff_doubles_per_attempt_and_is_capped() -> None:
    """Backoff is base * 2^(attempts-1), never above backoff_max_s."""
    s = QueueSettings(backoff_base_s=60, backoff_max_s=3600)
    assert [s.backoff_s(a) for a in (1, 2, 3, 4, 7, 8, 500)] == [60, 120, 240, 480, 3600, 3600, 3600]


def test_seed_is_deterministic_under_seed(engine: sa.Engine) -> None:
    """The same seed yields the same payment ids and amounts; no seed yields fresh ids."""
    assert seed_payments(engine, 20, seed=7) == 20
    with engine.begin() as conn:
        first = conn.execute(sa.text("SELECT id, amount_cents FROM payments ORDER BY id")).all()
        conn.execute(sa.text("DELETE FROM payments"))
    seed_payments(engine, 20, seed=7)
    with engine.connect() as conn:
        again = conn.execute(sa.text("SELECT id, amount_cents FROM payments ORDER BY id")).all()
    assert first == again
    assert all(100 <= a <= 100_000 for _, a in first)
    assert queue.enqueue(engine, 5) == 5
    assert _statuses(engine) == {"NEW": 25}


def test_claim_sets_processing_attempts_and_lease(engine: sa.Engine) -> None:
    """A claim moves due NEW rows to PROCESSING with attempts + 1, a lease and its token; not-due rows stay."""
    queue.enqueue(engine, 5, seed=1)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE payments SET next_attempt_at = now() + interval '1 hour' "
                "WHERE id = (SELECT id FROM payments ORDER BY id LIMIT 1)"
            )
        )
    claims = PAYMENTS.claim(engine, 10, lease_s=30)
    assert len(claims) == 4
    assert all(c.attempts == 1 for c in claims)
    assert len({c.token for c in claims}) == 1
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT status, attempts, claim_token, claimed_until - now() AS left FROM payments "
                "WHERE status = 'PROCESSING'"
            )
        ).all()
    assert len(rows) == 4
    assert all(r.claim_token == claims[0].token and 25 < r.left.total_seconds() <= 30 for r in rows)
    assert PAYMENTS.claim(engine, 10, lease_s=30) == []  # nothing else is due


def test_concurrent_claimers_never_get_the_same_row(engine: sa.Engine) -> None:
    """Many threads claiming at once (barrier) get disjoint rows, and together every due row."""
    queue.enqueue(engine, 400, seed=2)
    threads_n = 8
    barrier = threading.Barrier(threads_n)
    got: list[list[Claim]] = [[] for _ in range(threads_n)]
    errors: list[BaseException] = []

    def claimer(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            while batch := PAYMENTS.claim(engine, 7, lease_s=60):
                got[i].extend(batch)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    ids = [c.id for batch in got for c in batch]
    assert len(ids) == len(set(ids)) == 400
    assert sum(1 for batch in got if batch) > 1  # the work was actually shared
    assert _statuses(engine) == {"PROCESSING": 400}


def test_expired_claim_is_reclaimed_and_the_old_owner_is_fenced(engine: sa.Engine) -> None:
    """After the lease passes another worker re-claims the row; the old worker's writes match nothing."""
    queue.enqueue(engine, 1, seed=3)
    settings = QueueSettings(max_attempts=5)
    [old] = PAYMENTS.claim(engine, 1, lease_s=60)
    assert PAYMENTS.claim(engine, 1, lease_s=60) == []  # the lease still holds
    _expire_leases(engine)
    [new] = PAYMENTS.claim(engine, 1, lease_s=60)
    assert new.id == old.id and new.attempts == 2 and new.token != old.token
    assert _complete(engine, old) is False
    assert _retry_or_fail(engine, old, "late failure", settings, permanent=True) is None
    assert _row(engine, new.id).status == "PROCESSING"
    assert _complete(engine, new) is True
    assert _complete(engine, new) is False  # DONE at most once
    row = _row(engine, new.id)
    assert (row.status, row.attempts) == ("DONE", 2)
    assert row.processed_at is not None


def test_worker_counts_a_lost_claim(engine: sa.Engine) -> None:
    """A worker whose claim was taken over while its call ran reports a lost claim and writes nothing."""
    queue.enqueue(engine, 1, seed=4)
    settings = QueueSettings(concurrency=1, batch_size=1, max_attempts=5)
    taken: list[Claim] = []

    def steal_then_fail(claim: Claim) -> Outcome:
        _expire_leases(engine)
        taken.extend(PAYMENTS.claim(engine, 1, lease_s=60))
        return Outcome.permanent("http_400", "limits service answered HTTP 400")

    result = run_worker(engine, settings, handler=ScriptedHandler(steal_then_fail))
    assert (result.claimed, result.lost_claims, result.failed, result.done) == (1, 1, 0, 0)
    row = _row(engine, taken[0].id)
    assert (row.status, row.claim_token, row.last_error) == ("PROCESSING", taken[0].token, None)


def test_retry_backoff_then_failed_at_max_attempts(engine: sa.Engine) -> None:
    """A transient failure goes back to NEW after base*2^(n-1); at max attempts it is FAILED with last_error."""
    queue.enqueue(engine, 1, seed=5)
    settings = QueueSettings(max_attempts=3, backoff_base_s=100, backoff_max_s=1000)
    for attempt, expected_delay in ((1, 100), (2, 200)):
        [c] = PAYMENTS.claim(engine, 1, lease_s=60)
        assert c.attempts == attempt
        assert _retry_or_fail(engine, c, f"HTTP 503 #{attempt}", settings, permanent=False) == "NEW"
        with engine.connect() as conn:
            row = conn.execute(
                sa.text("SELECT status, last_error, next_attempt_at - now() AS wait, claim_token FROM payments")
            ).one()
        assert row.status == "NEW" and row.last_error == f"HTTP 503 #{attempt}" and row.claim_token is None
        # The backoff of this attempt, spread by the default jitter (±10%).
        assert expected_delay * 0.9 - 5 < row.wait.total_seconds() <= expected_delay * 1.1
        assert PAYMENTS.claim(engine, 1, lease_s=60) == []  # not due during the backoff
        _make_due(engine)
    [c] = PAYMENTS.claim(engine, 1, lease_s=60)
    assert _retry_or_fail(engine, c, "HTTP 503 #3", settings, permanent=False) == "FAILED"
    row = _row(engine, c.id)
    assert (row.status, row.attempts, row.last_error) == ("FAILED", 3, "HTTP 503 #3")


def test_permanent_failure_is_failed_at_once(engine: sa.Engine) -> None:
    """A permanent outcome fails the payment on its first attempt."""
    queue.enqueue(engine, 1, seed=6)
    [c] = PAYMENTS.claim(engine, 1, lease_s=60)
    assert _retry_or_fail(engine, c, "HTTP 422", QueueSettings(), permanent=True) == "FAILED"
    row = _row(engine, c.id)
    assert (row.status, row.attempts, row.last_error) == ("FAILED", 1, "HTTP 422")


def test_dlq_list_and_replay(engine: sa.Engine) -> None:
    """dlq_list shows FAILED rows; replay by id moves them to NEW (attempts 0, due, last_error kept), reports others."""
    queue.enqueue(engine, 4, seed=8)
    claims = PAYMENTS.claim(engine, 4, lease_s=60)
    for c in claims[:3]:
        _retry_or_fail(engine, c, f"rejected {c.id}", QueueSettings(), permanent=True)
    _complete(engine, claims[3])
    listed = queue.dlq_list(engine)
    assert sorted(d["id"] for d in listed) == sorted(c.id for c in claims[:3])
    assert {d["last_error"] for d in listed} == {f"rejected {c.id}" for c in claims[:3]}
    assert set(listed[0]) >= {"id", "amount_cents", "attempts", "last_error"}
    assert len(queue.dlq_list(engine, limit=2)) == 2
    assert queue.dlq_list(engine, after_id=max(c.id for c in claims[:3])) == []

    unknown = uuid.uuid4()
    replayed = queue.dlq_replay(engine, [claims[0].id, str(claims[3].id), unknown])
    assert replayed == 1
    assert replayed.unknown == (unknown,) and replayed.not_failed == (claims[3].id,)
    row = _row(engine, claims[0].id)
    assert (row.status, row.attempts, row.last_error, row.claim_token) == ("NEW", 0, f"rejected {claims[0].id}", None)
    assert _row(engine, claims[3].id).status == "DONE"

    assert queue.dlq_replay(engine, None) == 2
    assert queue.dlq_list(engine) == []
    assert len(PAYMENTS.claim(engine, 10, lease_s=60)) == 3
    with pytest.raises(ConfigError):
        queue.dlq_replay(engine, ["not-a-uuid"])


def test_queue_stats_counts_by_status_and_stuck(engine: sa.Engine) -> None:
    """queue_stats reports every status, due rows, and PROCESSING rows past their lease."""
    queue.enqueue(engine, 5, seed=9)
    claims = PAYMENTS.claim(engine, 3, lease_s=60)
    _complete(engine, claims[0])
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE payments SET claimed_until = now() - interval '1 minute' WHERE id = :id"),
            {"id": claims[1].id},
        )
    stats = queue.queue_stats(engine)
    assert stats["by_status"] == {"NEW": 2, "PROCESSING": 2, "DONE": 1, "FAILED": 0}
    # due = the 2 NEW rows + the lapsed claim (the payment queue (docs/guide/payment-queue.md)'s due rows); stuck =
    # the lapsed claim.
    assert (stats["total"], stats["due"], stats["stuck_processing"]) == (5, 3, 1)


def test_claim_uses_both_partial_indexes(engine: sa.Engine) -> None:
    """The claim statement can use payments_claim_rank_idx (aging order) and payments_processing_idx, for lapsed
    leases and for rows without one (plan test)."""
    queue.enqueue(engine, 2000, seed=10)
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE payments"))
        conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
        plan = conn.exec_driver_sql(
            "EXPLAIN (FORMAT JSON) " + PAYMENTS.sql.claim,
            {"n": 10, "lease_s": 60.0, "token": uuid.uuid4()},
        ).scalar_one()
    text = str(plan)
    assert "payments_claim_rank_idx" in text
    assert "payments_processing_idx" in text
    # Rows without a lease (claimed_until NULL, the tables (docs/reference/tables.md)) are found on the same index,
    # not by a scan.
    assert "'Index Cond': '(claimed_until IS NULL)'" in text, text


def _lock_rows_inputs(plan: dict) -> list[dict]:
    """The node under each LockRows of a JSON plan, in plan order (the claim's fresh branch comes first)."""
    found = []
    for child in plan.get("Plans", []):
        if plan["Node Type"] == "LockRows":
            found.append(child)
        found.extend(_lock_rows_inputs(child))
    return found


def _explain_claim(engine: sa.Engine, n: int) -> dict:
    """EXPLAIN ANALYZE of a claim of `n` on a connection opened as the worker opens its own (rolled back)."""
    import psycopg

    from batch_assets.db.engine import session_conninfo
    from batch_assets.queue.connection import WORKER_OPTIONS

    with psycopg.connect(session_conninfo(engine, options=WORKER_OPTIONS)) as conn:
        [[plan]] = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + PAYMENTS.sql.claim, {"n": n, "lease_s": 60.0, "token": uuid.uuid4()},
        ).fetchone()
        conn.rollback()  # EXPLAIN ANALYZE ran the claim: give the rows back
    return plan


def _rows_read(node: dict) -> int:
    """Rows a plan node and those under it produced or filtered away (what a claim read)."""
    return (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
            + sum(_rows_read(child) for child in node.get("Plans", [])))


def test_a_bulk_enqueue_leaves_statistics_so_a_claim_reads_one_batch(engine: sa.Engine) -> None:
    """The product's own bulk insert (queue enqueue, seed payments: one COPY) ends with ANALYZE, so the claims that
    follow walk payments_claim_rank_idx in rank order and read about one batch. Without statistics the planner took
    the 20,000 due rows for 91 and read and sorted all of them each claim (130 ms a claim at 100k due)."""
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE payments SET (autovacuum_enabled = false)"))  # no ANALYZE behind our back
    queue.enqueue(engine, 20_000, seed=13)
    plan = _explain_claim(engine, 100)
    fresh = _lock_rows_inputs(plan["Plan"])[0]
    assert (fresh["Node Type"], fresh.get("Index Name")) == ("Index Scan", "payments_claim_rank_idx"), fresh
    assert fresh["Actual Rows"] <= 200, fresh  # one batch (and the rows skipped), not the 20,000 due


def test_a_claim_among_many_rows_not_yet_due_does_not_read_them_all(engine: sa.Engine) -> None:
    """20,000 payments due in an hour (retries in backoff, payments scheduled later) and 50 due now: the claim reads
    the due ones, not every NEW row in rank order (a claim index walk pinned by enable_sort=off read all 20,050:
    26 ms a claim against 2.6 ms at 200k)."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO payments (id, amount_cents, next_attempt_at) "
            "SELECT gen_random_uuid(), 100, now() + interval '1 hour' FROM generate_series(1, 20000)"))
        conn.execute(sa.text("INSERT INTO payments (id, amount_cents) "
                             "SELECT gen_random_uuid(), 100 FROM generate_series(1, 50)"))
        conn.execute(sa.text("ANALYZE payments"))
    plan = _explain_claim(engine, 100)
    fresh = _lock_rows_inputs(plan["Plan"])[0]
    assert _rows_read(fresh) <= 1000, fresh  # the 50 due (and index entries around them), not 20,050 rows


def test_worker_drains_with_simulated_handler(engine: sa.Engine) -> None:
    """The simulated handler settles every payment (DONE or FAILED) and the summary has the contract keys."""
    queue.enqueue(engine, 120, seed=11)
    settings = QueueSettings(batch_size=20, concurrency=4, backoff_base_s=0.001, backoff_max_s=0.001)
    handler = SimulatedHandler(seed=3, failure_rate=0.3, permanent_rate=0.05)
    deadline = time.monotonic() + 60
    totals = {"done": 0, "failed": 0, "retried": 0}
    while _statuses(engine).keys() - {"DONE", "FAILED"} and time.monotonic() < deadline:
        _make_due(engine)
        r = run_worker(engine, settings, handler=handler)
        for k in totals:
            totals[k] += getattr(r, k)
    counts = _statuses(engine)
    assert counts.get("DONE", 0) + counts.get("FAILED", 0) == 120
    assert totals["done"] == counts["DONE"] and totals["failed"] == counts.get("FAILED", 0)
    assert totals["retried"] > 0
    summary = r.to_summary("run-1")
    assert {"status", "run_id", "scanned", "changed", "unchanged", "failed", "failed_by_type", "duration_s"} <= set(
        summary
    )
    assert summary["status"] == "SUCCESS" and summary["run_id"] == "run-1"
    assert summary["dlq_size"] == counts.get("FAILED", 0)


def test_worker_stops_at_max_seconds_and_releases_unstarted_claims(engine: sa.Engine) -> None:
    """max_seconds stops a non-draining worker; claims never started go back to NEW with their attempt undone."""
    queue.enqueue(engine, 30, seed=12)
    settings = QueueSettings(batch_size=30, concurrency=1, poll_interval_s=0.05)
    release_gate = threading.Event()

    def slow(claim: Claim) -> Outcome:
        release_gate.wait(timeout=0.2)  # a slow external call
        return Outcome.done()

    started = time.monotonic()
    result = run_worker(engine, settings, handler=ScriptedHandler(slow), max_seconds=0.5, drain=False)
    elapsed = time.monotonic() - started
    assert result.stopped_by == "max_seconds"
    assert elapsed < 5
    assert 1 <= result.done < 30
    assert result.claimed == 30 and result.released == 30 - result.done
    assert _statuses(engine) == {"DONE": result.done, "NEW": 30 - result.done}
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT max(attempts) FROM payments WHERE status = 'NEW'")).scalar() == 0


def test_worker_stop_event_ends_an_idle_worker(engine: sa.Engine) -> None:
    """A non-draining worker polls an empty queue until the stop event is set."""
    settings = QueueSettings(poll_interval_s=0.05)
    stop = threading.Event()
    out: list[object] = []
    t = threading.Thread(
        target=lambda: out.append(run_worker(engine, settings, handler=SimulatedHandler(), stop=stop, drain=False))
    )
    t.start()
    t.join(timeout=0.3)
    assert t.is_alive()  # idle, still polling
    stop.set()
    t.join(timeout=10)
    assert not t.is_alive()
    assert out[0].stopped_by == "stop" and out[0].claimed == 0


def test_handler_exception_is_a_retry_not_a_stuck_row(engine: sa.Engine) -> None:
    """A handler that raises counts as a retriable failure; the row goes back to NEW with last_error."""
    queue.enqueue(engine, 1, seed=13)

    def boom(claim: Claim) -> Outcome:
        raise RuntimeError("bug")

    result = run_worker(engine, QueueSettings(max_attempts=3), handler=ScriptedHandler(boom))
    assert (result.retried, result.failed) == (1, 0)
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT status, last_error FROM payments")).one()
    assert row.status == "NEW" and "RuntimeError" in row.last_error


def test_reclaimed_past_max_attempts_is_failed_without_a_call(engine: sa.Engine) -> None:
    """A row whose lease lapsed repeatedly beyond max_attempts is FAILED without calling the handler again."""
    queue.enqueue(engine, 1, seed=14)
    for _ in range(3):  # three claims of ours, each lost with its worker
        assert len(PAYMENTS.claim(engine, 1, lease_s=60)) == 1
        _expire_leases(engine)
    handler = ScriptedHandler(lambda c: Outcome.done())
    result = run_worker(engine, QueueSettings(max_attempts=3), handler=handler)
    assert handler.calls == []
    assert result.failed_by_type == {"max_attempts_exceeded": 1}
    assert _statuses(engine) == {"FAILED": 1}


def test_unreachable_database_raises_database_unavailable() -> None:
    """A worker that cannot reach the database stops with DatabaseUnavailable naming the host, not a driver error."""
    from batch_assets.db.engine import create_engine
    from batch_assets.errors import DatabaseUnavailable

    down = create_engine("postgresql+psycopg://postgres:s3cret@127.0.0.1:1/x", pool_size=1)
    try:
        with pytest.raises(DatabaseUnavailable) as info:
            run_worker(down, QueueSettings(), handler=SimulatedHandler())
    finally:
        down.dispose()
    assert "127.0.0.1:1" in str(info.value) and "s3cret" not in str(info.value)


def test_simulated_handler_is_deterministic_per_seed() -> None:
    """The simulated handler's outcome is a function of (seed, payment id, attempt); rates are respected roughly."""
    ids = [uuid.UUID(int=i, version=4) for i in range(1, 2001)]
    a = SimulatedHandler(seed=1, failure_rate=0.2, permanent_rate=0.05)
    b = SimulatedHandler(seed=1, failure_rate=0.2, permanent_rate=0.05)
    outcomes = [a.handle(Claim(i, 1, uuid.uuid4(), values={"amount_cents": 100})).kind for i in ids]
    assert outcomes == [b.handle(Claim(i, 1, uuid.uuid4(), values={"amount_cents": 100})).kind for i in ids]
    counts = {k: outcomes.count(k) for k in set(outcomes)}
    assert 40 < counts[OutcomeKind.PERMANENT] < 170 and 250 < counts[OutcomeKind.RETRY] < 550
    with pytest.raises(ConfigError):
        SimulatedHandler(failure_rate=1.5)
