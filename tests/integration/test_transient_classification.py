"""`db.engine.is_transient`: only what a retry can fix is retried; a programming error fails the run at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from test_sweep_definition_hooks import SETUP, WRITE, ToySweep, _run

from batch_assets.db.engine import is_transient
from batch_assets.engine.definition import RowOutcome, WriteCounts

pytestmark = pytest.mark.integration

# :ids bigint[]. No RETURNING: the result has no rows to fetch.
WRITE_NO_ROWS = sa.text("UPDATE toy_items SET done = true WHERE id = ANY(CAST(:ids AS bigint[]))")


def _missing_column(conn: sa.Connection, ids: list[int]) -> Any:
    return conn.execute(WRITE, {"ids": ids}).one()._mapping["rows_written"]  # the statement has no such column


def _rows_of_an_update(conn: sa.Connection, ids: list[int]) -> Any:
    return conn.execute(WRITE_NO_ROWS, {"ids": ids}).one()  # "This result object does not return rows"


@pytest.fixture
def toy(engine: sa.Engine) -> sa.Engine:
    with engine.begin() as conn:
        for ddl in SETUP:
            conn.execute(sa.text(ddl))
    return engine


class DefectiveWrite(ToySweep):
    """A toy sweep whose page write has a programming error."""

    def __init__(self, defect: Callable[[sa.Connection, list[int]], Any]) -> None:
        super().__init__()
        self.defect = defect
        self.calls = 0

    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        self.calls += 1
        self.defect(conn, [o.change for o in changed])
        return WriteCounts(len(changed))


@pytest.mark.parametrize(
    ("defect", "error"),
    [(_missing_column, "NoSuchColumnError"), (_rows_of_an_update, "ResourceClosedError")],
)
def test_a_programming_error_in_a_write_is_not_retried_and_fails_the_run_at_once(
    toy: sa.Engine, defect: Callable[[sa.Connection, list[int]], Any], error: str
) -> None:
    """A column the result lacks, or rows fetched from an UPDATE: one attempt, FAILURE naming the error, no retry."""
    definition = DefectiveWrite(defect)
    result = _run(toy, definition, transient_retries=3)
    assert result.status == "FAILURE"
    assert (result.retries, definition.calls) == (0, 1), result.stopped_reason
    assert result.stopped_reason is not None and error in result.stopped_reason
    assert result.gave_up_on is None  # not reported as retries spent on a transient failure
    with toy.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM toy_items WHERE done")).scalar_one() == 0


class KilledOnce(ToySweep):
    """A toy sweep whose first page write loses its backend (pg_terminate_backend) before it writes."""

    def __init__(self, admin: sa.Engine) -> None:
        super().__init__()
        self.admin = admin
        self.killed = 0

    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        if not self.killed:
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            with self.admin.connect() as admin:
                admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            self.killed += 1
        return super().write_page(conn, changed)


def test_a_killed_backend_is_still_retried_and_the_run_completes(toy: sa.Engine, admin_engine: sa.Engine) -> None:
    """pg_terminate_backend of the writing session: retried on a fresh connection, SUCCESS, every row done."""
    definition = KilledOnce(admin_engine)
    result = _run(toy, definition, transient_retries=3)
    assert definition.killed == 1
    assert (result.status, result.changed, result.failed) == ("SUCCESS", 29, 1), result.stopped_reason
    assert result.retries >= 1


def _raised(work: Callable[[], Any]) -> BaseException:
    try:
        work()
    except Exception as exc:
        return exc
    raise AssertionError("expected an error")


def test_only_a_lost_connection_and_its_aftermath_are_transient(engine: sa.Engine, admin_engine: sa.Engine) -> None:
    """Real errors: killed backend, its PendingRollbackError and a closed connection are transient; defects are not."""
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT 1 AS a")).one()
        defects = [
            _raised(lambda: row._mapping["b"]),  # NoSuchColumnError
            _raised(lambda: conn.execute(sa.text("SET search_path TO public")).one()),  # a result without rows
            _raised(lambda: conn.execute(sa.text("SELECT missing_column FROM pg_class"))),  # ProgrammingError
        ]
        conn.rollback()
        transaction = conn.begin()
        transaction.rollback()
        defects.append(_raised(transaction.commit))  # "This transaction is inactive"
    assert [type(e).__name__ for e in defects] == [
        "NoSuchColumnError", "ResourceClosedError", "ProgrammingError", "InvalidRequestError"]
    assert [is_transient(e) for e in defects] == [False] * 4, [str(e) for e in defects]

    conn = engine.connect()
    conn.begin()
    pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    with admin_engine.connect() as admin:
        admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    lost = [
        _raised(lambda: conn.exec_driver_sql("SELECT 1")),  # OperationalError, connection invalidated
        _raised(lambda: conn.exec_driver_sql("SELECT 1")),  # PendingRollbackError until rolled back
    ]
    conn.close()
    lost.append(_raised(lambda: conn.exec_driver_sql("SELECT 1")))  # "This Connection is closed"
    assert [type(e).__name__ for e in lost] == ["OperationalError", "PendingRollbackError", "ResourceClosedError"]
    assert [is_transient(e) for e in lost] == [True] * 3
