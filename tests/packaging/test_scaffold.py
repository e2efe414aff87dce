"""`dg` knows the components: `dg list components` lists both, and `dg scaffold defs` writes a defs.yaml whose
attributes are a filled-in template (every required attribute set, with a comment, and every other one commented
out), which the component accepts as it is and with every optional line switched on."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from batch_assets import SweepComponent, TableQueueComponent
from batch_assets.orchestration.components.scaffold import SweepScaffolder
from batch_assets.settings import environ_without_product

pytestmark = pytest.mark.dagster

DG = Path(sys.executable).parent / "dg"
COMPONENTS = {"batch_assets.SweepComponent": SweepComponent, "batch_assets.TableQueueComponent": TableQueueComponent}
COMMENTED = re.compile(r"^  # ([a-z_]+): (.*)$")
"""An optional attribute of the template, commented out."""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The smallest dg project: a pyproject.toml naming it and its package with a defs folder."""
    root = tmp_path / "team_project"
    (root / "src" / "team_project" / "defs").mkdir(parents=True)
    (root / "src" / "team_project" / "__init__.py").write_text("")
    (root / "src" / "team_project" / "defs" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(
        '[project]\nname = "team-project"\nversion = "0.1.0"\n\n[tool.dg]\ndirectory_type = "project"\n\n'
        '[tool.dg.project]\nroot_module = "team_project"\n'
    )
    (tmp_path / "dagster_home").mkdir()
    (tmp_path / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return root


def _dg(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = environ_without_product()
    env.update(VIRTUAL_ENV=str(DG.parent.parent), PATH=f"{DG.parent}:{env.get('PATH', '')}", COLUMNS="200",
               DAGSTER_HOME=str(project.parent / "dagster_home"))
    done = subprocess.run([str(DG), *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"dg {' '.join(args)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def check_template(text: str, component: type[Any]) -> None:
    """The checks of a scaffolded defs.yaml (also run on the wheel's, tests/packaging/test_wheel.py)."""
    document = yaml.safe_load(text)
    attributes = document["attributes"]
    required = {name for name, field in component.model_fields.items() if field.is_required()}
    assert required <= set(attributes), f"required attributes missing: {sorted(required - set(attributes))}"
    lines = text.splitlines()
    for index, line in enumerate(lines):  # every attribute set or commented out has its comment line above it
        if re.match(r"^  (# )?[a-z_]+: ", line):
            assert lines[index - 1].startswith("  # ") and not COMMENTED.match(lines[index - 1]), line
    component.resolve_from_dict(attributes)  # the placeholders pass the component's own checks, as dg loads it

    optional = {m.group(1): yaml.safe_load(m.group(2)) for m in map(COMMENTED.match, lines) if m}
    missing = set(component.model_fields) - set(attributes) - set(optional)
    assert not missing, f"attributes of the component the template does not show: {sorted(missing)}"
    assert "database_url" in optional and optional["database_url"] == "{{ env.BATCH_ASSETS_DATABASE_URL }}"
    component.resolve_from_dict({**attributes, **optional})


def test_dg_lists_both_components(project: Path) -> None:
    """The dagster_dg_cli.registry_modules entry point: `dg list components` shows both, named as a defs.yaml names
    them."""
    listed = json.loads(_dg(project, "list", "components", "--json").stdout.strip().splitlines()[-1])
    keys = {item["key"] for item in listed["items"]}
    assert set(COMPONENTS) <= keys, keys


@pytest.mark.parametrize("type_name", sorted(COMPONENTS))
def test_dg_scaffold_defs_writes_a_filled_in_template(project: Path, type_name: str) -> None:
    """`dg scaffold defs TYPE NAME`: the folder's name becomes the declaration's, every required attribute has a
    placeholder the component accepts, every other attribute is there commented out."""
    _dg(project, "scaffold", "defs", type_name, "nightly_refresh")
    text = (project / "src" / "team_project" / "defs" / "nightly_refresh" / "defs.yaml").read_text()
    assert yaml.safe_load(text)["type"] == type_name
    assert yaml.safe_load(text)["attributes"]["name"] == "nightly_refresh"
    check_template(text, COMPONENTS[type_name])


@pytest.mark.unit
def test_a_folder_name_that_is_no_declaration_name_gets_the_default(tmp_path: Path) -> None:
    """A NAME that is not [a-z][a-z0-9_]{0,40} (after lower case and '-' to '_') leaves the placeholder name, and
    `--append` adds a second document to an existing defs.yaml."""
    target = tmp_path / "2024 Refresh"
    target.mkdir()
    request = dg.ScaffoldRequest(type_name="batch_assets.SweepComponent", target_path=target,
                                 scaffold_format="yaml", project_root=None, params=None)
    SweepScaffolder().scaffold(request)
    first = (target / "defs.yaml").read_text()
    assert yaml.safe_load(first)["attributes"]["name"] == "my_sweep"
    SweepScaffolder().scaffold(dg.ScaffoldRequest(
        type_name="batch_assets.SweepComponent", target_path=target / "defs.yaml", scaffold_format="yaml",
        project_root=None, params=None, append=True))
    documents = list(yaml.safe_load_all((target / "defs.yaml").read_text()))
    assert len(documents) == 2 and documents[0] == documents[1]


@pytest.mark.unit
@pytest.mark.parametrize("type_name", sorted(COMPONENTS))
def test_the_template_shows_every_attribute_of_the_component(tmp_path: Path, type_name: str) -> None:
    """The scaffolders' templates, written without dg: an attribute added to a component and not to its template
    (call_timeout_s was) fails here, in the quick suite, not only where dg runs."""
    from batch_assets.orchestration.components.scaffold import TableQueueScaffolder

    scaffolder = SweepScaffolder() if type_name.endswith("SweepComponent") else TableQueueScaffolder()
    scaffolder.scaffold(dg.ScaffoldRequest(type_name=type_name, target_path=tmp_path, scaffold_format="yaml",
                                           project_root=None, params=None))
    check_template((tmp_path / "defs.yaml").read_text(), COMPONENTS[type_name])
