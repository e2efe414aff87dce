"""What `dg scaffold defs batch_assets.SweepComponent NAME` (and the queue's) writes: a defs.yaml to edit.

Every required attribute gets a placeholder value that passes the component's own checks, with a comment saying
what it is; every optional one follows, commented out, with its default or an example. NAME (the folder dg
creates) becomes the declaration's `name` when it is a valid one. With `--format python`, Dagster's own
component.py is written instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg
import yaml

from batch_assets.names import NAME_RE
from batch_assets.settings_model import DEFAULT_CALL_TIMEOUT_S, MAX_CALL_TIMEOUT_S

PLAIN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:]*")
DATABASE_URL_TEMPLATE = "{{ env.BATCH_ASSETS_DATABASE_URL }}"


@dataclass(frozen=True)
class Attribute:
    """One attribute of the template: its name, a value to start from and what it is (the YAML comment)."""

    name: str
    value: Any
    comment: str


DATABASE_URL = Attribute(
    "database_url", DATABASE_URL_TEMPLATE,
    "The PostgreSQL database, a SQLAlchemy URL (a secret: never printed). Default: BATCH_ASSETS_DATABASE_URL.",
)

SWEEP_REQUIRED = (
    Attribute("name", "my_sweep", "The job's, the asset's and the lock's name: [a-z][a-z0-9_]{0,40}."),
    Attribute("table", "public.my_table", "The table to sweep: [schema.]table."),
    Attribute("key", "id", "Its key column: uuid, bigint or integer, unique and NOT NULL (a primary key)."),
    Attribute("columns", ["id", "my_input", "my_result"],
              "The columns read for each row and handed to compute, as a mapping."),
    Attribute("compute", "my_module:compute",
              "module:function, called as compute(row, run_date); returns a mapping of exactly the writes columns. "
              "A module beside this defs.yaml is found first, then on the Python path."),
    Attribute("writes", ["my_result"], "The columns compute returns and the sweep writes back: among columns, "
              "never the key."),
)
SWEEP_OPTIONAL = (
    DATABASE_URL,
    Attribute("where", "status = 'OPEN'",
              "Only the rows this SQL condition selects (trusted SQL, run with the job's database role)."),
    Attribute("due", "my_review_on",
              "A date column: NULL or on/before the run date means due. Enables mode delta (the due rows only)."),
    Attribute("sensitive", ["my_input"], "Columns whose values are never logged, nor put in metadata or events."),
    Attribute("event", "my_result_changed", "One outbox event of this type for each changed row."),
    Attribute("schedules", {"delta": "0 2 * * *", "full": "0 3 * * 0", "timezone": "UTC", "status": "STOPPED"},
              "Cron schedules per mode (delta needs due), their time zone (default BATCH_ASSETS_TIMEZONE), and "
              "whether they start RUNNING (default STOPPED in your project)."),
    Attribute("asset_key", "analytics/my_sweep", "The key of the sweep's asset, parts separated by '/' "
              "(default: the name)."),
    Attribute("source_asset_key", "public/my_table", "The key of the swept table's asset (default: schema/table, "
              "which every sweep over the table shares)."),
    Attribute("call_timeout_s", int(DEFAULT_CALL_TIMEOUT_S),
              f"The longest one compute call may take, in seconds (up to {MAX_CALL_TIMEOUT_S:g}); past it the row "
              "counts as compute_timeout and its late result is never written."),
)

QUEUE_REQUIRED = (
    Attribute("name", "my_queue", "The queue's name (its job is <name>_queue_job): [a-z][a-z0-9_]{0,40}."),
    Attribute("table", "public.my_tasks",
              "The table of work: [schema.]table with the queue's columns status, attempts, next_attempt_at, "
              "claimed_until, last_error and processed_at."),
    Attribute("key", "id", "Its key column: uuid, bigint or integer, unique and NOT NULL (a primary key)."),
    Attribute("columns", ["id", "my_payload"], "The columns passed to the handler as keyword arguments."),
    Attribute("handler", "my_module:handle",
              "module:function, called once per row with columns and attempts: returning means DONE, "
              "batch_assets.PermanentFailure FAILED at once, any other exception a retry after the backoff. "
              "A module beside this defs.yaml is found first, then on the Python path."),
)
QUEUE_OPTIONAL = (
    DATABASE_URL,
    Attribute("max_attempts", 5, "Attempts before a row is FAILED (1 to 1000)."),
    Attribute("backoff", {"base_s": 60, "max_s": 3600, "jitter": 0.1},
              "Delay after a failed attempt k: base_s * 2^(k-1) seconds, at most max_s, drawn within +-jitter."),
    Attribute("rate_limit_per_s", 50, "Handler calls per second across all workers (default: no limit)."),
    Attribute("concurrency", 8, "Handler calls in flight in one worker (1 to 256)."),
    Attribute("max_in_flight", 100, "Handler calls in flight across all workers (default: no limit)."),
    Attribute("claim_lease_s", 30, "Seconds a claimed row is held, renewed every third of it while held."),
    Attribute("priority", "priority", "A smallint or integer column: higher first, with aging (default: oldest "
              "due first)."),
    Attribute("call_timeout_s", int(DEFAULT_CALL_TIMEOUT_S),
              f"The longest one handler call may take, in seconds (up to {MAX_CALL_TIMEOUT_S:g}); past it the "
              "attempt is a transient failure (counted as timeout)."),
)


def _value(value: Any) -> str:
    """A value as YAML on one line: lists and mappings in flow style, a string plain when it reads back as itself
    and is a simple word (name, table, module:function), else double-quoted."""
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, str) and PLAIN_RE.fullmatch(value) and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)  # a JSON string or number is YAML too


def _comment(text: str, indent: str, width: int = 116) -> list[str]:
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width - len(indent) - 2:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return [f"{indent}# {line}" for line in lines]


def render(type_name: str, required: Sequence[Attribute], optional: Sequence[Attribute], name: str) -> str:
    """The defs.yaml text: the required attributes set (`name` to `name`), the optional ones commented out."""
    lines = [f"type: {type_name}", "attributes:"]
    for attribute in required:
        value = name if attribute.name == "name" else attribute.value
        lines += [*_comment(attribute.comment, "  "), f"  {attribute.name}: {_value(value)}"]
    lines += ["", "  # Optional: remove the '#' before an attribute to set it."]
    for attribute in optional:
        lines += [*_comment(attribute.comment, "  "), f"  # {attribute.name}: {_value(attribute.value)}"]
    return "\n".join(lines) + "\n"


def declaration_name(request: dg.ScaffoldRequest[Any], default: str) -> str:
    """The folder's name when it is a valid declaration name (lower-cased, '-' as '_'), else `default`."""
    candidate = request.target_path.name.lower().replace("-", "_")
    return candidate if NAME_RE.fullmatch(candidate) else default


class DeclarationScaffolder(dg.Scaffolder[Any]):
    """Writes the filled-in defs.yaml of one component (class attributes: its attributes and default name)."""

    required: Sequence[Attribute] = ()
    optional: Sequence[Attribute] = ()
    default_name = "my_job"

    def scaffold(self, request: dg.ScaffoldRequest[Any]) -> None:
        if request.scaffold_format != "yaml":
            dg.scaffold_component(request)  # Dagster's component.py
            return
        text = render(request.type_name, self.required, self.optional,
                      declaration_name(request, self.default_name))
        if request.append:  # another document in an existing defs.yaml (request.target_path is that file)
            with request.target_path.open("a", encoding="utf-8") as out:
                out.write("---\n" + text)
        else:
            (request.target_path / "defs.yaml").write_text(text, encoding="utf-8")


class SweepScaffolder(DeclarationScaffolder):
    """`dg scaffold defs batch_assets.SweepComponent NAME`."""

    required = SWEEP_REQUIRED
    optional = SWEEP_OPTIONAL
    default_name = "my_sweep"


class TableQueueScaffolder(DeclarationScaffolder):
    """`dg scaffold defs batch_assets.TableQueueComponent NAME`."""

    required = QUEUE_REQUIRED
    optional = QUEUE_OPTIONAL
    default_name = "my_queue"
