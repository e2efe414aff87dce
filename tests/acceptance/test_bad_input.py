"""Acceptance: bad input exits 2 with one clear line and nothing written."""

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


# --- empty values, loose numbers and dates, rules outside the age-category rule (docs/reference/rules.md)
# ----------------------

WRITTEN_TABLES = ("customers", "review_triggers", "outbox_events", "subscriptions", "enrollments", "payments",
                  "ba_rules", "ba_job_locks", "ba_leases", "ba_checkpoints", "ba_run_history")


def _written(engine) -> dict[str, tuple[int, int]]:
    """Per table: rows and the sum of their row versions (xmin), so an insert, update or delete shows."""
    return {
        table: tuple(rows(engine, f"SELECT count(*), coalesce(sum(xmin::text::bigint), 0) FROM {table}")[0])
        for table in WRITTEN_TABLES
    }


@pytest.fixture
def populated(cli_env, engine):
    """Customers, subscriptions and payments a wrongly accepted command would write to."""
    seed_customers(cli_env, 50, "--seed", "15")
    ok(cli_env, "seed", "subscriptions", "--rows", "20", "--seed", "15")
    ok(cli_env, "queue", "enqueue", "--count", "10", "--seed", "15")
    return engine


def _refused_each(cli_env, engine, cases) -> None:
    """Every case exits 2 with exactly one stderr line naming its field, and writes nothing to any table."""
    before = _written(engine)
    for args, field in cases:
        result = run_cli(cli_env, *args)
        _assert_usage_error(result, field)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, result.describe()
        assert _written(engine) == before, f"`{' '.join(args)}` wrote something\n{result.describe()}"


SWEEP = ("sweep", "customer-status", "--mode", "full")
SWEEP_JOB = ("jobs", "run", "customer_status_sweep_job", "--set", "mode=full")

EMPTY_CASES = [
    ([*SWEEP, "--run-date", ""], "run_date"),
    ([*SWEEP, "--run-date", " "], "run_date"),
    ([*SWEEP, "--workers", ""], "workers"),
    ([*SWEEP, "--window", " "], "window"),
    ([*SWEEP, "--page-size", ""], "page_size"),
    ([*SWEEP, "--ranges", ""], "ranges"),
    (["sweep", "customer-status", "--mode", ""], "mode"),
    (["subscriptions", "expire", "--run-date", ""], "run_date"),
    (["seed", "customers", "--rows", "10", "--run-date", ""], "run_date"),
    (["seed", "customers", "--rows", ""], "rows"),
    (["seed", "customers", "--rows", "10", "--seed", ""], "seed"),
    (["seed", "customers", "--rows", "10", "--due-fraction", ""], "due-fraction"),
    (["seed", "subscriptions", "--rows", "10", "--run-date", ""], "run_date"),
    (["seed", "payments", "--rows", "10", "--seed", " "], "seed"),
    (["queue", "enqueue", "--count", ""], "count"),
    (["queue", "enqueue", "--count", "5", "--priority", ""], "priority"),
    (["queue", "enqueue", "--count", "5", "--seed", ""], "seed"),
    (["queue", "work", "--drain", "--max-seconds", ""], "max-seconds"),
    (["queue", "work", "--drain", "--concurrency", " "], "concurrency"),
    (["queue", "dlq", "list", "--limit", ""], "limit"),
    (["queue", "dlq", "replay", "--id", ""], "id"),
    (["rules", "set", "--thresholds", ""], "thresholds"),
    (["rules", "set", "--thresholds", "MINOR=0,YOUNG_ADULT=21,"], "thresholds"),
    ([*SWEEP_JOB, "--set", "run_date="], "run_date"),
    ([*SWEEP_JOB, "--set", 'run_date=""'], "run_date"),
    ([*SWEEP_JOB, "--set", "workers="], "workers"),
    (["jobs", "run", "subscription_expiry_job", "--set", "run_date= "], "run_date"),
    (["outbox", "relay", "--batch-size", ""], "batch-size"),
    (["outbox", "relay", "--follow", "--max-seconds", ""], "max-seconds"),
    (["retention", "run", "--older-than-days", ""], "older_than_days"),
    (["retention", "run", "--batch-size", " "], "batch_size"),
]


def test_an_empty_value_is_refused_by_every_command_and_nothing_is_written(cli_env, populated) -> None:
    """An unset shell variable ('' or ' ') is never 'the default': exit 2, one line naming the field, no row."""
    _refused_each(cli_env, populated, EMPTY_CASES)


LOOSE_DATES = [" 2026-01-01", "2026-01-01 ", "2026-1-1", "２０２６-01-01", "2026-01-01T00:00", "2026-02-30"]


def test_a_run_date_must_be_exactly_yyyy_mm_dd_in_ascii_digits(cli_env, populated) -> None:
    """Spaces, missing zeros, full-width digits, a time or a date that does not exist: exit 2, nothing written."""
    cases = []
    for text in LOOSE_DATES:
        cases += [([*SWEEP, "--run-date", text], "run_date"),
                  (["subscriptions", "expire", "--run-date", text], "run_date"),
                  (["seed", "customers", "--rows", "10", "--run-date", text], "run_date")]
    cases.append(([*SWEEP_JOB, "--set", "run_date= 2026-01-01"], "run_date"))
    _refused_each(cli_env, populated, cases)


NUMBER_CASES = [
    ([*SWEEP, "--workers", "+2"], "workers"),
    ([*SWEEP, "--workers", " 2"], "workers"),
    ([*SWEEP, "--workers", "33"], "workers"),
    ([*SWEEP, "--page-size", "1_000"], "page_size"),
    ([*SWEEP, "--window", "٣"], "window"),
    (["seed", "customers", "--rows", "1_000"], "rows"),
    (["seed", "customers", "--rows", "10", "--seed", "+7"], "seed"),
    (["seed", "customers", "--rows", "10", "--bad-fraction", " 0.1"], "bad-fraction"),
    (["seed", "customers", "--rows", "10", "--bad-fraction", "０.1"], "bad-fraction"),
    (["seed", "subscriptions", "--rows", "10", "--expired-fraction", "1_0"], "expired-fraction"),
    (["seed", "payments", "--rows", "10", "--seed", "1_0"], "seed"),
    (["queue", "enqueue", "--count", "5", "--priority", "+5"], "priority"),
    (["queue", "enqueue", "--count", "5", "--priority", "1_0"], "priority"),
    (["queue", "enqueue", "--count", "5", "--priority", "40000"], "priority"),
    (["queue", "work", "--drain", "--max-seconds", "nan"], "max-seconds"),
    (["queue", "work", "--drain", "--max-seconds", "1e3"], "max-seconds"),
    (["queue", "work", "--drain", "--max-seconds", "700000"], "max_seconds"),
    (["queue", "work", "--drain", "--db-outage-s", "+5"], "db-outage-s"),
    (["outbox", "relay", "--batch-size", " 10"], "batch-size"),
    (["retention", "run", "--older-than-days", "+30"], "older_than_days"),
    (["retention", "run", "--older-than-days", "0"], "older_than_days"),
    ([*SWEEP_JOB, "--set", "workers=+2"], "workers"),
    ([*SWEEP_JOB, "--set", "workers= 2"], "workers"),
    ([*SWEEP_JOB, "--set", "workers=2.0"], "workers"),
    ([*SWEEP_JOB, "--set", "workers=true"], "workers"),
    ([*SWEEP_JOB, "--set", "lock_fail_open=yes"], "lock_fail_open"),
    (["jobs", "run", "payment_queue_drain_job", "--set", "max_seconds=NaN"], "max_seconds"),
]


def test_numbers_must_be_ascii_digits_within_their_bounds(cli_env, populated) -> None:
    """What int() and float() accept loosely ('+5', ' 5', '1_000', '٣', 'nan', 2.0 for a count) is exit 2."""
    _refused_each(cli_env, populated, NUMBER_CASES)


RULES_CASES = [
    "MINOR=0,YOUNG_ADULT=18,ADULT=200",
    "MINOR=0,YOUNG_ADULT=18,ADULT=131",
    "MINOR=0,YOUNG_ADULT=18,ADULT=18",
    "MINOR=0,YOUNG_ADULT=30,ADULT=26",
    "MINOR=5,ADULT=18",
]


def test_rules_outside_contract_section_5_are_refused_and_nothing_is_stored(cli_env, populated) -> None:
    """Ages above 130, not strictly increasing, or a first age other than 0: exit 2 naming thresholds, no rules row."""
    _refused_each(cli_env, populated, [(["rules", "set", "--thresholds", t], "thresholds") for t in RULES_CASES])
    assert scalar(populated, "SELECT count(*) FROM ba_rules") == 0
    ok(cli_env, "rules", "set", "--thresholds", "MINOR=0,YOUNG_ADULT=18,ADULT=26,SENIOR=130")  # the bound itself


def test_a_category_name_over_63_characters_is_refused_naming_the_limit(cli_env, populated) -> None:
    """A 300-character category: exit 2, the one line says the limit is 63; 63 characters are accepted."""
    long_name = "A" * 300
    result = run_cli(cli_env, "rules", "set", "--thresholds", f"MINOR=0,{long_name}=18")
    _assert_usage_error(result, "thresholds")
    assert "63" in result.stderr and "300" in result.stderr, result.describe()
    assert long_name not in result.stderr  # one readable line, not the whole value
    assert scalar(populated, "SELECT count(*) FROM ba_rules") == 0
    ok(cli_env, "rules", "set", "--replace", "--thresholds", f"MINOR=0,{'A' * 63}=18")


UNMIGRATED_COMMANDS = [
    ["rules", "show"],
    ["seed", "customers", "--rows", "10"],
    ["queue", "enqueue", "--count", "1"],
    ["queue", "stats"],
    ["sweep", "customer-status", "--mode", "delta"],
    ["subscriptions", "expire"],
]


def test_a_database_never_migrated_is_refused_naming_db_migrate(cli_env, empty_db_url) -> None:
    """Every command on a database `db migrate` never ran on: exit 2, one line naming the pending migrations and
    `batch-assets db migrate` (not "unexpected ProgrammingError"), a job's summary FAILURE, no table created; after
    `db migrate` the same command works."""
    import sqlalchemy as sa

    env = {**cli_env, "BATCH_ASSETS_DATABASE_URL": empty_db_url}
    for command in UNMIGRATED_COMMANDS:
        result = run_cli(env, *command)
        _assert_usage_error(result, "table" if command[0] == "queue" and command[1] != "enqueue" else "database")
        last = result.stderr.strip().splitlines()[-1]
        assert "batch_assets/0001_library" in last and "batch-assets db migrate" in last, last
        assert "unexpected" not in last, last
        if command[0] in ("sweep", "subscriptions"):
            assert result.summary is not None and result.summary["status"] == "FAILURE", result.describe()
    engine = sa.create_engine(empty_db_url, poolclass=sa.pool.NullPool)
    try:
        assert scalar(engine, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
        ok(env, "db", "migrate")
        assert ok(env, "rules", "show")["fingerprint"]
    finally:
        engine.dispose()
