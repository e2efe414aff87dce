"""Run metadata for people: numbers the Plots tab can chart, and small markdown tables.

These run once per run, on small aggregates (counts by status, by category, per range): a table is a
few rows of plain markdown, written here without pandas, whose import alone would cost a CLI run more
than a delta with nothing due does (start-up).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
import sqlalchemy as sa

from batch_assets.orchestration.resources import DatabaseResource

NUMERIC_KEYS = ("scanned", "changed", "unchanged", "failed")


def run_numbers(summary: Mapping[str, Any]) -> dict[str, int | float]:
    """scanned / changed / unchanged / failed as ints, duration_s and rows_per_s as floats (charted over time)."""
    numbers: dict[str, int | float] = {key: int(summary.get(key) or 0) for key in NUMERIC_KEYS}
    duration = float(summary.get("duration_s") or 0.0)
    numbers["duration_s"] = round(duration, 3)
    numbers["rows_per_s"] = round(numbers["scanned"] / duration, 1) if duration > 0 else 0.0
    return numbers


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, empty: str = "(none)") -> dg.MetadataValue:
    """Rows as a markdown table: whole numbers right-aligned with thousands separators, None blank."""
    def cell(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value).replace("|", "\\|").replace("\n", " ")

    shown = [[cell(v) for v in row] for row in rows] or [[empty, *("" for _ in columns[1:])]]
    numeric = [bool(rows) and all(isinstance(row[i], int) and not isinstance(row[i], bool) for row in rows)
               for i in range(len(columns))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in shown]
    return dg.MetadataValue.md("\n".join(lines))


def counts_table(engine: sa.Engine, query: sa.TextClause, *, label: str) -> tuple[dict[str, int], dg.MetadataValue]:
    """Rows by `label` from a (label, n) query: as numbers and as a table."""
    with engine.connect() as conn:
        rows = [(str(r[0]), int(r[1])) for r in conn.execute(query).all()]
    return dict(rows), markdown_table((label, "rows"), rows)


def records_table(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> dg.MetadataValue:
    """A list of dicts (e.g. one per cursor range) as a table of the given columns."""
    return markdown_table(columns, [[r.get(c) for c in columns] for r in records])


BUSINESS_TABLES = "business_tables"
"""The asset group of the tables other services write (observable source assets)."""


OBSERVED_TABLES: dict[str, str] = {}
"""Business table → its observation query (module constants), filled by `observable_table`."""
OBSERVE_TABLES_EVERY_S = 300
"""How often the observation sensor looks at the business tables."""


def table_numbers(engine: sa.Engine, query: str) -> tuple[str, dict[str, Any]]:
    """(data version, metadata) of a business table: row counts by status from a (status, n, latest) query."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(query).all()
    counts = {str(r.status): int(r.n) for r in rows}
    latest = max((r.latest for r in rows if r.latest), default="")
    version = ";".join(f"{k}={v}" for k, v in sorted(counts.items())) + f";{latest}"
    return version, {"rows": sum(counts.values()),
                     "rows_by_status": markdown_table(("status", "rows"), sorted(counts.items()))}


def observe_table(engine: sa.Engine, query: str) -> dg.ObserveResult:
    """Row counts by status (a (status, n, latest) query) as metadata; the data version changes whenever they do."""
    version, metadata = table_numbers(engine, query)
    return dg.ObserveResult(data_version=dg.DataVersion(version), metadata=metadata)


def observe_business_tables(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """An observation of every business table whose numbers changed since the last tick (no run is started)."""
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    engine = context.resources.database.get_engine()
    events = []
    for table, query in sorted(OBSERVED_TABLES.items()):
        version, metadata = table_numbers(engine, query)
        if seen.get(table) != version:
            events.append(dg.AssetObservation(asset_key=table, metadata=metadata,
                                              description="observed by business_tables_observation_sensor"))
            seen[table] = version
    skip = None if events else dg.SkipReason("no business table changed")
    return dg.SensorResult(asset_events=events, cursor=json.dumps(seen, sort_keys=True), skip_reason=skip)


def business_tables_observation_sensor(job: Any, status: dg.DefaultSensorStatus) -> dg.SensorDefinition:
    """Observes the business tables every OBSERVE_TABLES_EVERY_S s; `job` (their observation job) makes it their
    automation in the UI, but it starts no run: it reports the observations itself."""
    return dg.sensor(
        name="business_tables_observation_sensor",
        job=job,
        minimum_interval_seconds=OBSERVE_TABLES_EVERY_S,
        default_status=status,
        required_resource_keys={"database"},
        description=f"Observes the business tables (row counts by status) every {OBSERVE_TABLES_EVERY_S}s and "
        "records an observation for each table whose numbers changed; starts no run.",
    )(observe_business_tables)


def observable_table(table: str, query: str, description: str) -> dg.SourceAsset:
    """An observable source asset for a business table; `query` is a module constant, never input."""
    def _observe(database: DatabaseResource) -> dg.ObserveResult:
        return observe_table(database.get_engine(), query)

    OBSERVED_TABLES[table] = query

    with warnings.catch_warnings():
        # observable_source_asset is marked beta; the warning would print on every CLI command that
        # loads the code location's jobs, and it is not the user's to act on.
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.observable_source_asset(name=table, group_name=BUSINESS_TABLES, description=description)(_observe)
