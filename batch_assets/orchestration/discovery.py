"""Which code location a command acts on: like `dagster` and `dg`, the project whose pyproject.toml names it, found
from the working directory upwards (`[tool.dg]` or `[tool.dagster]`); this repository's own location otherwise.

A team's project is read the way Dagster loads it: its declarations are the `SweepComponent` and
`TableQueueComponent` instances of its component tree, built from its defs folder, templates resolved.
"""

from __future__ import annotations

import importlib
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batch_assets.errors import ConfigError, error_text

if TYPE_CHECKING:  # imported when a team's project is found: a command elsewhere imports no Dagster for this
    from batch_assets.orchestration.components.loader import Declarations
    from batch_assets.orchestration.project import Project

OWN_MODULE = "batch_assets.definitions"
"""This repository's code location: a pyproject.toml naming it is this repository's own."""


@dataclass(frozen=True)
class Location:
    """What a project's pyproject.toml says of its code location."""

    root: Path
    module: str
    name: str
    dg: bool
    """A dg project (`[tool.dg]`): its declarations are its component tree."""


def find_location(start: Path) -> Location | None:
    """The code location the nearest pyproject.toml (from `start` upwards) names, or None."""
    for folder in (start, *start.parents):
        pyproject = folder / "pyproject.toml"
        if not pyproject.is_file():
            continue
        try:
            tool = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{pyproject} cannot be read: {error_text(exc)}", field="pyproject.toml") from None
        dg = tool.get("dg") or {}
        if dg.get("directory_type") == "project" or dg.get("project"):
            project = dg.get("project") or {}
            root_module = project.get("root_module")
            module = project.get("code_location_target_module") or (f"{root_module}.definitions" if root_module
                                                                    else None)
            if module:
                return Location(folder, module, project.get("code_location_name") or folder.name, dg=True)
        dagster = tool.get("dagster") or {}
        if dagster.get("module_name"):
            module = str(dagster["module_name"])
            return Location(folder, module, dagster.get("code_location_name") or module, dg=False)
    return None


def discover(start: Path | None = None) -> Project | None:
    """The team's project the working directory is in, or None (this repository's own location)."""
    location = find_location((start or Path.cwd()).resolve())
    if location is None or location.module == OWN_MODULE:
        return None
    return team_project(location)


def team_project(location: Location) -> Project:
    from batch_assets.orchestration.defaults import TEAM
    from batch_assets.orchestration.project import Project

    for place in (location.root / "src", location.root):  # an src layout, or modules at the root
        if place.is_dir() and str(place) not in sys.path:
            sys.path.insert(0, str(place))
    cache: dict[str, Declarations] = {}

    def declarations() -> Declarations:
        if "found" not in cache:
            cache["found"] = _components(location)
        return cache["found"]

    return Project(name=location.name, module=location.module, attribute="defs", defaults=TEAM,
                   migrations=(), declarations=declarations, root=location.root)


def _components(location: Location) -> Declarations:
    """The project's declarations, loaded as Dagster loads them; a project that does not load is one error."""
    from batch_assets.orchestration.components.loader import DeclarationError, Declarations, Loaded, check_size
    from batch_assets.orchestration.components.sweep_component import SweepComponent
    from batch_assets.orchestration.components.table_queue import TableQueueComponent

    found = Declarations()
    try:
        tree: Any
        if location.dg:
            from dagster.components.core.component_tree import ComponentTree

            tree = ComponentTree.for_project(location.root)
            for defs_file in sorted(Path(tree.defs_module_path).rglob("defs.yaml")):
                check_size(defs_file)  # before Dagster parses any of them
        else:
            tree = getattr(_definitions_of(location.module), "component_tree", None)
        if tree is None:
            return found
        for loc, decl in tree._component_decl_tree().items():  # noqa: SLF001 — each component with its place
            if not isinstance(decl.component_type, type) or \
                    not issubclass(decl.component_type, (SweepComponent, TableQueueComponent)):
                continue
            path = Path(getattr(loc, "file_path", location.root))
            folder = path if path.is_dir() else path.parent
            try:
                component: Any = tree.load_component(loc)
            except Exception:
                found.errors.append(_declaration_error(folder / "defs.yaml"))
                continue
            found.components.append(Loaded(folder / "defs.yaml", component.located(folder)))
    except ConfigError as exc:
        found.errors.append(exc if isinstance(exc, DeclarationError)
                            else DeclarationError(location.root / "pyproject.toml", exc.field or "defs", str(exc)))
    except Exception as exc:  # noqa: BLE001 — the team's project failed to load: one line naming it
        found.errors.append(DeclarationError(location.root / "pyproject.toml", "defs",
                                             f"the code location {location.module} does not load: "
                                             f"{error_text(exc)}"))
    return found


def _declaration_error(path: Path) -> Any:
    """Why a declaration Dagster could not load cannot work, as the library's loader says it (one line naming the
    file and the attribute: the same checks, without the project's own template scopes)."""
    from batch_assets.orchestration.components.loader import DeclarationError, load_file

    try:
        load_file(path)
    except DeclarationError as exc:
        return exc
    return DeclarationError(path, "attributes", "the declaration does not load in this project")


def _definitions_of(module_name: str) -> Any:
    module = importlib.import_module(module_name)
    defs = getattr(module, "defs", None)
    return defs() if callable(defs) and not hasattr(defs, "get_repository_def") else defs
