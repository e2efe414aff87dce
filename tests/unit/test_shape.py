"""The package's shape: no module of batch_assets over 400 lines, and no import circle in batch_assets or faults.

Circles are found from the source with `ast`, counting every import statement wherever it stands: at module
level, inside a function or method (where circles used to hide: import-linter's layers contract sees such imports
but not a circle among the modules of one layer), and `importlib.import_module(...)` / `__import__(...)`
called with a string literal or a module-level string constant. The one exception is the body of
`if TYPE_CHECKING:`, which never runs. An import names its deepest module: `from a.b import c` is an import of
`a.b.c` when that is a module, else of `a.b`; importing `a.b.c` is not counted as importing the packages `a` and
`a.b` around it (as grimp and import-linter count them).
"""

from __future__ import annotations

import ast
import re
from collections import deque
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 400

PENDING_SPLIT: frozenset[str] = frozenset()
"""Modules over MAX_LINES that are being rewritten now; each leaves this list when its rewrite lands."""


def modules_of(package: str, root: Path = REPO) -> dict[str, Path]:
    """Every module of a top-level package under root, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """Module-level `NAME = "text"` assignments, so `import_module(NAME)` resolves like a literal."""
    constants: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            value, targets = node.value, node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            value, targets = node.value, [node.target]
        else:
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            constants.update({t.id: value.value for t in targets if isinstance(t, ast.Name)})
    return constants


class _Collector(ast.NodeVisitor):
    """Every import a module can execute, as (dotted name as written, or relative `(level, name)`), line."""

    def __init__(self, module: str, is_package: bool, constants: dict[str, str]) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.constants = constants
        self.names: list[tuple[str, tuple[str, ...], int]] = []  # (module, names imported from it, line)

    def _absolute(self, level: int, name: str | None) -> str:
        if level == 0:
            return name or ""
        base = self.package.split(".")
        base = base[: len(base) - (level - 1)]
        return ".".join([*base, name] if name else base)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:  # the `else:` of `if TYPE_CHECKING:` does run
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.names.extend((alias.name, (), node.lineno) for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = self._absolute(node.level, node.module)
        self.names.append((source, tuple(alias.name for alias in node.names), node.lineno))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called in ("import_module", "__import__") and node.args:
            name = self._text(node.args[0])
            if name is not None:
                if name.startswith("."):
                    level = len(name) - len(name.lstrip("."))
                    name = self._absolute(level, name.lstrip(".") or None)
                self.names.append((name, (), node.lineno))
        self.generic_visit(node)

    def _text(self, arg: ast.expr) -> str | None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if isinstance(arg, ast.Name):
            return self.constants.get(arg.id)
        return None


def import_graph(package: str, root: Path = REPO) -> dict[str, dict[str, int]]:
    """module -> {imported module of the same package -> line of its first import}."""
    modules = modules_of(package, root)
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        collector = _Collector(name, path.name == "__init__.py", _string_constants(tree))
        collector.visit(tree)
        for source, imported, line in collector.names:
            targets = [f"{source}.{item}" for item in imported if f"{source}.{item}" in modules]
            if len(targets) < len(imported) or not imported:
                targets.append(source)  # some names are attributes of `source` itself
            for target in targets:
                if target in modules and target != name:
                    graph[name].setdefault(target, line)
    return graph


def _components(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def _path(graph: dict[str, dict[str, int]], start: str, goal: str, within: set[str]) -> list[str]:
    """A shortest import chain from start to goal inside one component."""
    before: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for child in graph[node]:
            if child in within and child not in before:
                before[child] = node
                queue.append(child)
    chain: list[str] = []
    step: str | None = goal
    while step is not None:
        chain.append(step)
        step = before[step]
    return chain[::-1]


def cycles(package: str, root: Path = REPO) -> list[str]:
    """Import circles among a package's modules, each as `a:line -> b:line -> ... -> a`. Every import that
    closes a circle is in at least one chain, so each chain shows an import to break."""
    graph = import_graph(package, root)
    chains: list[str] = []
    for component in _components(graph):
        covered: set[tuple[str, str]] = set()
        for node in sorted(component):
            for child in sorted(c for c in graph[node] if c in component):
                if (node, child) in covered:
                    continue
                loop = [node, *_path(graph, child, node, component)]
                covered.update(zip(loop, loop[1:], strict=False))
                chains.append(" -> ".join(f"{a}:{graph[a][b]}" for a, b in zip(loop, loop[1:], strict=False))
                              + f" -> {node}")
    return chains


def test_no_module_of_batch_assets_is_over_400_lines() -> None:
    """A module over 400 lines is split along a seam; only the modules being rewritten now are let through."""
    sizes = {
        path.relative_to(REPO).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in modules_of("batch_assets").values()
    }
    over = {path: lines for path, lines in sizes.items() if lines > MAX_LINES}
    too_long = [f"{path}: {lines} lines" for path, lines in sorted(over.items()) if path not in PENDING_SPLIT]
    assert not too_long, f"over {MAX_LINES} lines:\n" + "\n".join(too_long)
    assert sorted(PENDING_SPLIT - set(over)) == [], "split already: remove it from PENDING_SPLIT"


@pytest.mark.parametrize("package", ["batch_assets", "faults"])
def test_no_import_circle(package: str) -> None:
    """No chain of imports leads from a module back to itself, whether the imports are at the top or inside a
    function: a circle makes the import order decide what works, and an import hidden in a function hides it."""
    found = cycles(package)
    assert not found, "import circles (module:line of the import -> ...):\n" + "\n".join(found)


def test_the_cycle_finder_sees_hidden_and_relative_imports(tmp_path: Path) -> None:
    """The finder itself: a circle closed by a relative import, one by an import inside a function, one by
    `from package import submodule`, one by `importlib.import_module` with a constant, and none through an
    import under `if TYPE_CHECKING:`."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "def f():\n    from pkg.a import x\n",
        "sub/__init__.py": "",
        "sub/c.py": "from pkg import d\n",
        "d.py": "import importlib\nNAME = 'pkg.sub.c'\ndef g():\n    return importlib.import_module(NAME)\n",
        "e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import f\n",
        "f.py": "from .sub import c\nimport pkg.e\n",
    }
    for name, text in files.items():
        (package / name).write_text(text, encoding="utf-8")
    assert sorted(cycles("pkg", tmp_path)) == [
        "pkg.a:1 -> pkg.b:2 -> pkg.a",
        "pkg.d:4 -> pkg.sub.c:1 -> pkg.d",
    ]


CITED = re.compile(r"CONTRACT|(?<!RFC \d{4} )(?<!RFC \d{3} )§ ?\d|\b[Ii]ssues? \d+\b")
"""A citation of a document the repository does not hold (the external contract, an issue tracker)."""


def test_nothing_cites_a_document_outside_the_repository() -> None:
    """Code, tests, docs and the README say the reason or link a docs page: they cite no section of the external
    contract and no issue number (the previous release's migrations, kept verbatim as test fixtures, aside)."""
    roots = [REPO / name for name in ("batch_assets", "tests", "docs", "examples", "faults", ".ci")]
    files = [REPO / "README.md", REPO / "Makefile", REPO / "mkdocs.yml", REPO / "pyproject.toml"]
    for root in roots:
        files += [p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".sql", ".yaml", ".yml", "")
                  and "previous_release" not in p.parts and "__pycache__" not in p.parts and p != Path(__file__)]
    cited = [f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}"
             for path in files for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if CITED.search(line)]
    assert cited == []


DOTTED = re.compile(r"`(batch_assets(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`")
"""A reference in backticks to a module or a name of the package, fully qualified: `batch_assets.queue.worker`."""


def resolves(reference: str) -> bool:
    """Whether `reference` names a module of the package, or an attribute reached from the deepest one."""
    import importlib

    parts = reference.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                found = getattr(found, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_reference_to_a_module_or_name_of_the_package_resolves() -> None:
    """A docstring or a docs page that names `batch_assets.x.y` names a module or a name that exists: a move
    (the engines out of the reference jobs) leaves no reader following a path that is gone."""
    files = [REPO / "README.md"] + [p for root in ("batch_assets", "docs", "faults", "tests")
                                    for p in (REPO / root).rglob("*") if p.suffix in (".py", ".md")
                                    and "__pycache__" not in p.parts and p != Path(__file__)]
    stale = sorted({f"{path.relative_to(REPO)}: {ref}" for path in files
                    for ref in DOTTED.findall(path.read_text(errors="replace")) if not resolves(ref)})
    assert stale == []


def test_a_reference_that_is_gone_is_found() -> None:
    assert resolves("batch_assets.queue.worker.run_worker")
    assert not resolves("batch_assets.domains.queue.worker")
    assert not resolves("batch_assets.queue.worker.no_such_name")
