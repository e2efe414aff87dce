"""The engine's hooks for a definition's own write policy: which failed writes are retried, how a row's
failed write is named and recorded, the definition's own counters, sa.text reads and larger pages."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date
from typing import Any

import pytest
import sqlalchemy as sa
from customer_rows import captured_statements

from batch_assets.engine.definition import (
    CursorRange,
    RowOutcome,
    RunContext,
    SqlReader,
    Sweep,
    WriteCounts,
    WriteFailures,
)
from batch_assets.engine.result import WRITE_ERROR
from batch_assets.engine.runner import run_sweep
from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import ConfigError

pytestmark = pytest.mark.integration

RUN_DATE = date(2025, 6, 1)

# :after bigint, :limit int
READ = sa.text("SELECT id FROM toy_items WHERE id > :after ORDER BY id LIMIT :limit")
# :ids bigint[]; returns (rows updated, sum of their old values)
WRITE = sa.text(
    "WITH u AS (UPDATE toy_items SET done = true WHERE id = ANY(CAST(:ids AS bigint[])) RETURNING id) "
    "SELECT count(*), coalesce(sum(id), 0) FROM u"
)
# :ids bigint[]: the side effect that must survive a failed page
SEEN = sa.text("INSERT INTO toy_seen (id) SELECT unnest(CAST(:ids AS bigint[])) ON CONFLICT DO NOTHING")
# :id bigint, :kind text
RECORD = sa.text("INSERT INTO toy_failures (id, kind) VALUES (:id, :kind) RETURNING id * 10")

SETUP = (
    "CREATE TABLE toy_items (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false)",
    "CREATE TABLE toy_failures (id bigint PRIMARY KEY, kind text NOT NULL)",
    "CREATE TABLE toy_seen (id bigint PRIMARY KEY)",
    "INSERT INTO toy_items (id) SELECT generate_series(1, 30)",
    """
    CREATE FUNCTION toy_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.id = 17 THEN RAISE EXCEPTION 'row 17 refuses'; END IF;
        RETURN NEW;
    END; $$
    """,
    "CREATE TRIGGER toy_refuse BEFORE UPDATE ON toy_items FOR EACH ROW EXECUTE FUNCTION toy_refuse()",
)


class ToyReader(SqlReader):
    ranged = False
    max_page_size = 5000
    failed_writes_stay_due = True

    def first_page_sql(self) -> sa.TextClause:
        return READ

    def after_page_sql(self) -> sa.TextClause:
        return READ

    def page_params(self, cursor: Any, limit: int, cursor_range: CursorRange) -> dict[str, Any]:
        return {"after": 0 if cursor is None else cursor, "limit": limit}

    def cursor_of(self, row: Any) -> Any:
        return row[0]


class ToyFailures(WriteFailures):
    """Names a failed write by the driver's class and records it; optionally a lock timeout is the row's own."""

    def __init__(self, sweep: ToySweep, *, lock_timeouts_are_the_rows: bool) -> None:
        self.sweep = sweep
        self.lock_timeouts_are_the_rows = lock_timeouts_are_the_rows

    def retryable(self, exc: BaseException) -> bool:
        sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
        if self.lock_timeouts_are_the_rows and sqlstate == "55P03":
            return False
        return super().retryable(exc)

    def kind(self, exc: BaseException) -> str:
        return type(getattr(exc, "orig", exc)).__name__

    def record(self, conn: sa.Connection, outcome: RowOutcome, exc: BaseException) -> Callable[[], None]:
        value = conn.execute(RECORD, {"id": outcome.change, "kind": self.kind(exc)}).scalar_one()
        return lambda: self.sweep.recorded.append((outcome.change, value))


class ToySweep(Sweep):
    """Marks every toy item done; row 17 refuses (its trigger raises). Only the four required members, unless a
    test asks for the write-failure hooks (`records`) or the side-effect hook (`side_effects`)."""

    name = "toy"

    def __init__(self, *, lock_timeouts_are_the_rows: bool = False, records: bool = False,
                 side_effects: bool = False) -> None:
        self.reader = ToyReader()
        if records:
            self.write_failures = ToyFailures(self, lock_timeouts_are_the_rows=lock_timeouts_are_the_rows)
        if side_effects:
            self.side_effects = self._mark_seen
        self.recorded: list[tuple[int, Any]] = []

    def compute(self, row: Any) -> RowOutcome:
        return RowOutcome(row[0])

    def write_page(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> WriteCounts:
        rows, id_sum = conn.execute(WRITE, {"ids": [o.change for o in changed]}).one()
        return WriteCounts(int(rows), extra={"id_sum": int(id_sum)})

    def _mark_seen(self, conn: sa.Connection, changed: Sequence[RowOutcome]) -> int:
        return conn.execute(SEEN, {"ids": [o.change for o in changed]}).rowcount


@pytest.fixture
def toy(engine: sa.Engine) -> sa.Engine:
    with engine.begin() as conn:
        for ddl in SETUP:
            conn.execute(sa.text(ddl))
    return engine


def _run(engine: sa.Engine, definition: Sweep, **settings: Any) -> Any:
    values = {"workers": 1, "window": 1, "page_size": 10, "retry_backoff_s": 0.01, **settings}
    return run_sweep(engine, definition, SweepSettings(**values), RunContext("r1", "all", RUN_DATE))


def _failures(engine: sa.Engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text("SELECT id, kind FROM toy_failures ORDER BY id"))]


def test_a_rows_failed_write_is_named_and_recorded_by_the_definition(toy: sa.Engine) -> None:
    """The failing row's kind comes from write_failures.kind; its record commits in a transaction of its own."""
    definition = ToySweep(records=True)
    result = _run(toy, definition)
    assert (result.status, result.scanned, result.changed, result.failed) == ("SUCCESS", 30, 29, 1)
    assert {k: n for k, n in result.failed_by_type.items() if n} == {"RaiseException": 1}
    assert _failures(toy) == [(17, "RaiseException")]
    assert definition.recorded == [(17, 170)]  # what the record returned ran once it committed
    assert result.extra == {"id_sum": sum(range(1, 31)) - 17}  # only committed writes are counted


def test_by_default_a_failed_write_is_a_write_error_and_nothing_is_recorded(toy: sa.Engine) -> None:
    """Without the hooks the failing row is a write_error and no record transaction is opened."""
    result = _run(toy, ToySweep())
    assert result.failed_by_type[WRITE_ERROR] == 1 and result.changed == 29
    assert _failures(toy) == []


def _seen(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT id FROM toy_seen ORDER BY id")).scalars())


def test_side_effects_commit_before_the_page_write_and_survive_its_failure(toy: sa.Engine) -> None:
    """The side_effects hook runs in a transaction of its own before the page write: the page whose write fails
    (row 17) keeps its side effects, the fallback does not write them twice, and only committed rows count."""
    with captured_statements(toy) as statements:
        result = _run(toy, ToySweep(side_effects=True))
    assert (result.status, result.changed, result.failed, result.triggers) == ("SUCCESS", 29, 1, 30)
    assert _seen(toy) == list(range(1, 31))
    assert sum("INSERT INTO toy_seen" in s for s, _ in statements) == 3  # once per page, never per fallback row


def test_without_the_hook_no_side_effect_transaction_is_opened(toy: sa.Engine) -> None:
    """A sweep without side_effects opens no transaction for it: the same run with the hook costs exactly two
    statements more per page (its transaction's SET LOCAL preamble and its insert)."""
    with captured_statements(toy) as without:
        plain = _run(toy, ToySweep())
    with captured_statements(toy) as with_hook:
        hooked = _run(toy, ToySweep(side_effects=True))
    assert (plain.pages, plain.changed, hooked.changed) == (3, 29, 29)
    assert not any("toy_seen" in s for s, _ in without)
    assert len(with_hook) - len(without) == 2 * plain.pages


def test_pages_may_exceed_1000_rows_when_the_definition_allows_it(toy: sa.Engine) -> None:
    """max_page_size lets a definition read and write pages larger than the default bound."""
    result = _run(toy, ToySweep(), page_size=2000)
    assert (result.pages, result.changed) == (1, 29)


def test_a_page_above_the_definitions_bound_is_refused_before_any_read(toy: sa.Engine) -> None:
    """run_sweep checks page_size against the definition's max_page_size (ConfigError naming it), nothing read."""
    small = ToySweep()
    small.reader.max_page_size = 1000

    with pytest.raises(ConfigError) as info:
        _run(toy, small, page_size=2000)
    assert info.value.field == "page_size"
    assert _failures(toy) == []


def _hold_row_lock(engine: sa.Engine, item: int) -> tuple[sa.Connection, Any]:
    other = engine.connect()
    transaction = other.begin()
    other.execute(sa.text("SELECT id FROM toy_items WHERE id = :id FOR UPDATE"), {"id": item}).all()
    return other, transaction


def test_a_lock_timeout_is_retried_by_default_then_the_run_stops(toy: sa.Engine) -> None:
    """By default a lock timeout is transient: retried, counted, then the run ends FAILURE naming the error."""
    other, transaction = _hold_row_lock(toy, 3)
    try:
        result = _run(toy, ToySweep(), lock_timeout_s=0.05, row_timeout_s=1, transient_retries=2)
    finally:
        transaction.rollback()
        other.close()
    assert result.status == "FAILURE" and result.retries == 2 and result.gave_up_after == 3
    assert getattr(result.gave_up_on.orig, "sqlstate", None) == "55P03"


def test_a_definition_may_make_a_lock_timeout_the_rows_own_failure(toy: sa.Engine) -> None:
    """write_retryable False: the page falls back to one row per transaction and only the locked row fails."""
    other, transaction = _hold_row_lock(toy, 3)
    try:
        result = _run(toy, ToySweep(lock_timeouts_are_the_rows=True, records=True), lock_timeout_s=0.05,
                      row_timeout_s=1)
    finally:
        transaction.rollback()
        other.close()
    assert (result.status, result.retries, result.changed, result.failed) == ("SUCCESS", 0, 28, 2)
    assert _failures(toy) == [(3, "LockNotAvailable"), (17, "RaiseException")]
