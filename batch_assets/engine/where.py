"""A declared sweep's `where`: one boolean expression, by PostgreSQL's own grammar.

`where` is SQL the team writes and the product runs with its own database role (docs/reference/declarations.md,
"A defs.yaml is code"). It is pasted, in parentheses, into the statements that *read*: the pages, the cursor
ranges' bounds and the overdue count. Before that, it must parse (pglast: PostgreSQL's parser) as exactly one
expression: `SELECT 1 WHERE (<where>)` must be one statement with nothing but that WHERE, and the text's own
parentheses must balance without ever closing the one around it. So `status = 'CLOSED') OR (true` (which turns the
parentheses inside out) and a second statement are refused, naming `where`, while parentheses, `IN (...)`,
subqueries, comments and any text inside a string literal (`'{{'`, `')'`, `';'`) are fine.

Whether the expression is boolean and names real columns is the database's to say (`EXPLAIN` when the declaration
is checked against it). The columns of the swept table it names (`Where.columns`) are read with every page, so the
page write fences them like the declared columns: a row another writer moved out of `where` between the read and
the write is a conflict, without `where` itself ever being part of a write statement.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from batch_assets.errors import ConfigError

PREFIX = "SELECT 1 WHERE (\n"
SUFFIX = "\n)"
"""The newlines keep a trailing `-- comment` from swallowing the closing parenthesis."""


@dataclass(frozen=True)
class Where:
    text: str
    columns: frozenset[str]
    """Every column name the expression refers to (subqueries included; names as PostgreSQL folds them)."""


@functools.lru_cache(maxsize=64)
def parse_where(text: str) -> Where:
    """`text` as one boolean expression of PostgreSQL's grammar; ConfigError naming `where` otherwise."""
    from pglast import ast, parse_sql
    from pglast.parser import ParseError, scan
    from pglast.visitors import Visitor

    if not text.strip():
        raise ConfigError("must be one SQL condition, got an empty text", field="where")
    try:
        tokens = scan(text)
    except ParseError as exc:
        raise ConfigError(f"is not one SQL condition: {_reason(exc, 0)}", field="where") from None
    depth = 0
    for token in tokens:
        if token.name == "ASCII_40":  # (
            depth += 1
        elif token.name == "ASCII_41":  # )
            depth -= 1
            if depth < 0:
                raise ConfigError("closes a parenthesis it did not open: it must be one condition, not text "
                                  "that ends the one around it", field="where")
        elif token.name == "ASCII_59":  # ;
            raise ConfigError("must be one SQL condition (no ';' outside a string literal)", field="where")
    if depth != 0:
        raise ConfigError("leaves a parenthesis open", field="where")
    try:
        statements = parse_sql(PREFIX + text + SUFFIX)
    except ParseError as exc:
        raise ConfigError(f"is not one SQL condition: {_reason(exc, len(PREFIX))}", field="where") from None
    statement = statements[0].stmt if len(statements) == 1 else None
    if not isinstance(statement, ast.SelectStmt) or not _only_a_where(statement):
        raise ConfigError("must be one SQL condition", field="where")

    columns: set[str] = set()

    class _Columns(Visitor):
        def visit_ColumnRef(self, ancestors: object, node: ast.ColumnRef) -> None:  # noqa: N802 — pglast's name
            last = node.fields[-1] if node.fields else None
            if isinstance(last, ast.String) and last.sval:
                columns.add(last.sval)

    _Columns()(statement.whereClause)  # type: ignore[arg-type]  # not None: _only_a_where
    return Where(text, frozenset(columns))


def _only_a_where(statement: Any) -> bool:
    """A SELECT with one target and a WHERE, and nothing else (no FROM, no second query, ...)."""
    if statement.whereClause is None:
        return False
    others = ("distinctClause", "intoClause", "fromClause", "groupClause", "havingClause", "windowClause",
              "valuesLists", "sortClause", "limitOffset", "limitCount", "lockingClause", "withClause", "larg", "rarg")
    return not any(getattr(statement, name, None) for name in others) and len(statement.targetList or ()) == 1


def _reason(exc: Exception, offset: int) -> str:
    """The parser's message and where in `where` it stopped (the text is the team's own: no value of a row)."""
    args = exc.args
    text = str(args[0]).splitlines()[0] if args and args[0] else type(exc).__name__
    position = args[1] if len(args) > 1 and isinstance(args[1], int) else None
    return text if position is None else f"{text} (character {max(position - offset, 0) + 1})"
