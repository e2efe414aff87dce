"""The declared sweep on the engine (docs/reference/declarations.md): only declared columns, exactly the `writes`,
RowFailure vs
compute_error, unchanged rows not written, compare-and-set writes with conflicts counted, sensitive values never
shown, events without them, delta by `due`.

Every test runs the real engine on its own database with the README example's table.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import write_module

from batch_assets.engine.definition import RunContext
from batch_assets.engine.ranges import CursorRange
from batch_assets.engine.result import SweepResult
from batch_assets.engine.runner import run_sweep
from batch_assets.engine.settings import SweepSettings
from batch_assets.orchestration.components.sweep_component import SweepComponent

RUN_DATE = date(2026, 12, 1)
LOYALTY = {
    "name": "loyalty_tier", "table": "accounts", "key": "id", "columns": ["id", "points", "tier", "tier_review_on"],
    "where": "status = 'OPEN'", "due": "tier_review_on", "compute": "tiers:compute",
    "writes": ["tier", "tier_review_on"], "sensitive": ["points"], "event": "tier_changed",
}


@pytest.fixture
def example_functions(functions: Path) -> Path:
    """The README example's own tiers.py."""
    source = (Path(__file__).resolve().parents[2] / "examples" / "loyalty" / "tiers.py").read_text()
    write_module(functions, "tiers", source)
    return functions


def component(**overrides: Any) -> SweepComponent:
    return SweepComponent.from_attributes_dict(attributes={**LOYALTY, **overrides})


def write_meddling(functions: Path, name: str, url: str, edits: dict[str, str], tier: str) -> None:
    """A compute module `name` that, for each row whose id is a key of `edits`, runs that statement (`:id` bound to
    the row's id) on another connection before returning its result: the row changes between read and write."""
    write_module(functions, name, f"""
        import sqlalchemy as sa
        _engine = sa.create_engine({url!r}, poolclass=sa.pool.NullPool)
        EDITS = {edits!r}

        def compute(row, run_date):
            edit = EDITS.get(str(row["id"]))
            if edit:
                with _engine.begin() as conn:
                    conn.execute(sa.text(edit), {{"id": row["id"]}})
            return {{"tier": {tier!r}, "tier_review_on": run_date}}
    """)


def sweep(engine: sa.Engine, declared: SweepComponent, mode: str = "full", *, run_date: date = RUN_DATE,
          cursor_range: CursorRange | None = None, **settings: Any) -> SweepResult:
    target = declared.target(engine)
    from batch_assets.engine.table_sweep import DeclaredSweep

    definition = DeclaredSweep(target, mode, run_date)
    values = {"page_size": 100, "workers": 2, **settings}
    return run_sweep(engine, definition, SweepSettings(**values), RunContext("run-1", mode, run_date),
                     cursor_range=cursor_range or CursorRange.whole(target.kind))


def expected_tier(points: int) -> str:
    return "GOLD" if points >= 10_000 else "SILVER" if points >= 1_000 else "BRONZE"


def rows(engine: sa.Engine, where: str = "TRUE") -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(f"SELECT id, status, points, tier, tier_review_on FROM accounts "  # noqa: S608
                                         f"WHERE {where} ORDER BY id")))


def test_full_then_again_then_delta(accounts: sa.Engine, example_functions: Path) -> None:
    declared = component()
    first = sweep(accounts, declared)
    assert first.status == "SUCCESS", first.stopped_reason
    assert (first.scanned, first.changed, first.failed) == (1000, 999, 1)
    assert first.failed_by_type["missing_points"] == 1 and first.conflicts == 0
    for row in rows(accounts, "status = 'OPEN' AND points IS NOT NULL"):
        assert row.tier == expected_tier(row.points) and row.tier_review_on == RUN_DATE + timedelta(days=30)
    [missing] = rows(accounts, "points IS NULL")
    assert missing.tier is None and missing.tier_review_on is None, "a RowFailure row is not written: still due"
    assert all(r.tier is None for r in rows(accounts, "status = 'CLOSED'")), "rows outside `where` are never read"
    with accounts.connect() as conn:
        events = [r.payload for r in conn.execute(sa.text(
            "SELECT payload FROM outbox_events WHERE event_type = 'tier_changed'"))]
    assert len(events) == 999
    assert set(events[0]) == {"table", "key", "old", "new"} and set(events[0]["new"]) == {"tier", "tier_review_on"}
    assert all("points" not in json.dumps(e) for e in events), "a sensitive column is never in an event"

    again = sweep(accounts, declared)
    assert (again.changed, again.unchanged, again.failed) == (0, 999, 1), "results equal to what is stored"

    delta = sweep(accounts, declared, "delta", run_date=RUN_DATE + timedelta(days=1))
    assert (delta.scanned, delta.changed, delta.failed) == (1, 0, 1), "only the due row (the failed one) is read"
    later = sweep(accounts, declared, "delta", run_date=RUN_DATE + timedelta(days=30))
    assert later.scanned == 1000 and later.changed == 999


def test_ranges_of_a_full_run_cover_every_row_once(accounts: sa.Engine, example_functions: Path) -> None:
    from batch_assets.engine.ranges import plan_ranges

    declared = component()
    with accounts.connect() as conn:
        ranges = plan_ranges(conn, table="accounts", schema="public", key="id", kind="uuid", count=4,
                             where="status = 'OPEN'")
    results = [sweep(accounts, declared, cursor_range=r) for r in ranges]
    assert len(ranges) == 4 and sum(r.scanned for r in results) == 1000
    assert sum(r.changed for r in results) == 999


def test_another_connection_edits_rows_while_the_sweep_runs(accounts: sa.Engine, functions: Path) -> None:
    """The function itself edits its row (points, then status) from another connection before returning: the
    write must not apply (conflict, counted, row left due) and must not write its event."""
    url = accounts.url.render_as_string(hide_password=False)
    with accounts.connect() as conn:
        victims = [str(v) for v in conn.execute(sa.text(
            "SELECT id FROM accounts WHERE status = 'OPEN' AND points IS NOT NULL ORDER BY id LIMIT 2")).scalars()]
    write_meddling(functions, "meddling", url, {victims[0]: "UPDATE accounts SET points = points + 1 WHERE id = :id",
                                                victims[1]: "UPDATE accounts SET status = 'CLOSED' WHERE id = :id"},
                   tier="BRONZE")
    result = sweep(accounts, component(compute="meddling:compute"))
    assert result.status == "SUCCESS"
    assert result.conflicts == 2 and result.changed == 998 + 0, result
    for victim in rows(accounts, f"id IN ('{victims[0]}', '{victims[1]}')"):
        assert victim.tier is None and victim.tier_review_on is None, "an edited row is left as the writer left it"
    with accounts.connect() as conn:
        keys = set(conn.execute(sa.text("SELECT payload->>'key' FROM outbox_events")).scalars())
    assert not keys & set(victims), "no event for a row that was not written"


def test_hostile_functions(accounts: sa.Engine, functions: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_module(functions, "hostile", """
        from batch_assets import RowFailure

        def raises(row, run_date):
            raise KeyError("secret " + str(row["points"]))

        def wrong_keys(row, run_date):
            return {"tier": "GOLD", "points": 1}

        def not_a_mapping(row, run_date):
            return ["GOLD", run_date]

        def extra_key(row, run_date):
            return {"tier": "GOLD", "tier_review_on": run_date, "points": 1}

        def missing_key(row, run_date):
            return {"tier": "GOLD"}

        def read_only_mapping(row, run_date):  # a Mapping that is not a dict: as good as a dict
            import types
            return types.MappingProxyType({"tier": "PROXY", "tier_review_on": run_date})

        def bad_kind(row, run_date):
            raise RowFailure("Not A Word!")

        def some_fail(row, run_date):
            if row["points"] is not None and row["points"] % 2:
                raise RowFailure("odd_points")
            return {"tier": "X", "tier_review_on": run_date}
    """)
    caplog.set_level(logging.DEBUG, logger="batch_assets")
    for name in ("raises", "wrong_keys", "not_a_mapping", "extra_key", "missing_key"):
        result = sweep(accounts, component(compute=f"hostile:{name}"), breaker_min_rows=10_000_000)
        assert result.failed_by_type.get("compute_error") == 1000, (name, result.failed_by_type)
        assert result.changed == 0 and result.status == "SUCCESS"
    bad_kind = sweep(accounts, component(compute="hostile:bad_kind"))
    assert bad_kind.status == "SUCCESS", "an invalid kind is the row's own failure: it never trips the breaker"
    assert bad_kind.failed_by_type["invalid_failure_kind"] == 1000 == bad_kind.failed, \
        "a RowFailure whose kind is no word is still the row's own failure, counted under a name of the product's own"
    tripped = sweep(accounts, component(compute="hostile:raises"))
    assert tripped.status == "FAILURE" and "breaker" in (tripped.stopped_reason or ""), "compute_error is systemic"

    data = sweep(accounts, component(compute="hostile:some_fail"))
    assert data.status == "SUCCESS", "RowFailure is the row's own data: it never trips the breaker"
    odd = len([r for r in rows(accounts, "status = 'OPEN' AND points IS NOT NULL") if r.points % 2])
    assert data.failed_by_type["odd_points"] == odd > 100 and data.changed == 1000 - odd
    assert all(r.tier is None for r in rows(accounts, "status = 'OPEN' AND mod(points, 2) = 1"))
    shown = caplog.text
    assert "compute raised KeyError" in shown, "the failure is logged by its type and row key"
    assert "secret" not in shown, \
        "no value of a sensitive column (nor an exception's text, which may hold one) is logged"
    proxied = sweep(accounts, component(compute="hostile:read_only_mapping"))
    assert proxied.status == "SUCCESS" and proxied.changed == 1000 and not any(proxied.failed_by_type.values())


def test_integer_and_bigint_keys_and_a_sensitive_due(engine: sa.Engine, functions: Path) -> None:
    write_module(functions, "scores", """
        def compute(row, run_date):
            return {"score": row["raw"] * 2, "next_on": run_date}
    """)
    for kind in ("integer", "bigint"):
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS scored"))
            conn.execute(sa.text(f"CREATE TABLE scored (id {kind} PRIMARY KEY, raw int, score int, next_on date)"))
            conn.execute(sa.text("INSERT INTO scored (id, raw) SELECT g * 7, g FROM generate_series(1, 500) AS g"))
        declared = SweepComponent.from_attributes_dict(attributes={
            "name": "scores", "table": "public.scored", "key": "id", "columns": ["id", "raw", "score", "next_on"],
            "due": "next_on", "compute": "scores:compute", "writes": ["score", "next_on"],
            "sensitive": ["next_on"], "event": "score_changed"})
        delta = sweep(engine, declared, "delta")
        assert (delta.scanned, delta.changed) == (500, 500), kind
        assert delta.last_cursor == {"after_key": 3500}, "a sensitive due date is never a cursor"
        full = sweep(engine, declared, "full", run_date=RUN_DATE + timedelta(days=1))
        assert full.changed == 500 and full.last_cursor == 3500
        with engine.connect() as conn:
            payloads = list(conn.execute(sa.text("SELECT aggregate_id, payload FROM outbox_events "
                                                 "WHERE event_type = 'score_changed'")))
            assert conn.execute(sa.text("SELECT count(*) FROM scored WHERE score = raw * 2")).scalar_one() == 500
            conn.execute(sa.text("DELETE FROM outbox_events"))
            conn.commit()
        assert len(payloads) == 1000 and all(isinstance(p.aggregate_id, uuid.UUID) for p in payloads)
        assert all("next_on" not in p.payload["new"] for p in payloads) and payloads[0].payload["new"]["score"]


def test_a_stopped_run_resumes_from_its_checkpoint_with_integer_keys(engine: sa.Engine, functions: Path) -> None:
    """The low watermark of an integer key goes through the checkpoint table as JSON and back: a run stopped
    halfway (the stop event set by the function itself after 300 rows) resumes after its last finished page."""
    import threading

    from batch_assets.engine.table_sweep import DeclaredSweep
    from batch_assets.locking.checkpoint import CheckpointStore

    write_module(functions, "stopper", """
        import threading
        STOP = threading.Event()
        SEEN = []

        def compute(row, run_date):
            SEEN.append(row["id"])
            if len(SEEN) == 300:
                STOP.set()
            return {"score": row["raw"] + 1}
    """)
    import stopper  # type: ignore[import-not-found]

    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE scored (id bigint PRIMARY KEY, raw int, score int)"))
        conn.execute(sa.text("INSERT INTO scored (id, raw) SELECT g * 10, g FROM generate_series(1, 1000) AS g"))
    declared = SweepComponent.from_attributes_dict(attributes={
        "name": "scored_full", "table": "scored", "key": "id", "columns": ["id", "raw", "score"],
        "compute": "stopper:compute", "writes": ["score"]})
    target = declared.target(engine)
    store = CheckpointStore(engine)
    settings = SweepSettings(page_size=50, workers=1, window=1, checkpoint_every_s=0.001)
    ctx = RunContext("run-1", "full", RUN_DATE, fingerprint="f")
    first = run_sweep(engine, DeclaredSweep(target, "full", RUN_DATE), settings, ctx, checkpoints=store,
                      stop=stopper.STOP, cursor_range=CursorRange.whole("bigint"))
    assert first.status == "FAILURE" and first.stopped_reason == "stop requested"
    assert 300 <= first.scanned < 1000 and isinstance(first.last_cursor, int)
    second = run_sweep(engine, DeclaredSweep(target, "full", RUN_DATE), settings, ctx, checkpoints=store,
                       stop=threading.Event(), cursor_range=CursorRange.whole("bigint"))
    assert second.status == "SUCCESS" and second.resumed_from == first.last_cursor
    assert first.scanned + second.scanned == 1000, "resumed after the low watermark: no row read twice"
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM scored WHERE score = raw + 1")).scalar_one() == 1000


def test_a_result_of_the_wrong_type_is_counted_never_cast(engine: sa.Engine, functions: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A value whose Python type does not fit its column is `invalid_result` (systemic), nothing written: an int for
    text, a str or a bool for an integer, a datetime for a date, a str for a uuid. The right types are written."""
    write_module(functions, "typed", """
        import datetime, uuid

        RIGHT = {"label": "x", "score": 3, "on_date": datetime.date(2026, 1, 1), "ref": uuid.UUID(int=1),
                 "amount": 1.5, "flag": True, "tags": {"any": "json"}}

        def with_(**wrong):
            return lambda row, run_date: {**RIGHT, **wrong}

        right = with_()
        int_for_text = with_(label=7)
        str_for_integer = with_(score="7")
        bool_for_integer = with_(score=True)
        datetime_for_date = with_(on_date=datetime.datetime(2026, 1, 1, 12))
        str_for_uuid = with_(ref=str(uuid.UUID(int=1)))
        int_for_bool = with_(flag=1)
        str_for_numeric = with_(amount="1.5")
    """)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE typed (id integer PRIMARY KEY, label text, score bigint, on_date date, "
                             "ref uuid, amount numeric(10, 2), flag boolean, tags jsonb)"))
        conn.execute(sa.text("INSERT INTO typed (id) SELECT g FROM generate_series(1, 200) AS g"))

    def declared(function: str) -> SweepComponent:
        return SweepComponent.from_attributes_dict(attributes={
            "name": "typed", "table": "typed", "key": "id",
            "columns": ["id", "label", "score", "on_date", "ref", "amount", "flag", "tags"],
            "compute": f"typed:{function}", "writes": ["label", "score", "on_date", "ref", "amount", "flag", "tags"]})

    caplog.set_level(logging.WARNING, logger="batch_assets")
    for wrong in ("int_for_text", "str_for_integer", "bool_for_integer", "datetime_for_date", "str_for_uuid",
                  "int_for_bool", "str_for_numeric"):
        result = sweep(engine, declared(wrong), breaker_min_rows=10_000_000)
        assert result.failed_by_type.get("invalid_result") == 200 and result.changed == 0, (wrong, result)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM typed WHERE label IS NOT NULL")).scalar_one() == 0
    assert "int for label (text)" in caplog.text and "'7'" not in caplog.text, "named by type, never by value"
    tripped = sweep(engine, declared("int_for_text"))
    assert tripped.status == "FAILURE" and "breaker" in (tripped.stopped_reason or ""), "invalid_result is systemic"
    right = sweep(engine, declared("right"))
    assert right.status == "SUCCESS" and right.changed == 200, right
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT label, score, on_date, amount, flag FROM typed WHERE id = 1")).one()
    assert tuple(row) == ("x", 3, date(2026, 1, 1), Decimal("1.50"), True)


def test_where_selects_and_the_values_read_fence(accounts: sa.Engine, functions: Path) -> None:
    """`where` is never part of the page write: a row whose `where` subquery no longer holds when it is written (its
    entry in another table deleted meanwhile) is written from the values its own columns held; a column of the table
    `where` names (status) is read and fenced like a declared one."""
    from batch_assets.engine.table_sweep import DeclaredSweep

    url = accounts.url.render_as_string(hide_password=False)
    with accounts.begin() as conn:
        conn.execute(sa.text("CREATE TABLE vip (account_id uuid PRIMARY KEY)"))
        conn.execute(sa.text("INSERT INTO vip SELECT id FROM accounts WHERE status = 'OPEN' AND points IS NOT NULL "
                             "ORDER BY id LIMIT 20"))
        victims = [str(v) for v in conn.execute(sa.text("SELECT account_id FROM vip ORDER BY account_id LIMIT 2"))
                   .scalars()]
    write_meddling(functions, "unvip", url, {victims[0]: "DELETE FROM vip WHERE account_id = :id",
                                             victims[1]: "UPDATE accounts SET status = 'CLOSED' WHERE id = :id"},
                   tier="VIP")
    where = "status = 'OPEN' AND id IN (SELECT account_id FROM vip)"
    declared = component(compute="unvip:compute", where=where)
    result = sweep(accounts, declared)
    assert result.status == "SUCCESS" and result.scanned == 20, result
    assert (result.changed, result.conflicts) == (19, 1), result
    [left, written] = [rows(accounts, f"id = '{victims[1]}'")[0], rows(accounts, f"id = '{victims[0]}'")[0]]
    assert left.tier is None and written.tier == "VIP"
    write = DeclaredSweep(declared.target(accounts), "full", RUN_DATE)._sql["write"].text  # noqa: SLF001
    assert "vip" not in write and "OPEN" not in write, "where is never pasted into the write"


def test_a_where_column_without_equality_is_read_but_not_fenced(engine: sa.Engine, functions: Path) -> None:
    """`where` on a point column (no `=` for points): the sweep selects by it and writes every row it read."""
    write_module(functions, "places", """
        def compute(row, run_date):
            return {"label": "near"}
    """)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE places (id integer PRIMARY KEY, spot point NOT NULL, label text)"))
        conn.execute(sa.text("INSERT INTO places SELECT g, point(g, g), NULL FROM generate_series(1, 100) AS g"))
    declared = SweepComponent.from_attributes_dict(attributes={
        "name": "places", "table": "places", "key": "id", "columns": ["id", "label"],
        "where": "spot <@ box '((0,0),(40,40))'", "compute": "places:compute", "writes": ["label"]})
    result = sweep(engine, declared)
    assert result.status == "SUCCESS" and (result.scanned, result.changed, result.failed) == (40, 40, 0), result
