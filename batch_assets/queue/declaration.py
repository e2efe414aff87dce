"""A queue as a team declares it (docs/reference/declarations.md): the attributes of `batch_assets.TableQueueComponent`.

The model knows no Dagster: `components.table_queue.TableQueueComponent` is this model as a Dagster
component, and the payments queue is one instance of it (`batch_assets.reference.payments.declaration.PAYMENTS_QUEUE`).

    name, table, key, columns, handler, max_attempts, backoff: {base_s, max_s, jitter?}, rate_limit_per_s,
    concurrency, priority (optional: the column of a higher-first priority with aging; none = oldest due first),
    max_in_flight (optional: calls in flight across all workers), claim_lease_s (optional), call_timeout_s
    (optional: the bound of one handler call, 30 s)

`handler` is `module:function`. A plain function is called once per row with the declared columns as
keyword arguments plus `attempts` (returning = DONE, `PermanentFailure` = FAILED at once, any other
exception transient). A function marked `@handler_factory` is instead called once per worker run with
the run's `QueueSettings` and returns a handler object (how the payments keep their default handler,
docs/guide/payment-queue.md).
"""

# No `from __future__ import annotations`: pydantic reads the annotations at runtime.

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from batch_assets.errors import ConfigError
from batch_assets.names import checked_function, checked_name
from batch_assets.plugins import load_function
from batch_assets.queue.executor import Refusal
from batch_assets.queue.handler import Handler, KwargsHandler
from batch_assets.queue.settings import MAX_CONCURRENCY, QueueSettings
from batch_assets.queue.spec import TOKEN_COLUMN, QueueSpec, check_identifier
from batch_assets.queue.store import QueueStore
from batch_assets.settings_model import DEFAULT_CALL_TIMEOUT_S, MAX_CALL_TIMEOUT_S

FACTORY_MARK = "batch_assets_queue_handler_factory"


def handler_factory(function: Callable[[QueueSettings], Handler]) -> Callable[[QueueSettings], Handler]:
    """Mark `function(settings) -> Handler` as a handler factory (called once per worker run, not per row)."""
    setattr(function, FACTORY_MARK, True)
    return function


def _value_error(exc: ConfigError) -> ValueError:
    return ValueError(str(exc).removeprefix(f"{exc.field}: ") if exc.field else str(exc))


class Backoff(BaseModel):
    """Delay after a transient failure of attempt k: base_s * 2^(k-1), at most max_s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Plain annotations (bounds checked below): Dagster's resolution takes a nested model's fields as they are.
    base_s: float = 60
    max_s: float = 3600
    jitter: float = 0.1  # each delay is drawn within ±jitter of itself (0: none), so retries do not come in step

    @field_validator("base_s", "max_s")
    @classmethod
    def _seconds(cls, value: float) -> float:
        if not 0 < value <= 7 * 86_400:
            raise ValueError(f"must be > 0 and <= 604800 (7 days), got {value!r}")
        return value

    @field_validator("jitter")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0 <= value <= 1:
            raise ValueError(f"must be within 0..1, got {value!r}")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> "Backoff":
        if self.max_s < self.base_s:
            raise ValueError(f"max_s ({self.max_s:g}) must be >= base_s ({self.base_s:g})")
        return self


class QueueDeclaration(BaseModel):
    """The attributes of one declared queue (unknown attributes are refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="queue, job and lock name: [a-z][a-z0-9_]{0,40}")
    table: str = Field(description="[schema.]table holding status, attempts, next_attempt_at, claimed_until, "
                       "last_error, processed_at")
    key: str = Field(description="the primary key column: uuid, bigint or integer")
    columns: list[str] = Field(description="passed to the handler as keyword arguments")
    handler: str = Field(description="module:function")
    max_attempts: int = Field(default=5, ge=1, le=1000)
    backoff: Backoff = Field(default_factory=Backoff)
    rate_limit_per_s: float | None = Field(default=None, gt=0, le=1_000_000,
                                           description="handler calls per second across all workers")
    concurrency: int = Field(default=8, ge=1, le=MAX_CONCURRENCY, description="handler calls in flight per worker")
    max_in_flight: int | None = Field(default=None, ge=1, le=10_000,
                                      description="optional: handler calls in flight across all workers")
    claim_lease_s: float | None = Field(default=None, ge=3, le=86_400,
                                        description="optional: claim lease, renewed every lease/3 while held (30)")
    priority: str | None = Field(default=None, description="optional smallint/integer column: higher first, aging")
    call_timeout_s: float = Field(default=DEFAULT_CALL_TIMEOUT_S, gt=0, le=MAX_CALL_TIMEOUT_S,
                                  description="the longest one handler call may take (s); past it the attempt is a "
                                  "transient failure")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return checked_name(value)

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        try:
            return check_identifier(value, "table", qualified=True)
        except ConfigError as exc:
            raise _value_error(exc) from None

    @field_validator("key", "priority")
    @classmethod
    def _column(cls, value: str | None) -> str | None:
        try:
            return None if value is None else check_identifier(value, "key")
        except ConfigError as exc:
            raise _value_error(exc) from None

    @field_validator("handler")
    @classmethod
    def _handler(cls, value: str) -> str:
        return checked_function(value)

    @model_validator(mode="after")
    def _spec(self) -> "QueueDeclaration":
        self.spec()  # columns: names, repeats, the queue's own columns (ConfigError naming the attribute)
        return self

    # --- what the declaration makes -----------------------------------------------------------

    def spec(self) -> QueueSpec:
        return QueueSpec(name=self.name, table=self.table, key=self.key, columns=tuple(self.columns),
                         priority=self.priority, token_column=TOKEN_COLUMN)

    def store(self) -> QueueStore:
        """The queue's store (key type uuid until `checked_store` read the table)."""
        return QueueStore(self.spec())

    def checked_store(self, engine: sa.Engine, *, source: str = "") -> QueueStore:
        """The store with the key type read from the table; ConfigError naming the table and the column it lacks."""
        with engine.connect() as conn:
            return self.store().checked(conn, source=source)

    def settings(self, **overrides: Any) -> QueueSettings:
        """The worker's settings: the declaration's, then `overrides` (None = the declaration's)."""
        base: dict[str, Any] = {
            "max_attempts": self.max_attempts, "backoff_base_s": self.backoff.base_s,
            "backoff_max_s": self.backoff.max_s, "concurrency": self.concurrency,
            "rate_limit_per_s": self.rate_limit_per_s, "max_in_flight": self.max_in_flight,
            "claim_lease_s": self.claim_lease_s, "backoff_jitter": self.backoff.jitter,
            "call_timeout_s": self.call_timeout_s,
        }
        base.update({k: v for k, v in overrides.items() if v is not None})
        return QueueSettings(**{k: v for k, v in base.items() if v is not None})

    def function(self) -> Callable[..., Any]:
        """The handler's function (ConfigError naming `handler` when it cannot be imported)."""
        return load_function(self.handler, field="handler")

    def make_handler(self, settings: QueueSettings) -> Handler:
        """The handler of one worker run: the factory's handler, or the function called per row."""
        function = self.function()
        if getattr(function, FACTORY_MARK, False):
            return function(settings)
        return KwargsHandler(function, concurrency=settings.concurrency, name=self.handler)

    def refusal(self) -> Refusal | None:
        """What the worker refuses without a call (FAILED at once); none by default."""
        return None

    def check_static(self) -> None:
        """What can be checked without the database: the handler imports and is callable."""
        self.function()
