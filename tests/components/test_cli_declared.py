"""`jobs list` / `jobs run NAME --set ...` with a team's defs.yaml (docs/reference/declarations.md), as an outside
test drives them:
a subprocess with BATCH_ASSETS_DEFS_DIR, its exit code, its stderr line and its last JSON line; and the code
location, which loads the product's jobs whatever one broken declaration says."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
from _cli import EXIT_OK, EXIT_USAGE, run_cli  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "loyalty"
RUN_DATE = "2026-12-01"


def summary_of(result: Any) -> dict[str, Any]:
    assert result.summary is not None, result.describe()
    return result.summary


def test_jobs_list_and_run_full_then_delta(env: dict[str, str], accounts: sa.Engine) -> None:
    listed = run_cli(env, "jobs", "list")
    assert listed.returncode == EXIT_OK, listed.describe()
    jobs = {job["name"]: job for job in summary_of(listed)["jobs"]}
    assert "customer_status_sweep_job" in jobs and "loyalty_tier" in jobs
    fields = {f["name"]: f for f in jobs["loyalty_tier"]["fields"]}
    assert fields["mode"]["choices"] == ["delta", "full"] and {"run_date", "workers", "ranges"} <= set(fields)

    full = run_cli(env, "jobs", "run", "loyalty_tier", "--set", "mode=full", "--set", f"run_date={RUN_DATE}",
                   "--set", "workers=2")
    assert full.returncode == EXIT_OK, full.describe()
    line = summary_of(full)
    assert line["status"] == "SUCCESS" and line["mode"] == "full" and line["run_date"] == RUN_DATE
    assert (line["scanned"], line["changed"], line["failed"]) == (1000, 999, 1)
    assert line["failed_by_type"]["missing_points"] == 1 and line["conflicts"] == 0 and line["ranges"] == 4
    for key in ("run_id", "unchanged", "duration_s", "pages", "resumed_from", "audit_events"):
        assert key in line
    with accounts.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM accounts WHERE tier IS NOT NULL")).scalar_one() == 999
        history = conn.execute(sa.text("SELECT count(*) FROM ba_run_history WHERE job = 'loyalty_tier'")).scalar()
    assert history, "the run is a Dagster run of job loyalty_tier, recorded in run history"

    delta = run_cli(env, "jobs", "run", "loyalty_tier", "--set", "mode=delta", "--set", f"run_date={RUN_DATE}")
    assert delta.returncode == EXIT_OK, delta.describe()
    assert (summary_of(delta)["scanned"], summary_of(delta)["changed"]) == (1, 0), "only the failed row is still due"

    bad = run_cli(env, "jobs", "run", "loyalty_tier", "--set", "mode=config-change")
    assert bad.returncode == EXIT_USAGE and "mode" in bad.stderr, bad.describe()


BROKEN = {
    "unknown attribute": ("  colour: blue\n", "colour"),
    "a column that does not exist": ("columns: [id, points, tier, tier_review_on]",
                                     "columns: [id, points, tier, tier_review_on, nickname]", "columns"),
    "writes not among columns": ("writes: [tier, tier_review_on]", "writes: [tier, tier_review_on, status]", "writes"),
    "compute not importable": ("compute: tiers:compute", "compute: tiers_gone:compute", "compute"),
    "due not a date column": ("due: tier_review_on", "due: tier", "due"),
    # A declaration may not be hostile either (docs/reference/declarations.md).
    "where closing its own parentheses": ("where: \"status = 'OPEN'\"", "where: \"status = 'CLOSED') OR (true\"",
                                          "where"),
    "where holding a second statement": ("where: \"status = 'OPEN'\"",
                                         "where: \"status = 'OPEN'); UPDATE accounts SET tier = 'X'; SELECT (true\"",
                                         "where"),
    "where that is no condition": ("where: \"status = 'OPEN'\"", "where: \"status = 'OPEN' ORDER BY id\"", "where"),
    "a sensitive key": ("sensitive: [points]", "sensitive: [id, points]", "sensitive"),
    "the name of the product's own sweep": ("name: loyalty_tier", "name: customer_status_sweep", "name"),
    "a template that does not render": ("table: accounts", "table: \"{{ accounts( }}\"", "table"),
}


def broken_text(case: tuple[str, ...]) -> str:
    text = (EXAMPLE / "defs.yaml").read_text()
    if len(case) == 2:
        return text + case[0]
    old, new, _ = case
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_a_declaration_that_cannot_work_is_exit_2_naming_file_and_attribute(
    env: dict[str, str], defs_dir: Path, accounts: sa.Engine, case: str
) -> None:
    spec = BROKEN[case]
    attribute = spec[-1]
    path = defs_dir / "loyalty" / "defs.yaml"
    path.write_text(broken_text(spec))
    with accounts.connect() as conn:
        before = conn.execute(sa.text("SELECT count(*) FROM ba_run_history")).scalar_one()
    for args in (("jobs", "list"), ("jobs", "run", "loyalty_tier", "--set", "mode=full")):
        result = run_cli(env, *args)
        assert result.returncode == EXIT_USAGE, result.describe()
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, result.describe()
        assert str(path) in lines[0] and f": {attribute}:" in lines[0], lines[0]
    with accounts.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM accounts WHERE tier IS NOT NULL")).scalar_one() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM ba_run_history")).scalar_one() == before, "nothing written"


def test_one_broken_declaration_does_not_keep_the_other_jobs_from_loading(
    defs_dir: Path, monkeypatch: pytest.MonkeyPatch, cli_env: dict[str, str]
) -> None:
    """The code location: the product's jobs and the working declaration load; the broken one is left out and
    named in the location's metadata."""
    broken = defs_dir / "broken"
    broken.mkdir()
    (broken / "defs.yaml").write_text(broken_text(BROKEN["unknown attribute"]).replace("loyalty_tier", "other_tier"))
    for name in ("BATCH_ASSETS_DATABASE_URL", "BATCH_ASSETS_ENCRYPTION_KEY", "BATCH_ASSETS_HOME"):
        monkeypatch.setenv(name, cli_env[name])
    monkeypatch.setenv("BATCH_ASSETS_DEFS_DIR", str(defs_dir))
    monkeypatch.setenv("BATCH_ASSETS_AUTOMATION", "off")
    from batch_assets.definitions import defs as load_defs

    loaded = load_defs()
    jobs = {job.name for job in loaded.resolve_all_job_defs()}
    assert {"customer_status_sweep_job", "loyalty_tier", "loyalty_tier_asset_job"} <= jobs
    assert "other_tier" not in jobs
    assert loaded.resolve_assets_def("loyalty_tier").keys
    schedules = {s.name: s for s in loaded.schedules or []}
    assert schedules["loyalty_tier_delta_schedule"].execution_timezone == "Europe/Berlin"
    assert {c.name for c in loaded.resolve_asset_graph().asset_check_keys if c.asset_key.path == ["loyalty_tier"]} \
        == {"loyalty_tier_rows_overdue", "loyalty_tier_failures_by_kind"}
    errors = json.dumps(loaded.metadata["declaration_errors"].value)
    assert str(broken / "defs.yaml") in errors and "colour" in errors
