"""The grants a job needs, checked before it starts, and PostgreSQL's permission errors in one line.

A job run by a role that lacks a grant would otherwise fail on the first statement that needs it, somewhere in the
middle of its work, with a driver error. `missing_privilege` asks the catalog instead (`has_table_privilege` and
its kin: no table is read, nothing is locked) for every grant the job needs, in one round trip, and names the
first one missing; `require_migrated` calls it before a job is launched. docs/production/privileges.md lists the
same grants as the SQL a DBA runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from batch_assets.errors import PermissionDenied, cause_line

INSUFFICIENT_PRIVILEGE = "42501"


@dataclass(frozen=True)
class Privilege:
    """One grant: `privilege` (SELECT, INSERT, UPDATE, DELETE, EXECUTE or USAGE) on a table (on `columns` of it
    when given), a sequence or a function (`on` is then its signature, `name(type, ...)`)."""

    privilege: str
    on: str
    kind: str = "table"
    columns: tuple[str, ...] = ()

    def __str__(self) -> str:
        columns = f" ({', '.join(self.columns)})" if self.columns else ""
        kind = "" if self.kind == "table" else f"{self.kind} "
        on = self.on.split("(", 1)[0] if self.kind == "function" else self.on
        return f"{self.privilege}{columns} on {kind}{on}"


def table(privileges: str, on: str) -> list[Privilege]:
    """`table("SELECT, INSERT", "ba_run_history")`: one Privilege per word."""
    return [Privilege(p.strip(), on) for p in privileges.split(",")]


LEDGER = (Privilege("SELECT", "ba_migrations"),)
"""Every job reads the migrations ledger first (`require_migrated`)."""

RUN_HISTORY = (*table("SELECT, INSERT", "ba_run_history"), Privilege("USAGE", "ba_run_history_id_seq", "sequence"))
"""Every job records its summary; the CLI reads it back."""

GUARDED = (
    *LEDGER,
    *table("SELECT, INSERT, UPDATE, DELETE", "ba_job_locks"),
    *table("SELECT, INSERT, UPDATE, DELETE", "ba_leases"),
    *RUN_HISTORY,
)
"""A job that runs under the job lock and a lease (the outbox relay), and records its run history."""

SWEEP_BOOKKEEPING = (*GUARDED, *table("SELECT, INSERT, UPDATE, DELETE", "ba_checkpoints"))
"""A guarded sweep: its job lock, its lease, its run history and its checkpoints."""

RATE_TAKE = "ba_rate_take(text, integer, integer, double precision, double precision)"

QUEUE_BOOKKEEPING = (
    *LEDGER,
    *table("SELECT, INSERT, UPDATE", "ba_queue_state"),
    *table("SELECT, INSERT, UPDATE", "ba_queue_rate"),
    *table("SELECT, INSERT, UPDATE", "ba_queue_slots"),
    Privilege("EXECUTE", RATE_TAKE, "function"),
    *RUN_HISTORY,
)
"""A queue worker: the breaker's state, the rate limit and in-flight slots, and its run history."""


def outbox_insert(outbox: str) -> tuple[Privilege, ...]:
    """What writing events to the outbox table `outbox` takes (its id is a bigserial)."""
    return Privilege("INSERT", outbox), Privilege("USAGE", f"{outbox}_id_seq", "sequence")


def declared_sweep(table_name: str, read: Sequence[str], writes: Sequence[str],
                   outbox: str | None) -> tuple[Privilege, ...]:
    """A declared sweep's grants on the team's table (SELECT on the columns it reads, UPDATE on those it writes)
    and its outbox, besides the bookkeeping."""
    return (
        Privilege("SELECT", table_name, columns=tuple(dict.fromkeys(read))),
        Privilege("UPDATE", table_name, columns=tuple(writes)),
        *(outbox_insert(outbox) if outbox else ()),
        *SWEEP_BOOKKEEPING,
    )


def queue_table(table_name: str) -> tuple[Privilege, ...]:
    """A queue's grants on its table: it reads due rows and updates their queue columns."""
    return tuple(table("SELECT, UPDATE", table_name))


def _checks(needed: Sequence[Privilege]) -> tuple[list[str], dict[str, str], list[Privilege]]:
    """One boolean SQL expression per check (a column privilege is one per column), with its parameters. An object
    that does not exist gives NULL (not refused here: the job's own checks name it)."""
    expressions: list[str] = []
    params: dict[str, str] = {}
    which: list[Privilege] = []
    for i, grant in enumerate(needed):
        params[f"o{i}"], params[f"p{i}"] = grant.on, grant.privilege
        if grant.kind == "function":
            expressions.append(f"has_function_privilege(to_regprocedure(:o{i}), :p{i})")
            which.append(grant)
        elif grant.kind == "sequence":
            expressions.append(f"has_sequence_privilege(to_regclass(:o{i}), :p{i})")
            which.append(grant)
        elif grant.columns:
            for j, column in enumerate(grant.columns):
                params[f"c{i}_{j}"] = column
                expressions.append(f"has_column_privilege(to_regclass(:o{i}), CAST(:c{i}_{j} AS text), :p{i})")
                which.append(Privilege(grant.privilege, grant.on, grant.kind, (column,)))
        else:
            expressions.append(f"has_table_privilege(to_regclass(:o{i}), :p{i})")
            which.append(grant)
    return expressions, params, which


def missing_privilege(conn: sa.Connection, needed: Iterable[Privilege]) -> Privilege | None:
    """The first of `needed` the connection's role lacks (one round trip to the catalog), or None."""
    grants = list(dict.fromkeys(needed))
    if not grants:
        return None
    expressions, params, which = _checks(grants)
    row = conn.execute(sa.text("SELECT " + ", ".join(expressions)), params).one()  # noqa: S608 - constant SQL
    return next((grant for grant, ok in zip(which, row, strict=True) if ok is False), None)


def refusal(missing: Privilege) -> PermissionDenied:
    return PermissionDenied(f"the role needs {missing}")


def require_privileges(conn: sa.Connection, needed: Iterable[Privilege]) -> None:
    """Raise PermissionDenied naming the first grant of `needed` the role lacks."""
    missing = missing_privilege(conn, needed)
    if missing is not None:
        raise refusal(missing)


def is_insufficient_privilege(exc: BaseException) -> bool:
    """True for PostgreSQL's insufficient_privilege (SQLSTATE 42501), bare or wrapped by SQLAlchemy."""
    cause = getattr(exc, "orig", None) or exc
    return getattr(cause, "sqlstate", None) == INSUFFICIENT_PRIVILEGE


def permission_denied(exc: BaseException) -> PermissionDenied:
    """A driver's insufficient_privilege as one line: PostgreSQL's own first line names the object (`permission
    denied for table accounts`); never the statement or its parameters."""
    line = cause_line(exc).removeprefix("permission denied for ")
    return PermissionDenied(f"the role lacks a grant on {line}")
