"""`QueueStore`: every statement of one queue, run for the async worker and for tests alike.

The worker sends `send_*` statements inside its pipeline on its own psycopg connection; everything
else (the CLI, Dagster, tests) calls the synchronous methods, each in its own short transaction on a
SQLAlchemy engine. Both run the same texts (`statements.Statements`), so a test of `claim` or
`write_results` exercises the statement production runs. Nothing here holds a transaction while a
row is processed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import sqlalchemy as sa

from batch_assets.db.catalog import key_problem
from batch_assets.errors import ConfigError
from batch_assets.queue.claims import Claim, Result, claims_from_rows, clip, new_token
from batch_assets.queue.spec import KEY_TYPES, LEGACY_TOKEN_COLUMN, PRIORITY_TYPES, QueueSpec
from batch_assets.queue.statements import COLUMN_TYPES, QUEUE_STATE, RECORD_STATE, TRIGGER_EXISTS, Statements
from batch_assets.settings_model import WHOLE_NUMBER_RE

log = logging.getLogger(__name__)

STATUSES = ("NEW", "PROCESSING", "DONE", "FAILED")
DLQ_ERROR_CHARS = 500
"""`queue dlq list` reads last_error cut to this many characters: another service may have written any size."""
_REPLAY_BATCH = 1000
_TYPE_NAMES = {"uuid": "uuid", "bigint": "bigint", "integer": "integer", "smallint": "smallint"}


class ReplayCount(int):
    """Rows replayed; `.unknown` are ids of no row, `.not_failed` ids not in FAILED."""

    unknown: tuple[Any, ...]
    not_failed: tuple[Any, ...]

    def __new__(cls, count: int, unknown: Sequence[Any] = (), not_failed: Sequence[Any] = ()) -> ReplayCount:
        obj = super().__new__(cls, count)
        obj.unknown = tuple(unknown)
        obj.not_failed = tuple(not_failed)
        return obj


class QueueStore:
    """The statements of the queue `spec` describes, and the calls that run them."""

    def __init__(self, spec: QueueSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.sql = Statements(spec)

    # --- the table ---------------------------------------------------------------------------

    def column_types(self, conn: sa.Connection) -> dict[str, str]:
        """Column → SQL type of the queue's table (empty when the table does not exist)."""
        rows = conn.exec_driver_sql(COLUMN_TYPES, {"table": self.spec.table}).all()
        return {str(name): str(kind) for name, kind in rows}

    def checked(self, conn: sa.Connection, *, source: str = "") -> QueueStore:
        """This store with the key type read from the catalog; ConfigError naming the table and the column
        when the table lacks a column the queue needs, or its key or priority has a type it cannot use, or its
        key is not unique and NOT NULL (`db.catalog.key_problem`)."""
        spec, where = self.spec, f"{source}: " if source else ""
        types = self.column_types(conn)
        if not types:
            from batch_assets.db.migrate import pending_migrations, pending_text

            # A queue's table is the project's own; a database where even the library's set is pending has not
            # seen `db migrate` at all, which is then the likelier cause.
            pending = pending_migrations(conn, ())
            raise ConfigError(f"{where}table {spec.table} does not exist"
                              + (f"; {pending_text(pending)}" if pending else ""), field="table")
        missing = [c for c in spec.required_columns if c not in types]
        if missing:
            raise ConfigError(f"{where}table {spec.table} lacks column {missing[0]}"
                              + (f" (and {', '.join(missing[1:])})" if missing[1:] else ""), field=missing[0])
        key_type = _TYPE_NAMES.get(types[spec.key], types[spec.key])
        if key_type not in KEY_TYPES:
            raise ConfigError(f"{where}key {spec.table}.{spec.key} is {key_type}; must be one of "
                              f"{', '.join(KEY_TYPES)}", field="key")
        problem = key_problem(conn, spec.table, spec.key)
        if problem is not None:
            raise ConfigError(f"{where}{problem}", field="key")
        if spec.priority and types[spec.priority] not in PRIORITY_TYPES:
            raise ConfigError(f"{where}priority {spec.table}.{spec.priority} is {types[spec.priority]}; must be "
                              f"{' or '.join(PRIORITY_TYPES)}", field="priority")
        resolved = spec.with_key_type(key_type)
        if self._installed_with_legacy_token(conn, types):
            resolved = resolved.with_token_column(LEGACY_TOKEN_COLUMN)
        return self if resolved == spec else QueueStore(resolved)

    def _installed_with_legacy_token(self, conn: sa.Connection, types: dict[str, str]) -> bool:
        """Whether a release that named the token column `claim_token` installed this queue on the table (the
        column is a uuid and the queue's own wake-up trigger is there): the queue keeps that column then, and
        its claims in flight stay fenced. A `claim_token` of the table's own is left alone."""
        spec = self.spec
        if spec.token_column in types or types.get(LEGACY_TOKEN_COLUMN) != "uuid":
            return False
        return bool(conn.exec_driver_sql(TRIGGER_EXISTS, {"table": spec.table,
                                                          "trigger": f"{spec.prefix}_notify_due_insert"}).scalar())

    def install(self, conn: sa.Connection) -> None:
        """The token column, the claim, processing and failed indexes and the wake-up trigger (idempotent)."""
        for statement in self.sql.install:
            conn.exec_driver_sql(statement)

    # --- claims and results ------------------------------------------------------------------

    def claims(self, rows: Sequence[Any], token: uuid.UUID) -> list[Claim]:
        return claims_from_rows(rows, token, self.spec.columns)

    def claim(self, engine: sa.Engine, n: int, lease_s: float) -> list[Claim]:
        """Claim up to `n` due rows (NEW and due by claim rank, or PROCESSING with a lapsed lease) at once."""
        if n <= 0:
            return []
        token = new_token()
        with engine.begin() as conn:
            rows = conn.exec_driver_sql(self.sql.claim, {"n": int(n), "lease_s": float(lease_s), "token": token}).all()
        return self.claims(rows, token)

    @staticmethod
    def results_params(results: Sequence[Result]) -> dict[str, list[Any]]:
        """The write_results parameters (parallel arrays) for `results`."""
        return {
            "ids": [r.claim.id for r in results],
            "tokens": [r.claim.token for r in results],
            "statuses": [r.status for r in results],
            "undo": [r.undo for r in results],
            "delays": [float(r.delay_s) for r in results],
            "errors": [None if r.error is None else clip(r.error) for r in results],
        }

    def write_results(self, engine: sa.Engine, results: Sequence[Result]) -> list[Result]:
        """Write `results` in one fenced statement; returns the ones written (a lost claim writes nothing)."""
        if not results:
            return []
        with engine.begin() as conn:
            rows = conn.exec_driver_sql(self.sql.write_results, self.results_params(results)).all()
        return [results[int(r[0]) - 1] for r in rows]

    # --- the worker's connection (inside its pipeline) ----------------------------------------

    async def send_write(
        self, conn: psycopg.AsyncConnection[Any], results: Sequence[Result]
    ) -> psycopg.AsyncCursor[Any]:
        return await conn.execute(self.sql.write_results, self.results_params(results), binary=True)

    async def send_claim(
        self, conn: psycopg.AsyncConnection[Any], n: int, lease_s: float, token: uuid.UUID,
        slots: dict[str, Any] | None = None,
    ) -> psycopg.AsyncCursor[Any]:
        """The claim; with `slots` (`RateLimiter.claim_slots`), call slots for the rows claimed in the same
        statement (`claim_with_slots`: each row then ends with granted, first_in_s)."""
        params = {"n": n, "lease_s": float(lease_s), "token": token}
        if slots is None:
            return await conn.execute(self.sql.claim, params, binary=True)
        return await conn.execute(self.sql.claim_with_slots, {**params, **slots}, binary=True)

    async def send_state(self, conn: psycopg.AsyncConnection[Any], state: dict[str, Any]) -> None:
        await conn.execute(RECORD_STATE, {"queue": self.name, **state})

    async def claimed_by_token(self, conn: psycopg.AsyncConnection[Any], token: uuid.UUID) -> list[Claim]:
        cur = await conn.execute(self.sql.claimed_by_token, {"token": token}, binary=True)
        return self.claims(await cur.fetchall(), token)

    async def anext_due_in(self, conn: psycopg.AsyncConnection[Any]) -> float | None:
        cur = await conn.execute(self.sql.next_due_in)
        row = await cur.fetchone()
        return None if row is None or row[0] is None else float(row[0])

    # --- reading -----------------------------------------------------------------------------

    def next_due_in(self, engine: sa.Engine) -> float | None:
        """Seconds until the next row is due (<= 0: one is due now), None when nothing is queued."""
        with engine.connect() as conn:
            value = conn.exec_driver_sql(self.sql.next_due_in).scalar()
        return None if value is None else float(value)

    def stuck(self, engine: sa.Engine) -> tuple[int, str]:
        """(lapsed claims, the oldest claimed_until as text) for the asset check."""
        with engine.connect() as conn:
            stuck, oldest = conn.exec_driver_sql(self.sql.stuck).one()
        return int(stuck), str(oldest or "")

    def stats(self, engine: sa.Engine) -> dict[str, Any]:
        """`queue stats` (docs/guide/payment-queue.md): counts by status, oldest_due_s, dlq_size, breaker; plus due
        and stuck rows.

        `due` = NEW and due + lapsed claims (the "due rows" of docs/guide/payment-queue.md); `stuck_processing` = the
        lapsed claims alone,
        a PROCESSING row without a lease included (docs/reference/tables.md). A status another service wrote that is
        none of
        the four statuses (docs/reference/tables.md) is never claimed: it is counted under its own name in
        `by_status` and in `unknown_status`.
        `never_due`: NEW rows whose next_attempt_at, or PROCESSING rows whose claimed_until, is 'infinity'.
        """
        by_status = dict.fromkeys(STATUSES, 0)
        due = stuck = never_due = 0
        with engine.connect() as conn:
            for row in conn.exec_driver_sql(self.sql.stats):
                by_status[row.status] = int(row.n)
                due += int(row.due)
                stuck += int(row.stuck)
                never_due += int(row.never_due)
            oldest_due_s = float(conn.exec_driver_sql(self.sql.oldest_due_s).scalar_one())
            state = conn.exec_driver_sql(QUEUE_STATE, {"queue": self.name}).mappings().first()
        return {
            "queue": self.name,
            "by_status": by_status,
            "total": sum(by_status.values()),
            "due": due + stuck,
            "stuck_processing": stuck,
            "unknown_status": sum(n for status, n in by_status.items() if status not in STATUSES),
            "never_due": never_due,
            "oldest_due_s": round(max(oldest_due_s, 0.0), 3),
            "dlq_size": by_status["FAILED"],
            "breaker": state["breaker"] if state else "closed",
            "breaker_since": state["breaker_since"].isoformat() if state else None,
            "breaker_recorded_by": state["recorded_by"] if state else None,
        }

    # --- the dead-letter queue ---------------------------------------------------------------

    def dlq_list(self, engine: sa.Engine, limit: int = 100, *, after_id: Any = None) -> list[dict[str, Any]]:
        """FAILED rows in key order (at most `limit`, after `after_id`): key, columns, attempts, last_error, …"""
        params = {"limit": int(limit), "error_chars": DLQ_ERROR_CHARS, "after": after_id}
        with engine.connect() as conn:
            text = self.sql.dlq_first if after_id is None else self.sql.dlq_after
            rows = conn.exec_driver_sql(text, params).mappings().all()
        return [dict(r) for r in rows]

    def dlq_size(self, engine: sa.Engine) -> int:
        """Number of FAILED rows."""
        with engine.connect() as conn:
            return int(conn.exec_driver_sql(self.sql.dlq_count).scalar_one())

    def dlq_replay(self, engine: sa.Engine, ids: Sequence[Any] | None) -> ReplayCount:
        """FAILED → NEW (attempts 0, due now) for `ids`, or every FAILED row when None.

        last_error is kept as the reason the row was dead-lettered until its next attempt overwrites
        it. Ids that are unknown or not FAILED are skipped and reported on the result.
        """
        if ids is None:
            total = 0
            while True:
                with engine.begin() as conn:
                    n = len(conn.exec_driver_sql(self.sql.dlq_replay_batch, {"limit": _REPLAY_BATCH}).all())
                total += n
                if n < _REPLAY_BATCH:
                    return ReplayCount(total)
        wanted = list(dict.fromkeys(self.key_value(i) for i in ids))
        if not wanted:
            return ReplayCount(0)
        with engine.begin() as conn:
            replayed = {r[0] for r in conn.exec_driver_sql(self.sql.dlq_replay_ids, {"ids": wanted})}
            skipped = [i for i in wanted if i not in replayed]
            present = {r[0] for r in conn.exec_driver_sql(self.sql.status_of, {"ids": skipped})} if skipped else set()
        unknown = [i for i in skipped if i not in present]
        not_failed = [i for i in skipped if i in present]
        if skipped:
            log.warning("dlq replay skipped %d id(s): %d unknown, %d not FAILED",
                        len(skipped), len(unknown), len(not_failed))
        return ReplayCount(len(replayed), unknown, not_failed)

    def key_value(self, value: Any) -> Any:
        """An id as the key's type (uuid or a whole number); ConfigError naming `ids` otherwise."""
        if self.spec.key_type == "uuid":
            if isinstance(value, uuid.UUID):
                return value
            try:
                return uuid.UUID(str(value))
            except ValueError:
                raise ConfigError(f"not a {self.name} id (a uuid): {value!r}", field="ids") from None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and WHOLE_NUMBER_RE.fullmatch(value.strip()):
            return int(value.strip())
        raise ConfigError(f"not a {self.name} id (a whole number): {value!r}", field="ids")
