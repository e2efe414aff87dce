"""Acceptance: connections killed in the middle of a sweep never end in SUCCESS with rows missing.

Reproduction of the report: seed, run `sweep customer-status --mode full` over several ranges, and end
every connection of the database with pg_terminate_backend a few seconds in. The CLI used to exit 0 with
SUCCESS and thousands of rows never computed. Whatever the run's outcome now, it is truthful, and the
next run leaves every row equal to what the age-category rule says (docs/reference/rules.md).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from _cli import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SKIPPED,
    SWEEP_KEYS,
    CliProcess,
    assert_summary_keys,
    classify,
    expire_locks,
    mismatches,
    run_cli,
    scalar,
    seed_customers,
    summary_run_date,
    wait_for,
)
from sqlalchemy.engine import make_url

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 60_000


def uncomputed(engine: sa.Engine) -> int:
    return scalar(engine, "SELECT count(*) FROM customers WHERE status = 'ACTIVE' AND next_review_date IS NULL")


def terminate_backends(admin: sa.Engine, engine: sa.Engine) -> int:
    with admin.connect() as conn:
        return conn.execute(
            sa.text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = :db AND pid <> pg_backend_pid()"),
            {"db": make_url(engine.url).database},
        ).scalar_one()


def test_backends_terminated_mid_sweep_never_report_success_with_rows_missing(
    cli_env, engine, admin_engine, cipher, tmp_path
):
    """pg_terminate_backend mid full sweep: SUCCESS only with every row computed; else FAILURE with its run id."""
    seeded = seed_customers(cli_env, ROWS, "--seed", "8", "--bad-fraction", "0.01")
    run_date = summary_run_date(seeded)
    args = ["sweep", "customer-status", "--mode", "full", "--run-date", run_date.isoformat(),
            "--ranges", "4", "--page-size", "200", "--workers", "1"]
    with CliProcess(cli_env, args, tmp_path) as proc:
        wait_for(lambda: ROWS - uncomputed(engine) >= 6000, timeout=180, what="6,000 rows computed", alive=proc)
        killed = terminate_backends(admin_engine, engine)
        result = proc.wait(timeout=300)
    assert killed >= 1, "the fault was not injected"
    summary = result.summary
    assert summary is not None, result.describe()
    assert_summary_keys(summary, SWEEP_KEYS)
    assert summary["run_id"], result.describe()
    if result.returncode == EXIT_OK:
        assert summary["status"] == "SUCCESS"
        assert summary["scanned"] == ROWS
        # Only the rows that cannot be evaluated (counted in `failed`) may stay uncomputed.
        assert uncomputed(engine) == summary["failed"], f"SUCCESS with rows never computed\n{result.describe()}"
        assert mismatches(engine, classify(engine, cipher, run_date), run_date) == []
    else:
        assert result.returncode == EXIT_FAILED and summary["status"] == "FAILURE", result.describe()
    # Recovery: the same command until it succeeds; then every row is what the age-category rule says.
    for _ in range(3):
        again = run_cli(cli_env, *args, timeout=300)
        if again.returncode == EXIT_SKIPPED:
            expire_locks(engine)
            continue
        assert again.returncode == EXIT_OK, again.describe()
        break
    assert mismatches(engine, classify(engine, cipher, run_date), run_date) == []
