"""Test helpers: customers written with COPY (ciphertexts made in Python), and statement capture."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import date, timedelta

import sqlalchemy as sa

from batch_assets.reference.customer_status.crypto import DobCipher

COPY_CUSTOMERS = "COPY customers (id, status, encrypted_dob, age_category, next_review_date) FROM STDIN"


def copy_customers(engine: sa.Engine, rows: Iterable[tuple]) -> None:
    """Insert (id, status, encrypted_dob, age_category, next_review_date) rows with one COPY."""
    with engine.begin() as conn:
        raw = conn.connection.driver_connection
        with raw.cursor() as cur, cur.copy(COPY_CUSTOMERS) as copy:
            for row in rows:
                copy.write_row(row)
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE customers")


def customer(cipher: DobCipher, dob: str | None, *, category: str | None = None, next_review: date | None = None,
             status: str = "ACTIVE", customer_id: uuid.UUID | None = None) -> tuple:
    cid = customer_id or uuid.uuid4()
    blob = None if dob is None else cipher.encrypt_text(cid, dob)
    return (cid, status, blob, category, next_review)


def random_customers(cipher: DobCipher, n: int, *, seed: int = 7, today: date = date(2025, 6, 1)) -> Iterator[tuple]:
    rng = random.Random(seed)
    for _ in range(n):
        cid = uuid.UUID(int=rng.getrandbits(128), version=4)
        dob = today - timedelta(days=rng.randrange(0, 95 * 365))
        yield (cid, "ACTIVE", cipher.encrypt_text(cid, dob.isoformat()), None, None)


def fetch_customer(engine: sa.Engine, cid: uuid.UUID) -> tuple:
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT age_category, next_review_date FROM customers WHERE id = %(id)s", {"id": cid}
        ).one()


def count(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()


@contextmanager
def captured_statements(engine: sa.Engine) -> Iterator[list[tuple[str, object]]]:
    """Every statement (and its parameters) the engine sends, from any thread, while the block runs.

    Leaves out the reader's plan pin and its reset: two statements per run, not per page.
    """
    seen: list[tuple[str, object]] = []

    def listener(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        if "enable_bitmapscan" not in statement:
            seen.append((" ".join(statement.split()), parameters))

    sa.event.listen(engine, "before_cursor_execute", listener)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", listener)


def writes(statements: list[tuple[str, object]]) -> list[str]:
    """The statements that are not reads (the SET LOCAL of timeouts counts: it opens a write)."""
    return [s for s, _ in statements if not s.startswith("SELECT") or "set_config(" in s]
