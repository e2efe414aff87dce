"""The declared dependencies are ranges, each with a lower bound that lowest-constraints.txt pins (the set the
lowest-bounds check installs), and the extras are what the feature checks name."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from batch_assets.extras import OPTIONAL_MODULES

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
LOWEST = REPO / "tests" / "packaging" / "lowest-constraints.txt"


TOOLS = {"dev", "docs"}
"""The extras of this repository's own tools (tests, lint, docs site): not what the package runs on."""


def _runtime_requirements() -> list[Requirement]:
    """The core dependencies and those of every extra the package runs with."""
    extras = PROJECT["optional-dependencies"]
    lines = [*PROJECT["dependencies"], *(line for name, group in extras.items() if name not in TOOLS for line in group)]
    return [Requirement(line) for line in lines]


def _lowest() -> dict[str, str]:
    pins = {}
    for line in LOWEST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            [spec] = requirement.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def test_every_dependency_is_a_range_whose_lower_bound_is_pinned_in_the_lowest_set() -> None:
    """No exact pin; every requirement has a `>=` lower bound, and lowest-constraints.txt pins exactly it."""
    lowest = _lowest()
    for requirement in _runtime_requirements():
        operators = {spec.operator for spec in requirement.specifier}
        assert "==" not in operators and ">=" in operators, f"{requirement}: a range with a lower bound"
        [lower] = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        pinned = lowest.get(canonicalize_name(requirement.name))
        assert pinned is not None and Version(pinned) == Version(lower), (requirement, pinned)


def test_python_versions() -> None:
    """Python 3.11, 3.12 and 3.13."""
    assert PROJECT["requires-python"] == ">=3.11,<3.14"


def test_every_extra_a_feature_names_exists_and_dev_takes_them_all() -> None:
    """The extras named by the missing-extra errors are declared, each brings the distribution the error names,
    and dev (what `make install` installs) takes every extra."""
    extras = PROJECT["optional-dependencies"]
    for module, extra in OPTIONAL_MODULES.items():
        assert extra.extra in extras, module
        names = {canonicalize_name(Requirement(line).name) for line in extras[extra.extra]}
        assert canonicalize_name(extra.distribution) in names, (module, extra)
    [own] = [Requirement(line) for line in extras["dev"] if canonicalize_name(Requirement(line).name) == "batch-assets"]
    assert own.extras == set(extras) - {"dev"}
