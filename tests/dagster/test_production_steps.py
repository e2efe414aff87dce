"""The README's production steps, followed literally: every `batch-assets` command writes the instance file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "batch_assets.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.dagster
def test_db_migrate_writes_postgres_instance_file(cli_env: dict[str, str], db_url: str, tmp_path: Path) -> None:
    """`db migrate` in a fresh DAGSTER_HOME with the PostgreSQL variable set leaves the production instance file."""
    home = tmp_path / "fresh" / "dagster_home"
    env = {**cli_env, "DAGSTER_HOME": str(home), "BATCH_ASSETS_DAGSTER_PG_URL": db_url}
    done = cli(env, "db", "migrate")
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load((home / "dagster.yaml").read_text())
    assert config["storage"]["postgres"]["postgres_url"] == {"env": "BATCH_ASSETS_DAGSTER_PG_URL"}
    assert config["run_monitoring"]["enabled"] is True
    assert config["run_monitoring"]["max_resume_run_attempts"] == 0
    assert {"key": "batch_assets/kind", "value": "sweep", "limit": 1} in \
        config["concurrency"]["runs"]["tag_concurrency_limits"]
    assert "run_queue" not in config
    assert config["telemetry"] == {"enabled": False} and config["nux"] == {"enabled": False}


@pytest.mark.dagster
@pytest.mark.parametrize("args", [("rules", "show"), ("queue", "stats"), ("jobs", "list")])
def test_read_only_commands_write_instance_file(cli_env: dict[str, str], tmp_path: Path, args: tuple[str, ...]) -> None:
    """Read-only commands (rules show, queue stats, jobs list) also give a fresh DAGSTER_HOME its dagster.yaml."""
    home = tmp_path / "dagster_home"
    env = {**cli_env, "DAGSTER_HOME": str(home)}
    done = cli(env, *args)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load((home / "dagster.yaml").read_text())
    assert "storage" not in config  # no PostgreSQL variable: Dagster's SQLite default
    assert config["run_monitoring"]["enabled"] is True


@pytest.mark.dagster
def test_instance_file_validates_against_dagster_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both instance files load with Dagster's own instance schema: run monitoring and the concurrency section."""
    from dagster._core.instance.config import dagster_instance_config

    from batch_assets.orchestration.instance_home import TEMPLATES, instance_template

    monkeypatch.setenv("BATCH_ASSETS_DAGSTER_PG_URL", "postgresql://u@127.0.0.1:5432/d")
    for name in TEMPLATES:
        home = tmp_path / name
        home.mkdir()
        (home / "dagster.yaml").write_bytes(instance_template(name))
        config, _ = dagster_instance_config(str(home))
        assert config["run_monitoring"]["start_timeout_seconds"] == 180
        assert config["concurrency"]["runs"]["max_concurrent_runs"] == 10
