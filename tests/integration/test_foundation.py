"""URL resolution, key handling, seeding and the CLI's errors, on a real database."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import date
from pathlib import Path

import pytest
import sqlalchemy as sa

from batch_assets.db.engine import normalize_url, resolve_database_url
from batch_assets.db.migrate import LIBRARY
from batch_assets.errors import ConfigError, DecryptError
from batch_assets.reference.customer_status.crypto import DobCipher, decode_key, load_key
from batch_assets.reference.customer_status.rules import DEFAULT_RULES, evaluate, parse_dob
from batch_assets.reference.customer_status.seed import seed_customers
from batch_assets.reference.migrations import REFERENCE
from batch_assets.settings import load_settings

RUN_DATE = date(2026, 11, 30)


def cli(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batch_assets.cli", *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
    )


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.unit
def test_url_from_variable_uses_psycopg3() -> None:
    """An explicit URL is used as given, with the psycopg 3 driver."""
    settings = load_settings({"BATCH_ASSETS_DATABASE_URL": "postgresql://u:pw@db.example:5433/app"})
    assert resolve_database_url(settings) == "postgresql+psycopg://u:pw@db.example:5433/app"
    assert not settings.embedded


@pytest.mark.unit
def test_non_postgres_url_is_config_error_naming_variable() -> None:
    """A URL for another database is a configuration error that names the variable."""
    with pytest.raises(ConfigError, match="BATCH_ASSETS_DATABASE_URL"):
        normalize_url("mysql://root@127.0.0.1/x")


@pytest.mark.unit
def test_key_required_with_explicit_url(tmp_path: Path) -> None:
    """With a database URL and no key, loading the key stops with a clear error."""
    settings = load_settings({"BATCH_ASSETS_DATABASE_URL": "postgresql://x@h/d", "BATCH_ASSETS_HOME": str(tmp_path)})
    with pytest.raises(ConfigError, match="BATCH_ASSETS_ENCRYPTION_KEY.*not set"):
        load_key(settings)


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["short", "!!!notbase64!!!", "QUJD"])
def test_malformed_key_is_rejected_without_echoing_it(bad: str) -> None:
    """A malformed key is a ConfigError whose message does not contain the key."""
    with pytest.raises(ConfigError) as info:
        decode_key(bad)
    assert bad not in str(info.value)


@pytest.mark.unit
def test_dev_key_generated_once_in_embedded_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Embedded mode generates a development key once, warns, and reuses it."""
    settings = load_settings({"BATCH_ASSETS_HOME": str(tmp_path)})
    first = load_key(settings)
    assert "generated a development key" in capsys.readouterr().err
    assert load_key(settings) == first
    assert "generated" not in capsys.readouterr().err
    assert (tmp_path / "dev.key").stat().st_mode & 0o077 == 0


@pytest.mark.integration
def test_seed_is_deterministic_and_every_ciphertext_decrypts(engine: sa.Engine, cipher: DobCipher) -> None:
    """Seeded rows decrypt to YYYY-MM-DD with the customer id as associated data; a seed repeats."""
    report = seed_customers(engine, cipher, 2_000, run_date=RUN_DATE, seed=11)
    assert report.rows == 2_000
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, status, encrypted_dob FROM customers ORDER BY id")).all()
    assert len(rows) == 2_000
    for cid, status, blob in rows:
        assert status == "ACTIVE"
        text = cipher.decrypt_text(cid, bytes(blob))
        assert len(text) == 10 and parse_dob(text) <= RUN_DATE
    # The id is the associated data: the ciphertext does not decrypt on another row.
    with pytest.raises(DecryptError, match="authentication failed"):
        cipher.decrypt_text(rows[1][0], bytes(rows[0][2]))
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM customers"))
    seed_customers(engine, cipher, 2_000, run_date=RUN_DATE, seed=11)
    with engine.connect() as conn:
        again = conn.execute(sa.text("SELECT id, encrypted_dob FROM customers ORDER BY id")).all()
    assert [(r[0], bytes(r[2])) for r in rows] == [(r[0], bytes(r[1])) for r in again]


@pytest.mark.integration
def test_seed_bad_fraction_produces_every_failure_kind(engine: sa.Engine, cipher: DobCipher) -> None:
    """--bad-fraction yields missing_data, invalid_value and decrypt_failure rows, as counted."""
    report = seed_customers(engine, cipher, 3_000, run_date=RUN_DATE, bad_fraction=0.1, seed=3)
    kinds = {"missing_data": 0, "invalid_value": 0, "decrypt_failure": 0}
    with engine.connect() as conn:
        for cid, blob in conn.execute(sa.text("SELECT id, encrypted_dob FROM customers")):
            if blob is None:
                kinds["missing_data"] += 1
                continue
            try:
                text = cipher.decrypt_text(cid, bytes(blob))
            except Exception:
                kinds["decrypt_failure"] += 1
                continue
            try:
                if parse_dob(text) > RUN_DATE:
                    kinds["invalid_value"] += 1
            except ValueError:
                kinds["invalid_value"] += 1
    assert kinds == report.bad_by_kind
    assert all(n > 50 for n in kinds.values())


@pytest.mark.integration
def test_seed_due_fraction_settles_the_rest(engine: sa.Engine, cipher: DobCipher) -> None:
    """With --due-fraction, due rows are due on the run date with a transition; the rest are settled."""
    report = seed_customers(engine, cipher, 2_000, run_date=RUN_DATE, due_fraction=0.05, seed=5)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, encrypted_dob, age_category, next_review_date FROM customers")).all()
    due = [r for r in rows if r.next_review_date <= RUN_DATE]
    assert len(due) == report.due and 50 < len(due) < 150
    for r in rows:
        result = evaluate(parse_dob(cipher.decrypt_text(r.id, bytes(r.encrypted_dob))), RUN_DATE, DEFAULT_RULES)
        if r.next_review_date <= RUN_DATE:
            assert result.category != r.age_category and result.category_since == RUN_DATE
        else:
            assert (result.category, result.next_review_date) == (r.age_category, r.next_review_date)


@pytest.mark.integration
def test_cli_migrate_twice_and_seed(cli_env: dict[str, str], empty_db_url: str) -> None:
    """`db migrate` is safe to run twice and `seed customers` loads the rows it reports."""
    env = dict(cli_env, BATCH_ASSETS_DATABASE_URL=empty_db_url)
    first = cli(env, "db", "migrate")
    assert first.returncode == 0, first.stderr
    assert last_json(first.stdout)["applied"] == [m.label for s in (LIBRARY, REFERENCE) for m in s.migrations()]
    second = cli(env, "db", "migrate")
    assert second.returncode == 0 and last_json(second.stdout)["applied"] == []
    seeded = cli(env, "seed", "customers", "--rows", "500", "--seed", "1", "--bad-fraction", "0.1")
    assert seeded.returncode == 0, seeded.stderr
    assert last_json(seeded.stdout)["rows"] == 500
    engine = sa.create_engine(empty_db_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM customers")).scalar() == 500
    engine.dispose()


@pytest.mark.integration
def test_cli_unreachable_database_is_one_line_naming_host(cli_env: dict[str, str]) -> None:
    """An unreachable database gives one error line naming the host and the cause, no traceback."""
    env = dict(cli_env, BATCH_ASSETS_DATABASE_URL="postgresql://postgres:s3cret@127.0.0.1:1/nowhere")
    result = cli(env, "db", "migrate")
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "127.0.0.1:1" in lines[0] and "refused" in lines[0].lower()
    assert "s3cret" not in result.stderr + result.stdout


@pytest.mark.integration
def test_cli_bad_key_and_bad_arguments_exit_2(cli_env: dict[str, str]) -> None:
    """A malformed key or an out-of-range argument exits 2 with nothing written."""
    bad_key = cli(dict(cli_env, BATCH_ASSETS_ENCRYPTION_KEY="bm90LWEta2V5"), "seed", "customers", "--rows", "10")
    assert bad_key.returncode == 2
    assert "BATCH_ASSETS_ENCRYPTION_KEY" in bad_key.stderr and "bm90LWEta2V5" not in bad_key.stderr
    bad_arg = cli(cli_env, "seed", "customers", "--rows", "10", "--bad-fraction", "1.5")
    assert bad_arg.returncode == 2 and "bad-fraction" in bad_arg.stderr
    engine = sa.create_engine(cli_env["BATCH_ASSETS_DATABASE_URL"])
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM customers")).scalar() == 0
    engine.dispose()


@pytest.mark.integration
def test_cli_db_url_hides_password(cli_env: dict[str, str]) -> None:
    """`db url` prints the URL without the password."""
    env = dict(cli_env, BATCH_ASSETS_DATABASE_URL="postgresql://app:hunter2@127.0.0.1:5432/app")
    result = cli(env, "db", "url")
    assert result.returncode == 0
    assert "hunter2" not in result.stdout and "127.0.0.1:5432/app" in result.stdout


@pytest.mark.integration
def test_embedded_server_started_and_reused(tmp_path: Path) -> None:
    """With no URL, the embedded server starts under the home directory and is reused."""
    from batch_assets.db import embedded

    home = tmp_path / ("h" + uuid.uuid4().hex[:6])
    try:
        url = embedded.ensure_running(home)
        assert embedded.is_running(home)
        assert embedded.ensure_running(home) == url
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT current_database()")).scalar() == embedded.DATABASE_NAME
        engine.dispose()
    finally:
        assert embedded.stop(home)
    assert not embedded.is_running(home)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("seed", "payments", "--rows", "0"), "rows"),
        (("seed", "subscriptions", "--rows", "0"), "rows"),
        (("queue", "work", "--max-seconds", "-5"), "max_seconds"),
        (("sweep", "customer-status", "--mode", "full", "--page-size", "1001"), "page_size"),
    ],
)
def test_cli_rejects_bad_values_naming_the_field(cli_env: dict[str, str], args: tuple[str, ...], field: str) -> None:
    """A bad value exits 2 with one error line that names the field once, and nothing is written."""
    result = cli(cli_env, *args)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert field in line and "Value error" not in line and line.count(f"{field}:") <= 1
    engine = sa.create_engine(cli_env["BATCH_ASSETS_DATABASE_URL"])
    with engine.connect() as conn:
        for table in ("customers", "subscriptions", "payments", "ba_run_history"):
            assert conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar() == 0
    engine.dispose()
