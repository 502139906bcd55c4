"""No module of kernels/, tuner/ or db/ imports, directly or through others, a module that imports it back: every
import counts, those inside functions too (a circle through a function-level import is a circle a reader still has
to hold in mind). Read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "tuner", "db")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules.keys()
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    names = {f"{base}.{alias.name}" for alias in node.names}
    found = names & modules.keys()
    if len(found) < len(names):  # some names are attributes of ``base``, not submodules
        found.add(base)
    return found & modules.keys()


def test_no_module_imports_itself_back() -> None:
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        nodes = ast.walk(ast.parse(path.read_text()))
        graph[module] = {dep for node in nodes if isinstance(node, (ast.Import, ast.ImportFrom))
                         for dep in _imported(module, path, node, modules) if dep != module}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        raise AssertionError(f"an import circle: {' imports '.join(reversed(error.args[1]))}; move what both need into "
                             "a module of its own that neither imports back") from None
