"""Fixtures of the Dagster tests: an environment pointing the code location at the test's database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.seed import seed_customers
from batch_assets.settings import Settings, load_settings

RUN_DATE = date(2025, 6, 1)


@pytest.fixture
def dagster_env(db_url: str, key_text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """This process's environment set for the test database, a key and a temporary DAGSTER_HOME."""
    for name in ("BATCH_ASSETS_REDIS_URL", "BATCH_ASSETS_LIMITS_URL", "BATCH_ASSETS_ALERT_WEBHOOK",
                 "BATCH_ASSETS_DAGSTER_PG_URL", "BATCH_ASSETS_TIMEZONE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BATCH_ASSETS_DATABASE_URL", db_url)
    monkeypatch.setenv("BATCH_ASSETS_ENCRYPTION_KEY", key_text)
    monkeypatch.setenv("BATCH_ASSETS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    # The tests' fixed run date (2025-06-01) lies outside the default window of ±366 days from today.
    monkeypatch.setenv("BATCH_ASSETS_RUN_DATE_WINDOW_DAYS", "36500")
    yield load_settings()


@pytest.fixture
def seeded(engine: sa.Engine, cipher: DobCipher) -> int:
    """2,000 ACTIVE customers (a few malformed), none computed yet."""
    report = seed_customers(engine, cipher, 2000, run_date=RUN_DATE, bad_fraction=0.01, seed=3)
    return report.rows


@pytest.fixture
def project_instance(dagster_env: Settings) -> Any:
    """The instance the project's own dagster.yaml gives (what `batch-assets` writes into DAGSTER_HOME): the
    batch_assets run coordinator and the queue's limits."""
    import os

    import dagster as dg

    from batch_assets.orchestration.instance_home import instance_template

    home = Path(os.environ["DAGSTER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_bytes(instance_template("dagster.yaml"))
    return dg.DagsterInstance.get()
