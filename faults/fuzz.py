"""Bad-input fuzzing: every command and every Config field.

A bad input must give exit 2, one clear line on stderr, and nothing written: the
checksum of every table of the database is compared before and after. Config
fields the CLI does not expose are built directly (as the Dagster launchpad
would) and must be refused by the config's own validation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from faults.product import CliResult

FUZZ_DB = "fuzz"

BAD_DATES = ("20261130", "2026-W48-1", "2070-01-01", "2026-02-30", "26-12-01", "２０２６-１２-０１", "2026-12-01T00:00",
             "1900-01-01")
BAD_INTS = ("-1", "1000000", "abc", "1e3", "１６", "99999999999999999999")


def cases(run_date: str, *, quick: bool) -> list[tuple[str, list[str], dict[str, str | None]]]:
    """(label, args, environment changes); every one is bad input."""
    sweep = ["sweep", "customer-status", "--mode", "delta", "--run-date", run_date]
    out: list[tuple[str, list[str], dict[str, str | None]]] = []
    for d in BAD_DATES:
        out.append((f"sweep --run-date {d}", ["sweep", "customer-status", "--mode", "full", "--run-date", d], {}))
    out.append(("subscriptions expire --run-date 20261130", ["subscriptions", "expire", "--run-date", "20261130"], {}))
    out.append(("subscriptions expire --run-date 2070-01-01", ["subscriptions", "expire", "--run-date", "2070-01-01"],
                {}))
    out.append(("seed customers --run-date 2026-W48-1",
                ["seed", "customers", "--rows", "10", "--run-date", "2026-W48-1"], {}))
    for flag in ("--workers", "--window", "--page-size", "--ranges"):
        for value in BAD_INTS if not quick else ("1000000", "-1"):
            out.append((f"sweep {flag} {value}", [*sweep, flag, value], {}))
    out.append(("sweep --mode sideways", ["sweep", "customer-status", "--mode", "sideways"], {}))
    for thresholds in ("MINOR=0,A=²", "MINOR=0,A=--18", "MINOR=0,A=１８", "MINOR=0,A=18,B=10", "MINOR=5",
                       "MINOR=0,a b=3", "MINOR=0,A=99999999999999999999", "", "MINOR=0,MINOR=4", "MINOR=0,A=18.5"):
        out.append((f"rules set --thresholds {thresholds!r}", ["rules", "set", "--thresholds", thresholds], {}))
    for value in ("1000000", "-1", "x"):
        out.append((f"queue work --concurrency {value}", ["queue", "work", "--concurrency", value], {}))
    for value in ("-5", "nan", "inf", "1e300"):
        out.append((f"queue work --max-seconds {value}", ["queue", "work", "--max-seconds", value], {}))
    for value in ("0", "-3", "1000000000000", "x"):
        out.append((f"queue enqueue --count {value}", ["queue", "enqueue", "--count", value], {}))
    out.append(("queue dlq replay --id not-a-uuid", ["queue", "dlq", "replay", "--id", "not-a-uuid"], {}))
    out.append(("queue dlq list --limit 1000000000000", ["queue", "dlq", "list", "--limit", "1000000000000"], {}))
    for value in ("1000000000", "-1", "x"):
        out.append((f"outbox relay --batch-size {value}", ["outbox", "relay", "--batch-size", value], {}))
    for value in ("1000000000000", "-2"):
        out.append((f"seed customers --rows {value}", ["seed", "customers", "--rows", value], {}))
    for flag, value in (("--due-fraction", "2"), ("--due-fraction", "nan"), ("--bad-fraction", "-0.1")):
        out.append((f"seed customers {flag} {value}", ["seed", "customers", "--rows", "10", flag, value], {}))
    out.append(("seed subscriptions --expired-fraction 7",
                ["seed", "subscriptions", "--rows", "10", "--expired-fraction", "7"], {}))
    out.append(("seed payments --rows 1000000000000", ["seed", "payments", "--rows", "1000000000000"], {}))
    for url in ("redis//127.0.0.1:6379", "http://127.0.0.1:6379", "redis://127.0.0.1:notaport/0"):
        out.append((f"BATCH_ASSETS_REDIS_URL={url} sweep", list(sweep), {"BATCH_ASSETS_REDIS_URL": url}))
    for url in ("ftp://127.0.0.1/limits", "file:///etc/passwd", "not a url"):
        out.append((f"BATCH_ASSETS_LIMITS_URL={url} queue work", ["queue", "work", "--max-seconds", "5"],
                    {"BATCH_ASSETS_LIMITS_URL": url}))
    out.append(("BATCH_ASSETS_TIMEZONE=Mars/Olympus sweep", ["sweep", "customer-status", "--mode", "delta"],
                {"BATCH_ASSETS_TIMEZONE": "Mars/Olympus"}))
    out.append(("BATCH_ASSETS_ENCRYPTION_KEY=short sweep", list(sweep), {"BATCH_ASSETS_ENCRYPTION_KEY": "c2hvcnQ"}))
    out.append(("BATCH_ASSETS_ENCRYPTION_KEY unset sweep", list(sweep), {"BATCH_ASSETS_ENCRYPTION_KEY": None}))
    out.append(("BATCH_ASSETS_DATABASE_URL=mysql://x sweep", list(sweep),
                {"BATCH_ASSETS_DATABASE_URL": "mysql://u@127.0.0.1/x"}))
    if quick:
        out = [c for c in out if c[0] in QUICK_CASES]
    return out


QUICK_CASES = {
    "sweep --run-date 20261130", "sweep --run-date 2070-01-01", "sweep --workers 1000000", "sweep --ranges 1000000",
    "rules set --thresholds 'MINOR=0,A=²'", "rules set --thresholds 'MINOR=0,A=１８'",
    "BATCH_ASSETS_REDIS_URL=redis//127.0.0.1:6379 sweep", "BATCH_ASSETS_LIMITS_URL=ftp://127.0.0.1/limits queue work",
    "queue enqueue --count 0",
}
"""CI's subset: one of each kind the issue names (date, bound, thresholds, URLs)."""


def checksum(engine: sa.Engine) -> str:
    """md5 over every table of the public schema (rows in a stable order): equal = nothing written."""
    parts = []
    with engine.connect() as conn:
        tables = [r[0] for r in conn.exec_driver_sql(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")]
        for table in tables:
            # Table names come from the catalogue of the campaign's own database, quoted.
            digest = conn.exec_driver_sql(
                f'SELECT md5(coalesce(string_agg(t::text, \'|\' ORDER BY t::text), \'\')) FROM "{table}" AS t'  # noqa: S608
            ).scalar()
            parts.append(f"{table}:{digest}")
    return ";".join(parts)


def judge(label: str, result: CliResult, same: bool) -> dict[str, Any]:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    problems = []
    if result.rc != 2:
        problems.append(f"exit {result.rc}")
    if len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines")
    if not same:
        problems.append("data written")
    return {"case": label, "rc": result.rc, "stderr": lines[0][:160] if lines else "",
            "stderr_lines": len(lines), "written": not same, "ok": not problems, "problems": problems}


def run_cli_fuzz(run: Callable[[list[str], dict[str, str | None]], CliResult], engine: sa.Engine, run_date: str,
                 *, quick: bool) -> list[dict[str, Any]]:
    results = []
    for label, args, env in cases(run_date, quick=quick):
        before = checksum(engine)
        result = run(args, env)
        results.append(judge(label, result, checksum(engine) == before))
    return results


# --- Config fields (what the Dagster launchpad accepts) ------------------------------------


def bad_values(annotation: Any, name: str) -> list[Any]:
    text = str(annotation)
    if "bool" in text:
        return ["maybe", 7]
    if "int" in text:
        return [-1, 10**12, "x", 1.5]
    if "float" in text:
        return [-1.0, math.nan, math.inf, 1e300, "x"]
    if name == "run_date":
        return list(BAD_DATES)
    if name == "mode":
        return ["sideways", ""]
    return ["\x00", "x" * 10_000]


def run_config_fuzz() -> list[dict[str, Any]]:
    """Build every Config class with each bad value of each field; it must be refused before any run: by the
    config's own validation, or, for a dated job's run date, by the check its first op makes against the calendar
    resource (the default one: the window of BATCH_ASSETS_RUN_DATE_WINDOW_DAYS) before any read or write."""
    import pydantic

    from batch_assets.errors import BatchAssetsError
    from batch_assets.orchestration.project import current
    from batch_assets.orchestration.resources import CalendarResource

    calendar = CalendarResource()

    classes = [spec.config for spec in current().own_specs()]
    results = []
    seen: set[type] = set()
    for cls in classes:
        if cls in seen:
            continue
        seen.add(cls)
        for name, info in cls.model_fields.items():
            for value in bad_values(info.annotation, name):
                shown = value if not isinstance(value, str) or len(value) < 20 else f"{value[:6]}…({len(value)} chars)"
                try:
                    config = cls(**{name: value})
                    calendar.check_run_date(config.to_settings())
                except (pydantic.ValidationError, BatchAssetsError, ValueError):
                    results.append({"case": f"{cls.__name__}.{name}={shown!r}", "ok": True})
                    continue
                except Exception as exc:  # any other exception is a crash, not a clear refusal
                    results.append({"case": f"{cls.__name__}.{name}={shown!r}", "ok": False,
                                    "problems": [f"crash {type(exc).__name__}"]})
                    continue
                results.append({"case": f"{cls.__name__}.{name}={shown!r}", "ok": False, "problems": ["accepted"]})
    return results
