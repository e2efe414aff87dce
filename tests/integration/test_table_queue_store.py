"""The generic queue's store on a declared table (not payments): bigint keys, priorities with aging, fencing.

Real PostgreSQL; the table is the notifications example's, installed by the store itself (`install`, as `db
migrate` does), and every statement is the one the worker runs."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from batch_assets.errors import ConfigError
from batch_assets.queue.claims import Result, planned_result
from batch_assets.queue.declaration import QueueDeclaration
from batch_assets.queue.store import QueueStore

pytestmark = pytest.mark.integration

SCHEMA = Path(__file__).resolve().parents[2] / "examples" / "notifications" / "schema.sql"


def _declared(engine: sa.Engine, *, priority: str | None = "priority") -> QueueStore:
    with engine.begin() as conn:
        conn.exec_driver_sql(SCHEMA.read_text())
    declaration = QueueDeclaration(name="notifications", table="notifications", key="id",
                                   columns=["id", "recipient"], handler="x:y", priority=priority)
    store = declaration.checked_store(engine)
    with engine.begin() as conn:
        store.install(conn)
        store.install(conn)  # safe to run again
    return store


def _insert(engine: sa.Engine, *rows: tuple[str, int, int]) -> None:
    """(recipient, priority, seconds due) rows."""
    with engine.begin() as conn:
        for recipient, priority, due_s in rows:
            conn.execute(sa.text("INSERT INTO notifications (recipient, body, priority, next_attempt_at) "
                                 "VALUES (:r, 'b', :p, now() - make_interval(secs => :s))"),
                         {"r": recipient, "p": priority, "s": due_s})


def test_key_type_is_read_and_claims_follow_priority_with_aging(engine: sa.Engine) -> None:
    """A bigint key; higher priority first, but a row due for 10 min at 0 beats a fresh one at 5; the claim is an
    index scan on the claim-rank index."""
    store = _declared(engine)
    assert store.spec.key_type == "bigint"
    _insert(engine, ("fresh-low", 0, 1), ("fresh-high", 5, 1), ("old-low", 0, 600))
    order = [store.claim(engine, 1, lease_s=60)[0].values["recipient"] for _ in range(3)]
    assert order == ["old-low", "fresh-high", "fresh-low"]
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = conn.exec_driver_sql("EXPLAIN " + store.sql.claim, {"n": 10, "lease_s": 60.0,
                                                                   "token": uuid.uuid4()}).all()
    assert "ba_q_notifications_claim_rank_idx" in "\n".join(r[0] for r in plan)


def test_without_priority_the_oldest_due_goes_first(engine: sa.Engine) -> None:
    store = _declared(engine, priority=None)
    _insert(engine, ("second", 9, 10), ("first", 0, 20))
    assert [store.claim(engine, 1, lease_s=60)[0].values["recipient"] for _ in range(2)] == ["first", "second"]


def test_results_are_fenced_and_the_dlq_replays(engine: sa.Engine) -> None:
    """A lapsed claim taken over: the old owner's write matches nothing; FAILED rows list and replay by int id."""
    store = _declared(engine)
    _insert(engine, ("a@example.com", 0, 1))
    [old] = store.claim(engine, 1, lease_s=60)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE notifications SET claimed_until = now() - interval '1 second'")
    [new] = store.claim(engine, 1, lease_s=60)
    assert (new.id, new.attempts) == (old.id, 2)
    assert store.write_results(engine, [Result(old, "DONE")]) == []
    failed = planned_result(new, store_settings(), permanent=True)
    assert store.write_results(engine, [Result(new, failed.status, error="bounced")]) != []
    [item] = store.dlq_list(engine)
    assert (item["id"], item["recipient"], item["last_error"]) == (new.id, "a@example.com", "bounced")
    assert store.dlq_replay(engine, [str(new.id)]) == 1
    assert store.stats(engine)["by_status"]["NEW"] == 1
    with pytest.raises(ConfigError, match="whole number"):
        store.dlq_replay(engine, ["not-a-number"])


def test_a_table_lacking_a_column_is_refused(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(SCHEMA.read_text().replace("last_error      text NULL,", ""))
    declaration = QueueDeclaration(name="notifications", table="notifications", key="id", columns=["id"],
                                   handler="x:y")
    with pytest.raises(ConfigError, match="lacks column last_error") as info:
        declaration.checked_store(engine)
    assert info.value.field == "last_error"


def store_settings():  # noqa: ANN201 — the declaration's defaults
    return QueueDeclaration(name="n", table="t", key="id", columns=["id"], handler="x:y").settings()
