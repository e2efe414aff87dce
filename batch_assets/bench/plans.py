"""`EXPLAIN (FORMAT JSON)` of the product's own hot queries, asserting index scans.

The delta and full-page reads are explained in the reader's session (the plan
pin the engine sets on its reader connection) on the bench's freshly analysed
1M-row table; the payment claim on a table of NEW payments. A plan passes when
the query's table is reached through an index (Index Scan or Index Only Scan)
and never by a sequential scan.
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


def verdict(name: str, table: str, plan_json: Any) -> dict[str, Any]:
    """Summarise one plan: the scans on `table`, the indexes used, and whether it passes."""
    root = plan_json[0]["Plan"]
    # Scan nodes only: the ModifyTable node of an UPDATE names the table too.
    scans = [n for n in _nodes(root) if n.get("Relation Name") == table and n["Node Type"].endswith("Scan")]
    index_scans = [n for n in scans if n["Node Type"] in INDEX_NODES]
    other = sorted({n["Node Type"] for n in scans if n["Node Type"] not in INDEX_NODES})
    return {
        "query": name,
        "table": table,
        "index_scan": bool(index_scans) and not other,
        "indexes": sorted({n.get("Index Name", "") for n in index_scans}),
        "other_scans": other,
        "top_node": root["Node Type"],
        "total_cost": root.get("Total Cost"),
    }


def _explain(conn: sa.Connection, statement: str, params: dict[str, Any]) -> Any:
    # EXPLAIN without ANALYZE plans the statement and runs nothing (the claim is an UPDATE).
    return conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, params).scalar_one()


def explain_sweep_reads(engine: sa.Engine, run_date: date) -> list[dict[str, Any]]:
    """The delta and full-page reads, as the engine's reader sends them."""
    from batch_assets.domains.customer_status import sql
    from batch_assets.engine.runner import PIN_READ_PLAN_SQL

    with engine.connect() as conn:
        middle = conn.exec_driver_sql(
            "SELECT id FROM customers WHERE status = 'ACTIVE' ORDER BY id OFFSET 1000 LIMIT 1"
        ).scalar()
        after = middle or uuid.UUID(int=0)
        conn.exec_driver_sql(PIN_READ_PLAN_SQL)  # the reader's session; this connection is discarded below
        limit = 1000
        checks = [
            verdict("delta first page", "customers",
                    _explain(conn, sql.DELTA_FIRST_PAGE, {"run_date": run_date, "limit": limit})),
            verdict("delta next page", "customers",
                    _explain(conn, sql.DELTA_AFTER_PAGE, {"run_date": run_date, "limit": limit,
                                                          "after_date": "-infinity", "after_id": after})),
            verdict("full first page", "customers",
                    _explain(conn, sql.FULL_FIRST_PAGE, {"lo": uuid.UUID(int=0),
                                                         "hi": uuid.UUID(int=2**128 - 1), "limit": limit})),
            verdict("full next page", "customers",
                    _explain(conn, sql.FULL_AFTER_PAGE, {"after": after, "hi": uuid.UUID(int=2**128 - 1),
                                                         "limit": limit})),
        ]
        conn.invalidate()  # never hand the pinned session back to the pool
    return checks


# Values for the claim statement's bound parameters, by name.
CLAIM_PARAMS: dict[str, Any] = {"n": 100, "limit": 100, "batch_size": 100, "lease_s": 30.0,
                                "aging_s": 60.0, "aging_interval_s": 60.0}


def explain_claim(engine: sa.Engine) -> dict[str, Any]:
    """The payment claim on CLAIM_SAMPLE_PAYMENTS NEW payments (removed afterwards)."""
    from batch_assets.domains.payments import sql as payment_sql
    from batch_assets.domains.payments.seed import copy_payments

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
