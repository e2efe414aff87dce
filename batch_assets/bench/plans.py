"""`EXPLAIN (FORMAT JSON)` of the product's own hot queries, asserting index scans.

The delta and full-page reads are explained in the reader's session (the plan
pin the engine sets on its reader connection) on the bench's freshly analysed
1M-row table; the payment claim on a table of NEW payments. A plan passes when
the query's table is reached only through indexes, never by a sequential scan:
an Index Scan or Index Only Scan, or, where the rows are looked up by a list of
keys (the claim's `id = ANY(ARRAY(...))`), a Bitmap Heap Scan fed by a Bitmap
Index Scan. A keyset read must also get its order from the index: no Sort node
(a sort on every page would make a whole sweep quadratic).
"""

from __future__ import annotations

import re
import uuid
from datetime import date
from typing import Any

import sqlalchemy as sa

INDEX_NODES = ("Index Scan", "Index Only Scan")
CLAIM_SAMPLE_PAYMENTS = 100_000
"""NEW payments on the table while the claim is explained (then removed): a real backlog. On a small
table (20k rows) a sequential scan of `payments` for the outer UPDATE is legitimately cheaper."""


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(_nodes(child))
    return out


def verdict(name: str, table: str, plan_json: Any, *, keyset: bool = False) -> dict[str, Any]:
    """Summarise one plan: the scans on `table`, the indexes used, and whether it passes."""
    root = plan_json[0]["Plan"]
    nodes = _nodes(root)
    # Scan nodes only: the ModifyTable node of an UPDATE names the table too.
    scans = [n for n in nodes if n.get("Relation Name") == table and n["Node Type"].endswith("Scan")]
    indexed, indexes, other = [], set(), set()
    for scan in scans:
        if scan["Node Type"] in INDEX_NODES:
            indexed.append(scan)
            indexes.add(scan.get("Index Name", ""))
        elif scan["Node Type"] == "Bitmap Heap Scan":
            bitmap = [n.get("Index Name", "") for n in _nodes(scan)[1:] if n["Node Type"] == "Bitmap Index Scan"]
            if bitmap:
                indexed.append(scan)
                indexes.update(bitmap)
            else:
                other.add(scan["Node Type"])
        else:
            other.add(scan["Node Type"])
    sorted_page = keyset and any(n["Node Type"] in ("Sort", "Incremental Sort") for n in nodes)
    if sorted_page:
        other.add("Sort")
    return {
        "query": name,
        "table": table,
        "index_scan": bool(indexed) and not other,
        "indexes": sorted(indexes),
        "other_scans": sorted(other),
        "top_node": root["Node Type"],
        "total_cost": root.get("Total Cost"),
    }


def _explain(conn: sa.Connection, statement: str | sa.TextClause, params: dict[str, Any]) -> Any:
    # EXPLAIN without ANALYZE plans the statement and runs nothing (the claim is an UPDATE).
    if isinstance(statement, sa.TextClause):
        return conn.execute(sa.text("EXPLAIN (FORMAT JSON) " + statement.text), params).scalar_one()
    return conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, params).scalar_one()


def explain_sweep_reads(engine: sa.Engine, run_date: date) -> list[dict[str, Any]]:
    """The delta and full-page reads, as the engine's reader sends them."""
    from batch_assets.engine.page_reader import PIN_READ_PLAN_SQL
    from batch_assets.reference.customer_status import sql
    from batch_assets.reference.customer_status.sweep import MAX_VALUE_BYTES

    with engine.connect() as conn:
        middle = conn.exec_driver_sql(
            "SELECT id FROM customers WHERE status = 'ACTIVE' ORDER BY id OFFSET 1000 LIMIT 1"
        ).scalar()
        after = middle or uuid.UUID(int=0)
        conn.exec_driver_sql(PIN_READ_PLAN_SQL)  # the reader's session; this connection is discarded below
        lowest, highest = uuid.UUID(int=0), uuid.UUID(int=2**128 - 1)
        page = {"limit": 1000, "max_value_bytes": MAX_VALUE_BYTES}
        reads = [
            ("delta first page", sql.DELTA_FIRST_PAGE, {"run_date": run_date, **page}),
            ("delta next page", sql.DELTA_AFTER_PAGE,
             {"run_date": run_date, "after_date": "-infinity", "after_id": after, **page}),
            ("full first page", sql.FULL_FIRST_PAGE, {"lo": lowest, "hi": highest, **page}),
            ("full next page", sql.FULL_AFTER_PAGE, {"after": after, "hi": highest, **page}),
        ]
        checks = [verdict(name, "customers", _explain(conn, statement, params), keyset=True)
                  for name, statement, params in reads]
        conn.invalidate()  # never hand the pinned session back to the pool
    return checks


# Values for the claim statement's bound parameters, by name.
CLAIM_PARAMS: dict[str, Any] = {"n": 100, "limit": 100, "batch_size": 100, "lease_s": 30.0,
                                "aging_s": 60.0, "aging_interval_s": 60.0}


def explain_claim(engine: sa.Engine) -> dict[str, Any]:
    """The payment claim on CLAIM_SAMPLE_PAYMENTS NEW payments (removed afterwards)."""
    from batch_assets.reference.payments import sql as payment_sql
    from batch_assets.reference.payments.seed import copy_payments

    claim = payment_sql.CLAIM
    # The claim is a sa.text() with :name parameters, or a driver string with %(name)s ones.
    text = claim if isinstance(claim, str) else claim.text
    names = re.findall(r"%\((\w+)\)s", text) if isinstance(claim, str) else list(claim.compile().params)
    params: dict[str, Any] = {}
    for name in names:
        if name == "token":
            params[name] = uuid.uuid4()
        elif name in CLAIM_PARAMS:
            params[name] = CLAIM_PARAMS[name]
        else:
            return {"query": "payment claim", "table": "payments", "index_scan": False,
                    "error": f"no bench value for the claim's parameter {name!r}"}
    copy_payments(engine, CLAIM_SAMPLE_PAYMENTS, seed=7)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE payments")
            if isinstance(claim, str):
                plan = _explain(conn, claim, params)
            else:
                plan = conn.execute(sa.text("EXPLAIN (FORMAT JSON) " + text), params).scalar_one()
        return verdict("payment claim", "payments", plan)
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql("TRUNCATE payments")
