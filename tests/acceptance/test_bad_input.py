"""Acceptance (issue 8): bad input exits 2 with one clear line and nothing written."""

from __future__ import annotations

import pytest
from _cli import EXIT_USAGE, customers_snapshot, ok, rows, run_cli, scalar, seed_customers, today_utc

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _history(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM ba_run_history")


def _assert_usage_error(result, field: str) -> None:
    assert result.returncode == EXIT_USAGE, result.describe()
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: ") and field in lines[-1], result.describe()
    assert "Traceback" not in result.stderr, result.describe()


BAD_THRESHOLDS = ["MINOR=0,A=²", "MINOR=0,A=--18", "MINOR=0,A=１８", "MINOR=0,A=18.5", "MINOR=0,A=1_8"]


def test_rules_set_with_non_ascii_or_malformed_ages_is_refused(cli_env, engine) -> None:
    """Superscripts, double signs, full-width digits: exit 2 naming thresholds, rules unchanged."""
    before = ok(cli_env, "rules", "show")
    for thresholds in BAD_THRESHOLDS:
        _assert_usage_error(run_cli(cli_env, "rules", "set", "--thresholds", thresholds), "thresholds")
    assert ok(cli_env, "rules", "show")["fingerprint"] == before["fingerprint"]
    assert scalar(engine, "SELECT count(*) FROM ba_rules") <= 1


SWEEP_CASES = [
    (["--run-date", "20261130"], "run_date"),
    (["--run-date", "2026-W48-1"], "run_date"),
    (["--run-date", "２０２６-１１-３０"], "run_date"),
    (["--run-date", "2070-01-01"], "run_date"),
    (["--run-date", "1926-01-01"], "run_date"),
    (["--workers", "1000000"], "workers"),
    (["--window", "100000"], "window"),
    (["--ranges", "100000"], "ranges"),
    (["--page-size", "１０"], "page-size"),
]


def test_sweep_bad_input_exits_2_with_nothing_written(cli_env, engine) -> None:
    """Malformed or distant run dates and unbounded knobs: exit 2, one line naming the field, no row touched."""
    seed_customers(cli_env, 200, "--seed", "5")
    before = customers_snapshot(engine)
    for extra, field in SWEEP_CASES:
        result = run_cli(cli_env, "sweep", "customer-status", "--mode", "full", *extra)
        _assert_usage_error(result, field)
        assert result.summary is not None and result.summary["status"] == "FAILURE"
    assert customers_snapshot(engine) == before and _history(engine) == 0


def test_a_distant_run_date_needs_the_explicit_flag(cli_env, engine) -> None:
    """--allow-distant-run-date lets a run date outside the window through; the window is configurable."""
    seed_customers(cli_env, 50, "--seed", "6")
    distant = today_utc().replace(year=today_utc().year - 3).isoformat()
    ok(cli_env, "sweep", "customer-status", "--mode", "full", "--run-date", distant, "--allow-distant-run-date")
    wider = {**cli_env, "BATCH_ASSETS_RUN_DATE_WINDOW_DAYS": "2000"}
    ok(wider, "sweep", "customer-status", "--mode", "full", "--run-date", distant)
    _assert_usage_error(run_cli({**cli_env, "BATCH_ASSETS_RUN_DATE_WINDOW_DAYS": "lots"}, "rules", "show"),
                        "BATCH_ASSETS_RUN_DATE_WINDOW_DAYS")


URL_CASES = [
    ("BATCH_ASSETS_REDIS_URL", "redis//127.0.0.1:6379", ["sweep", "customer-status", "--mode", "delta"]),
    ("BATCH_ASSETS_REDIS_URL", "redis://127.0.0.1:99999/0", ["subscriptions", "expire"]),
    ("BATCH_ASSETS_LIMITS_URL", "ftp://127.0.0.1/limits", ["queue", "work", "--max-seconds", "1"]),
    ("BATCH_ASSETS_LIMITS_URL", "http:///no-host", ["queue", "work", "--max-seconds", "1"]),
    ("BATCH_ASSETS_ALERT_WEBHOOK", "not a url", ["sweep", "customer-status", "--mode", "delta"]),
]


def test_malformed_urls_fail_before_any_run_starts(cli_env, engine) -> None:
    """A malformed URL in the environment is exit 2 naming the variable, before any Dagster run exists."""
    for variable, value, command in URL_CASES:
        result = run_cli({**cli_env, variable: value}, *command)
        _assert_usage_error(result, variable)
        assert value not in result.stderr and value not in result.stdout
    assert _history(engine) == 0
    assert rows(engine, "SELECT name FROM ba_job_locks") == []


def test_expiry_bad_run_dates_exit_2(cli_env, engine) -> None:
    """subscriptions expire refuses week dates and distant dates like the sweep does."""
    ok(cli_env, "seed", "subscriptions", "--rows", "20")
    before = rows(engine, "SELECT id, status FROM subscriptions ORDER BY id")
    for bad in ("2026-W48-1", "2070-01-01"):
        _assert_usage_error(run_cli(cli_env, "subscriptions", "expire", "--run-date", bad), "run_date")
    assert rows(engine, "SELECT id, status FROM subscriptions ORDER BY id") == before
