"""The import graph of the package and of its lab (``pagedchat_lab``), read from the source
with ``ast`` (nothing imported).

Every ``import`` and ``from ... import`` counts: at the top of a module, inside a function
or under ``if TYPE_CHECKING:`` (a type-only import makes a cycle as much as any other).
``from package import name`` is an import of the submodule ``package.name`` when there is
one, else of ``package``.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "pagedchat"
LAB_ROOT = PACKAGE_ROOT.with_name("pagedchat_lab")


@dataclass(frozen=True)
class Import:
    target: str  # a module of the package
    line: int


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every Python module of the package and the lab."""
    modules = {}
    for path in sorted(path for root in (PACKAGE_ROOT, LAB_ROOT) for path in root.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imports_of(name: str, modules: dict[str, Path]) -> list[Import]:
    """The package modules that module ``name`` imports (itself left out)."""
    path = modules[name]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append(Import(target, node.lineno))
    return found


@functools.cache
def import_graph() -> dict[str, list[Import]]:
    modules = module_files()
    return {name: imports_of(name, modules) for name in modules}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph ``edges`` (as a path that ends where it starts)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None
