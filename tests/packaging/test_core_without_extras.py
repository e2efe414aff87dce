"""The core install needs none of the extras: with every optional module made unimportable, the package, its code
location and its components load and the CLI works; a feature that needs an extra stops with one line naming it.

Each check runs in a subprocess whose `sitecustomize` sets `sys.modules[name] = None` for every optional top-level
module (what a venv without the extras amounts to: `import name` raises ModuleNotFoundError).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from batch_assets.extras import OPTIONAL_MODULES
from batch_assets.settings import environ_without_product

pytestmark = pytest.mark.integration

BLOCKED = sorted({*OPTIONAL_MODULES, "kombu", "amqp", "aiormq", "pandas", "dagster_graphql"})
"""The optional modules and what only they bring (celery's kombu and amqp, aio-pika's aiormq, pandas, which the
package no longer uses, and the webserver's GraphQL layer)."""
BIN = Path(sys.executable).parent
EXIT_USAGE = 2


@pytest.fixture
def bare_env(tmp_path: Path, db_url: str, key_text: str) -> dict[str, str]:
    """The environment of a process that cannot import any optional module, on this test's database."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import sys\n"
        f"for _name in {BLOCKED!r}:\n"
        "    sys.modules[_name] = None  # import _name: ModuleNotFoundError, as without the extra\n"
    )
    env = environ_without_product()
    env.update(
        PYTHONPATH=str(shim),
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        BATCH_ASSETS_HOME=str(tmp_path / "home"),
        BATCH_ASSETS_DATABASE_URL=db_url,
        BATCH_ASSETS_ENCRYPTION_KEY=key_text,
    )
    return env


def _run(env: dict[str, str], *command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _python(env: dict[str, str], code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return _run(env, sys.executable, "-c", textwrap.dedent(code), cwd=cwd)


def test_the_shim_blocks_every_optional_module(bare_env: dict[str, str], tmp_path: Path) -> None:
    """The check below would prove nothing if the optional modules were still importable."""
    done = _python(bare_env, f"""
        import importlib
        for name in {BLOCKED!r}:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError:
                continue
            raise SystemExit(f"{{name}} is importable")
        print("blocked")
    """, tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "blocked", done.stdout + done.stderr


def test_package_code_location_and_components_load_without_extras(
    bare_env: dict[str, str], tmp_path: Path,
) -> None:
    """batch_assets, its components (and their scaffolders) and this repository's code location, built whole (the
    reference jobs, the celery variant among them), import none of the optional modules."""
    done = _python(bare_env, """
        import batch_assets
        from batch_assets import PermanentFailure, RetryAfter, RowFailure, SweepComponent, TableQueueComponent
        import batch_assets.definitions as definitions
        from batch_assets.orchestration.components.scaffold import SweepScaffolder, TableQueueScaffolder

        repository = definitions.defs().get_repository_def()
        assert "customer_status_sweep_celery_job" in {job.name for job in repository.get_all_jobs()}
        print("loaded")
    """, tmp_path)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "loaded", done.stderr[-3000:]


def test_cli_works_without_extras(bare_env: dict[str, str], tmp_path: Path, engine) -> None:
    """`batch-assets --help` and `jobs list` (the reference jobs, and a declared sweep checked against the
    database) work in a process that cannot import any optional module."""
    import sqlalchemy as sa

    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE accounts (id bigint PRIMARY KEY, points integer, tier text)"))
    defs_dir = tmp_path / "defs" / "tier"
    defs_dir.mkdir(parents=True)
    (defs_dir / "tiers.py").write_text("def compute(row, run_date):\n    return {'tier': 'GOLD'}\n")
    (defs_dir / "defs.yaml").write_text(
        "type: batch_assets.SweepComponent\nattributes:\n  name: account_tier\n  table: accounts\n  key: id\n"
        "  columns: [id, points, tier]\n  compute: tiers:compute\n  writes: [tier]\n"
    )
    helped = _run(bare_env, str(BIN / "batch-assets"), "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "usage: batch-assets" in helped.stdout, helped.stderr[-3000:]

    listed = _run(bare_env, str(BIN / "batch-assets"), "jobs", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-3000:]
    names = {job["name"] for job in json.loads(listed.stdout.strip().splitlines()[-1])["jobs"]}
    assert "customer_status_sweep_job" in names

    declared = _run(dict(bare_env, BATCH_ASSETS_DEFS_DIR=str(tmp_path / "defs")), str(BIN / "batch-assets"),
                    "jobs", "list", cwd=tmp_path)
    assert declared.returncode == 0, declared.stderr[-3000:]
    assert "account_tier" in {job["name"] for job in json.loads(declared.stdout.strip().splitlines()[-1])["jobs"]}


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == EXIT_USAGE and len(lines) == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return lines[0]


def test_the_embedded_server_without_its_extra_names_the_variable_and_the_extra(
    bare_env: dict[str, str], tmp_path: Path,
) -> None:
    """With no database URL, a command that needs the database says to set BATCH_ASSETS_DATABASE_URL or install
    the embedded extra, in one line, exit 2, and starts nothing."""
    env = {k: v for k, v in bare_env.items() if k != "BATCH_ASSETS_DATABASE_URL"}
    line = _one_error_line(_run(env, str(BIN / "batch-assets"), "db", "url", cwd=tmp_path))
    assert line.startswith("error: BATCH_ASSETS_DATABASE_URL: ") and "pip install 'batch-assets[embedded]'" in line
    assert not (tmp_path / "home" / "pgdata").exists()


def test_bench_and_ui_without_their_extras_name_them(bare_env: dict[str, str], tmp_path: Path) -> None:
    """`bench` without matplotlib and `ui` without dagster-webserver: one line naming the extra, exit 2."""
    bench = _one_error_line(_run(bare_env, str(BIN / "batch-assets"), "bench", "--quick", cwd=tmp_path))
    assert "matplotlib" in bench and "pip install 'batch-assets[bench]'" in bench
    ui = _one_error_line(_run(bare_env, str(BIN / "batch-assets"), "ui", "--port", "3999", cwd=tmp_path))
    assert "dagster-webserver" in ui and "pip install 'batch-assets[ui]'" in ui


def test_dagster_storage_on_postgresql_without_its_extra_names_it(bare_env: dict[str, str], tmp_path: Path) -> None:
    """BATCH_ASSETS_DAGSTER_PG_URL set without dagster-postgres: one line naming the variable and the extra, exit 2,
    and no instance file that Dagster could not load."""
    env = dict(bare_env, BATCH_ASSETS_DAGSTER_PG_URL="postgresql://postgres@127.0.0.1:5432/postgres")
    line = _one_error_line(_run(env, str(BIN / "batch-assets"), "jobs", "list", cwd=tmp_path))
    assert line.startswith("error: BATCH_ASSETS_DAGSTER_PG_URL: ") and "[postgres-storage]'" in line, line
    assert not (tmp_path / "dagster_home" / "dagster.yaml").exists()


def test_redis_lock_and_celery_executor_without_their_extras_name_them(
    bare_env: dict[str, str], tmp_path: Path,
) -> None:
    """The Redis job lock and the celery executor, built without their libraries: a ConfigError naming the extra
    (a job using the executor still loads: its definition needs no dagster-celery)."""
    (tmp_path / "celery_probe.py").write_text(textwrap.dedent("""
        import dagster as dg
        from batch_assets.orchestration.celery import celery_on_redis_executor

        @dg.op
        def nothing() -> None: ...

        @dg.job(executor_def=celery_on_redis_executor)
        def on_celery() -> None:
            nothing()
    """))
    done = _python(dict(bare_env, PYTHONPATH=bare_env["PYTHONPATH"] + f":{tmp_path}"), """
        import dagster as dg
        from batch_assets.errors import ConfigError
        from batch_assets.locking.lock import RedisJobLock
        import celery_probe

        try:
            RedisJobLock("redis://127.0.0.1:6379/15")
        except ConfigError as exc:
            print(exc)
        with dg.instance_for_test() as instance:
            context = dg.InitExecutorContext(
                job=dg.reconstructable(celery_probe.on_celery), executor_def=celery_probe.celery_on_redis_executor,
                executor_config={"worker_wait_s": 30.0, "worker_lost_s": 30.0}, instance=instance)
            try:
                celery_probe.celery_on_redis_executor.executor_creation_fn(context)
            except ConfigError as exc:
                print(exc)
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lock, executor = done.stdout.strip().splitlines()[-2:]
    assert lock.startswith("BATCH_ASSETS_REDIS_URL: the Redis job lock needs redis") and "[redis]'" in lock, lock
    assert executor.startswith("the celery executor needs dagster-celery") and "[celery]'" in executor, executor
