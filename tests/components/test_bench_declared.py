"""The bench's declared section: the declared form of the customer-status rule computes what the
hand-written plug-in computes, on the same rows, and the section reports both side by side (speed is judged
only by `batch-assets bench`' report, never here)."""

from __future__ import annotations

from datetime import date
from typing import Any

import sqlalchemy as sa

from batch_assets.bench import declared, scratch, sweeps
from batch_assets.reference.customer_status.seed import seed_customers

RUN_DATE = date(2026, 12, 1)


def stored(engine: sa.Engine) -> dict[Any, tuple[Any, Any]]:
    with engine.connect() as conn:
        return {r.id: (r.age_category, r.next_review_date) for r in conn.execute(sa.text(
            "SELECT id, age_category, next_review_date FROM customers WHERE status = 'ACTIVE'"))}


def test_declared_form_computes_what_the_plugin_computes(engine: sa.Engine, cipher: Any) -> None:
    seed_customers(engine, cipher, 3000, run_date=RUN_DATE, seed=17, bad_fraction=0.02)
    scratch.reset_to_first_computation(engine)
    plugin = sweeps.run_sweep(engine, cipher, "full", RUN_DATE, 2)
    by_plugin = stored(engine)
    scratch.reset_to_first_computation(engine)
    form = declared.run_declared(engine, cipher, RUN_DATE, 2)
    by_declared = stored(engine)
    assert form["scanned"] == plugin["scanned"] == 3000
    assert form["failed"] == plugin["failed"] > 0, "the same rows fail, as RowFailure of the same kinds"
    for kind in ("missing_data", "decrypt_failure", "invalid_value"):
        assert form["failed_by_type"].get(kind, 0) == plugin["failed_by_type"].get(kind, 0), kind
    computed = {k: v for k, v in by_plugin.items() if v[0] is not None}
    assert computed and all(by_declared[k] == v for k, v in computed.items()), "the same category and date"
    again = declared.run_declared(engine, cipher, RUN_DATE, 2)
    assert again["changed"] == 0 and again["unchanged"] == 3000 - again["failed"]


def test_the_bench_section_reports_both_forms(engine: sa.Engine, cipher: Any) -> None:
    seed_customers(engine, cipher, 1500, run_date=RUN_DATE, seed=18)
    lines: list[str] = []
    section = declared.measure(engine, scratch.StatementCounter(engine), cipher, RUN_DATE, 2, lines.append)
    for phase in ("first_computation", "steady_state"):
        plugin, form = section[f"plugin_{phase}"], section[f"declared_{phase}"]
        assert plugin["scanned"] == form["scanned"] == 1500
        assert section[f"ratio_{phase}"] == round(form["sweep_s"] / plugin["sweep_s"], 3)
    assert section["declared_first_computation"]["changed"] == 1500
    assert section["declared_steady_state"]["changed"] == 0
    assert section["declared_first_computation"]["data_statements_per_page"] <= 2, "one read + one write per page"
    assert isinstance(section["within_1_15x"], bool) and len(lines) == 6


def test_a_reset_gives_every_first_computation_the_table_the_seeding_left(engine: sa.Engine, cipher: Any) -> None:
    """After a first computation, the bench's reset leaves nothing computed, no event, and the table and its indexes
    no larger than after the seeding (a plain UPDATE + VACUUM left them about twice as large, so each later
    scenario read a table half made of free space)."""
    sizes = sa.text("SELECT pg_relation_size('customers'), pg_indexes_size('customers')")
    seed_customers(engine, cipher, 20_000, run_date=RUN_DATE, seed=18)
    scratch.vacuum(engine)
    with engine.connect() as conn:
        heap, indexes = conn.execute(sizes).one()
    sweeps.run_sweep(engine, cipher, "full", RUN_DATE, 2)
    with engine.connect() as conn:
        assert conn.execute(sizes).one()[0] > heap, "the first computation wrote a new version of every row"
    filenode = sa.text("SELECT pg_relation_filenode('customers')")
    with engine.connect() as conn:
        before_reset = conn.execute(filenode).scalar_one()
    scratch.reset_to_first_computation(engine)
    # Any transaction older than the sweep's writes, in any database of the server (another test's 1M-row INSERT
    # in the gate), makes VACUUM FULL keep every old version: measured, heap 2.0 -> 6.3 MB beside one. So the
    # rewrite itself is checked always, and the sizes when no other backend held a transaction id or snapshot.
    with engine.connect() as conn:
        holders = conn.exec_driver_sql(
            "SELECT datname, backend_type, backend_xid, backend_xmin, left(query, 60) FROM pg_stat_activity "
            "WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()").all()
        assert conn.execute(filenode).scalar_one() != before_reset, "the reset rewrote the table (VACUUM FULL)"
        assert conn.execute(sa.text("SELECT count(*) FROM outbox_events")).scalar_one() == 0
        after_heap, after_indexes = conn.execute(sizes).one()
    assert set(stored(engine).values()) == {(None, None)}
    if not holders:
        assert after_heap <= heap * 1.02 and after_indexes <= indexes * 1.02, (heap, after_heap, indexes,
                                                                             after_indexes)
