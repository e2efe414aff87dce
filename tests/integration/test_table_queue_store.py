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


def _columns(engine: sa.Engine, table: str) -> dict[str, str]:
    with engine.connect() as conn:
        return {str(name): str(kind) for name, kind in conn.exec_driver_sql(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%(t)s) AND attnum > 0 AND NOT attisdropped", {"t": table})}


def _claim_and_finish(engine: sa.Engine, store: QueueStore) -> None:
    """A claim taken over after its lease passed: the old owner's write is fenced out, the new one's goes in."""
    _insert(engine, ("a@example.com", 0, 1))
    [old] = store.claim(engine, 1, lease_s=60)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE notifications SET claimed_until = now() - interval '1 second'")
    [new] = store.claim(engine, 1, lease_s=60)
    assert store.write_results(engine, [Result(old, "DONE")]) == []
    assert len(store.write_results(engine, [Result(new, "DONE")])) == 1


def test_a_declared_queue_adds_a_token_column_of_its_own_name(engine: sa.Engine) -> None:
    """The token column db migrate adds to a declared queue's table is ba_claim_token, and claims are fenced on it."""
    store = _declared(engine)
    assert store.spec.token_column == "ba_claim_token"
    columns = _columns(engine, "notifications")
    assert columns["ba_claim_token"] == "uuid" and "claim_token" not in columns
    _claim_and_finish(engine, store)


def test_a_claim_token_column_of_the_tables_own_is_left_alone(engine: sa.Engine) -> None:
    """A table with a `claim_token` of its own (another type, with values): the queue installs and fences on its
    ba_claim_token, and never writes the table's column."""
    with engine.begin() as conn:
        conn.exec_driver_sql(SCHEMA.read_text())
        conn.exec_driver_sql("ALTER TABLE notifications ADD COLUMN claim_token text DEFAULT 'theirs'")
    store = _declared(engine)
    assert store.spec.token_column == "ba_claim_token"
    assert _columns(engine, "notifications")["claim_token"] == "text"
    _claim_and_finish(engine, store)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT array_agg(DISTINCT claim_token) FROM notifications").scalar() == ["theirs"]


def test_a_queue_installed_by_an_earlier_release_keeps_its_claim_token(engine: sa.Engine) -> None:
    """A table an earlier release installed the queue on (its `claim_token` uuid column and the queue's trigger):
    the queue keeps fencing on that column, so claims in flight across the upgrade stay fenced, and no second
    token column is added."""
    with engine.begin() as conn:
        conn.exec_driver_sql(SCHEMA.read_text())
    declaration = QueueDeclaration(name="notifications", table="notifications", key="id",
                                   columns=["id", "recipient"], handler="x:y", priority="priority")
    earlier = QueueStore(declaration.spec().with_token_column("claim_token").with_key_type("bigint"))
    with engine.begin() as conn:
        earlier.install(conn)
    _insert(engine, ("in-flight@example.com", 0, 1))
    [in_flight] = earlier.claim(engine, 1, lease_s=60)

    store = declaration.checked_store(engine)
    assert store.spec.token_column == "claim_token"
    with engine.begin() as conn:
        store.install(conn)
    assert "ba_claim_token" not in _columns(engine, "notifications")
    assert len(store.write_results(engine, [Result(in_flight, "DONE")])) == 1


def store_settings():  # noqa: ANN201 — the declaration's defaults
    return QueueDeclaration(name="n", table="t", key="id", columns=["id"], handler="x:y").settings()
