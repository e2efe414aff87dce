"""What makes a table a queue: its name, table, key, the columns handed to the handler, and an optional priority.

Identifiers are lower-case SQL names (`[a-z_][a-z0-9_]*`, a table optionally `schema.table`) and are
always written double-quoted, so a column named like a keyword (`order`, `user`) works too. The
names of what `db migrate` installs on the table (trigger function, triggers, indexes) and the
notification channel derive from `prefix`; the payments queue keeps the names its migrations gave them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from batch_assets.errors import ConfigError
from batch_assets.names import NAME_RE

IDENT_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}", re.ASCII)
QUEUE_COLUMNS = ("status", "attempts", "next_attempt_at", "claimed_until", "last_error", "processed_at")
"""The columns every queue table holds (as payments); the claim token's column is the product's own (added)."""
KEY_TYPES = ("uuid", "bigint", "integer")
PRIORITY_TYPES = ("smallint", "integer")
TOKEN_COLUMN = "ba_claim_token"
"""The claim token's column `db migrate` adds to a declared queue's table, named so that it is never one of the
table's own columns."""
LEGACY_TOKEN_COLUMN = "claim_token"
"""The payments table's own token column, and the name releases before `ba_claim_token` gave a declared queue's:
a table they installed the queue on keeps it (`QueueStore.checked`)."""
RANK_FUNCTION = "ba_queue_claim_rank"
"""The claim rank of a declared queue with a priority column (one level gained per 60 s due), as payment_claim_rank."""


def quote(identifier: str) -> str:
    """`name` → `"name"`; `schema.name` → `"schema"."name"` (validated names only)."""
    return ".".join(f'"{part}"' for part in identifier.split("."))


def check_identifier(value: object, field_name: str, *, qualified: bool = False) -> str:
    """A lower-case SQL name (optionally `schema.name`); ConfigError naming `field_name` otherwise."""
    parts = value.split(".") if isinstance(value, str) else [None]
    if not (1 <= len(parts) <= (2 if qualified else 1)) or not all(
        isinstance(p, str) and IDENT_RE.fullmatch(p) for p in parts
    ):
        shape = "[schema.]table" if qualified else "a column name"
        raise ConfigError(f"must be {shape} in lower case ([a-z_][a-z0-9_]*), got {value!r}", field=field_name)
    return str(value)


@dataclass(frozen=True)
class QueueSpec:
    """One queue's table and its shape; `statements.Statements` writes its SQL from it."""

    name: str
    table: str
    key: str = "id"
    columns: tuple[str, ...] = ()
    priority: str | None = None
    key_type: str = "uuid"  # the key's SQL type, as the catalog names it (resolved by the store when declared)
    prefix: str = ""  # names of the trigger function, triggers and indexes; default ba_q_<name>
    channel: str = ""  # the wake-up channel; default batch_assets_queue_<name>_due
    rank_function: str = RANK_FUNCTION
    token_column: str = LEGACY_TOKEN_COLUMN  # payments'; a declared queue's is TOKEN_COLUMN (QueueDeclaration)
    timestamps: tuple[str, ...] = field(default=())  # extra timestamptz columns listed by `dlq list` (created_at)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_RE.fullmatch(self.name):
            raise ConfigError(f"must match [a-z][a-z0-9_]{{0,40}}, got {self.name!r}", field="name")
        check_identifier(self.table, "table", qualified=True)
        check_identifier(self.key, "key")
        if not self.columns:
            raise ConfigError("must name at least one column", field="columns")
        for column in self.columns:
            check_identifier(column, "columns")
        if len(set(self.columns)) != len(self.columns):
            raise ConfigError(f"names a column twice: {list(self.columns)}", field="columns")
        check_identifier(self.token_column, "token_column")
        clash = sorted(set(self.columns) & (set(QUEUE_COLUMNS) | {self.token_column}))
        if clash:
            raise ConfigError(f"may not name the queue's own columns {clash}", field="columns")
        if self.priority is not None:
            check_identifier(self.priority, "priority")
        if self.key_type not in KEY_TYPES:
            raise ConfigError(f"the key column must be one of {', '.join(KEY_TYPES)}, got {self.key_type}", field="key")
        if not self.prefix:
            object.__setattr__(self, "prefix", f"ba_q_{self.name}")
        if not self.channel:
            object.__setattr__(self, "channel", f"batch_assets_queue_{self.name}_due")

    def with_key_type(self, key_type: str) -> QueueSpec:
        return replace(self, key_type=key_type)

    def with_token_column(self, column: str) -> QueueSpec:
        return replace(self, token_column=column)

    @property
    def required_columns(self) -> tuple[str, ...]:
        """Every column the queue reads or writes on the table (its own token column aside)."""
        own = (self.key, *self.columns, *QUEUE_COLUMNS, *((self.priority,) if self.priority else ()), *self.timestamps)
        return tuple(dict.fromkeys(own))
