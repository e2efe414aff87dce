"""A team's function named as `module:function`: found beside its declaration first, then on the Python path."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from batch_assets.errors import ConfigError


def load_function(spec: str, *, field: str, beside: Path | None = None) -> Callable[..., Any]:
    """`module:function` → the callable; anything not importable or not callable is a ConfigError naming `field`.

    With `beside` (the folder of a defs.yaml), a module file there (`module.py`, or a package folder) is the one
    loaded, whatever a module of that name elsewhere on the path holds: two declarations may each keep a
    `tiers.py` of their own."""
    module_name, sep, attr = str(spec).strip().partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"must be module:function, got {spec!r}", field=field)
    try:
        module = _module_beside(beside, module_name) if beside is not None else None
        if module is None:
            module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module itself failed while importing
        where = f" (beside {beside} or on the Python path)" if beside is not None else ""
        raise ConfigError(f"cannot import {module_name!r}{where} ({type(exc).__name__})", field=field) from None
    function: Any = module
    for part in attr.split("."):
        function = getattr(function, part, None)
        if function is None:
            raise ConfigError(f"{module_name!r} has no {attr!r}", field=field)
    if not callable(function):
        raise ConfigError(f"{spec!r} is not callable", field=field)
    return function


def _module_beside(folder: Path, module_name: str) -> ModuleType | None:
    """The module `module_name` from a file under `folder`, or None when there is none there."""
    base = folder.joinpath(*module_name.split("."))
    path = base / "__init__.py" if (base / "__init__.py").is_file() else base.with_suffix(".py")
    if not path.is_file():
        return None
    resolved = path.resolve()
    # A name of its own per file, so the same module name beside two declarations gives two modules.
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    unique = f"batch_assets_defs_{digest}_{module_name.replace('.', '_')}"
    loaded = sys.modules.get(unique)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(unique, resolved)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    # Its own imports of sibling files resolve from the folder (after everything else on the path).
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    sys.modules[unique] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(unique, None)
        raise
    return module
