"""A team's own dg project in a folder, as `create-dagster project` lays one out: pyproject.toml with [tool.dg],
src/<module>/definitions.py loading the defs folder, and declarations in the defs folder with their functions."""

from __future__ import annotations

import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

TEAM_TABLES = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
INSERT INTO customers VALUES (1, 'ada'), (2, 'grace');
CREATE TABLE payments (id int PRIMARY KEY, total numeric);
INSERT INTO payments VALUES (1, 10.5);
CREATE TABLE outbox_events (id int PRIMARY KEY, body text);
INSERT INTO outbox_events VALUES (1, 'the team''s own event');
CREATE TABLE orders (id bigint PRIMARY KEY, amount int, risk text, risk_review_on date);
INSERT INTO orders SELECT g, g * 10, NULL, NULL FROM generate_series(1, 300) AS g;
CREATE TABLE outgoing_emails (
    id bigint PRIMARY KEY, recipient text, status text NOT NULL DEFAULT 'NEW', attempts int NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(), claimed_until timestamptz, last_error text,
    processed_at timestamptz);
INSERT INTO outgoing_emails (id, recipient) SELECT g, 'user' || g || '@example.com' FROM generate_series(1, 40) AS g;
"""
"""The team's database: its own customers, payments and outbox_events (names the reference project also uses, of
another shape, with rows), the table it sweeps and the table it queues."""

SWEEP = """
type: batch_assets.SweepComponent
attributes:
  name: order_risk
  table: orders
  key: id
  columns: [id, amount, risk, risk_review_on]
  due: risk_review_on
  compute: risk:compute
  writes: [risk, risk_review_on]
  event: risk_changed
  database_url: "{{ env.APP_DATABASE_URL }}"
  schedules: {delta: "0 2 * * *", timezone: Europe/Berlin}
"""

RISK = """
from datetime import timedelta


def compute(row, run_date):
    return {"risk": "high" if (row["amount"] or 0) > 1000 else "low",
            "risk_review_on": run_date + timedelta(days=30)}
"""

QUEUE = """
type: batch_assets.TableQueueComponent
attributes:
  name: emails
  table: outgoing_emails
  key: id
  columns: [id, recipient]
  handler: mail:send
  database_url: "{{ env.APP_DATABASE_URL }}"
"""

MAIL = """
def send(id, recipient, attempts):
    return None
"""


@dataclass(frozen=True)
class TeamProject:
    root: Path
    module: str

    @property
    def defs(self) -> Path:
        return self.root / "src" / self.module / "defs"

    def declare(self, folder: str, yaml_text: str, **modules: str) -> Path:
        """A defs.yaml in `defs/<folder>/`, with its function modules beside it."""
        place = self.defs / folder
        place.mkdir(parents=True, exist_ok=True)
        (place / "defs.yaml").write_text(textwrap.dedent(yaml_text).lstrip(), encoding="utf-8")
        for name, source in modules.items():
            (place / f"{name}.py").write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
        return place


def team_project(parent: Path, *, location: str = "team") -> TeamProject:
    """An empty dg project at `parent/<location>` whose root module has a name of its own (no cache across tests)."""
    module = f"team_{uuid.uuid4().hex[:8]}"
    root = parent / location
    package = root / "src" / module
    (package / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(textwrap.dedent(f"""
        [project]
        name = "{location}"
        version = "0.1.0"
        requires-python = ">=3.11"
        dependencies = ["dagster"]

        [tool.dg]
        directory_type = "project"

        [tool.dg.project]
        root_module = "{module}"
    """).lstrip(), encoding="utf-8")
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "defs" / "__init__.py").write_text("", encoding="utf-8")
    (package / "definitions.py").write_text(textwrap.dedent("""
        from pathlib import Path

        import dagster as dg


        @dg.definitions
        def defs():
            return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
    """).lstrip(), encoding="utf-8")
    return TeamProject(root, module)


def team_database(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(TEAM_TABLES)


def table_state(engine: sa.Engine, table: str) -> tuple[list, list]:
    """A table's columns (name, type, nullable, default) and its rows, in order."""
    with engine.connect() as conn:
        columns = conn.execute(sa.text(
            "SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name = :t ORDER BY ordinal_position"), {"t": table}).all()
        rows = conn.exec_driver_sql(f'SELECT * FROM "{table}" ORDER BY 1').all()  # noqa: S608 - test constant
    return [tuple(c) for c in columns], [tuple(r) for r in rows]
