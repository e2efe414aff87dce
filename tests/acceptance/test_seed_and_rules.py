"""Acceptance: a re-seed with a used seed is refused before writing; `rules set` merges one threshold."""

from __future__ import annotations

import pytest
from _cli import EXIT_USAGE, ok, run_cli, scalar, seed_customers

from batch_assets.reference.customer_status.seed import first_seeded_id

pytestmark = [pytest.mark.integration]


def _rules(env) -> str:
    listed = ok(env, "rules", "show")["rules"]
    return ",".join(f"{r['category']}={r['min_age']}" for r in listed)


def test_a_seed_already_in_the_table_is_refused_before_writing_and_says_so(cli_env, engine) -> None:
    """The same --seed makes the same ids: the second run exits 2 with one line naming `seed`, writes nothing,
    and never prints "seeded"; another seed adds distinct rows."""
    first = seed_customers(cli_env, 300, "--seed", "7")
    assert first["rows"] == 300 and scalar(engine, "SELECT count(*) FROM customers") == 300
    assert scalar(engine, "SELECT count(*) FROM customers WHERE id = :id", id=first_seeded_id(7)) == 1

    again = run_cli(cli_env, "seed", "customers", "--rows", "600", "--seed", "7")
    assert again.returncode == EXIT_USAGE, again.describe()
    lines = [line for line in again.stderr.splitlines() if line.strip()]
    assert lines == [lines[-1]] and lines[-1].startswith("error: seed: ") and "Traceback" not in again.stderr
    assert "seeded" not in again.stderr, again.describe()
    assert scalar(engine, "SELECT count(*) FROM customers") == 300

    other = seed_customers(cli_env, 200, "--seed", "8")
    assert other["rows"] == 200 and scalar(engine, "SELECT count(*) FROM customers") == 500


def test_seeded_is_printed_only_after_the_commit(cli_env, engine) -> None:
    """Progress during the COPY says rows were sent, not seeded; "seeded N" comes once, after the commit."""
    result = run_cli(cli_env, "seed", "customers", "--rows", "50000", "--seed", "3", timeout=300)
    assert result.returncode == 0, result.describe()
    progress = [line for line in result.stderr.splitlines() if "50,000" in line]
    assert progress[0].startswith("copying customers: 50,000 of 50,000 sent"), result.describe()
    assert [line for line in result.stderr.splitlines() if line.startswith("seeded")] == [progress[-1]]
    assert progress[-1].startswith("seeded 50,000 customers in ")


def test_a_collision_the_check_cannot_see_rolls_the_whole_copy_back(engine, cipher) -> None:
    """A row of the seed's sequence other than the first already there: ConfigError naming seed, nothing added."""
    from datetime import date

    from batch_assets.errors import ConfigError
    from batch_assets.reference.customer_status.seed import seed_customers as seed_rows

    seed_rows(engine, cipher, 20, run_date=date(2026, 12, 1), seed=11)
    with engine.begin() as conn:  # the first id is free again, the 19 others are not
        conn.exec_driver_sql("DELETE FROM customers WHERE id = %(id)s", {"id": first_seeded_id(11)})
    with pytest.raises(ConfigError, match="nothing was written") as raised:
        seed_rows(engine, cipher, 20, run_date=date(2026, 12, 1), seed=11)
    assert raised.value.field == "seed"
    assert scalar(engine, "SELECT count(*) FROM customers") == 19


def test_rules_set_with_one_threshold_changes_that_rule_and_keeps_the_others(cli_env, engine) -> None:
    shown = ok(cli_env, "rules", "set", "--thresholds", "YOUNG_ADULT=21")
    assert shown["rules"] == "MINOR=0,YOUNG_ADULT=21,ADULT=26,SENIOR=65" and shown["changes"] == "YOUNG_ADULT 18->21"
    assert _rules(cli_env) == "MINOR=0,YOUNG_ADULT=21,ADULT=26,SENIOR=65"
    ok(cli_env, "rules", "set", "--thresholds", "SENIOR=67")  # merged onto the last change, not the defaults
    assert _rules(cli_env) == "MINOR=0,YOUNG_ADULT=21,ADULT=26,SENIOR=67"

    refused = run_cli(cli_env, "rules", "set", "--thresholds", "YOUNG_ADULT=30")  # would pass ADULT=26
    assert refused.returncode == EXIT_USAGE, refused.describe()
    last = [line for line in refused.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("error: thresholds: ") and "YOUNG_ADULT=30 then ADULT=26" in last
    assert _rules(cli_env) == "MINOR=0,YOUNG_ADULT=21,ADULT=26,SENIOR=67"
    assert scalar(engine, "SELECT count(*) FROM ba_rules") == 2

    ok(cli_env, "rules", "set", "--replace", "--thresholds", "MINOR=0,ADULT=18")  # removes two categories
    assert _rules(cli_env) == "MINOR=0,ADULT=18"
