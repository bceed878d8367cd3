"""No import cycle anywhere in the package and its lab: Python modules (imports at the top of
a module, inside functions and under TYPE_CHECKING alike) and the C kernels' includes. The
lab stands on the package, never the other way round."""

from __future__ import annotations

import re

from tests.import_graph import PACKAGE_ROOT, find_cycle, import_graph


def test_no_python_import_cycle():
    """Where a part needs its caller's type (the app's slash commands and replies, the
    engine's KV store and draft verifier), a protocol names it, not the caller's module."""
    edges = {name: {i.target for i in imports} for name, imports in import_graph().items()}
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_the_package_reaches_the_lab_only_through_the_bench_command():
    into_lab = [f"{module}:{found.line} imports {found.target}"
                for module, imports in import_graph().items()
                if not module.startswith("pagedchat_lab") for found in imports
                if found.target.startswith("pagedchat_lab")]
    assert len(into_lab) == 1 and into_lab[0].startswith("pagedchat.cli:"), into_lab


def test_no_c_include_cycle():
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
    files = {path.name: path for suffix in ("*.c", "*.h") for path in PACKAGE_ROOT.rglob(suffix)}
    assert files
    edges = {name: set(include.findall(path.read_text(encoding="utf-8"))) & files.keys()
             for name, path in files.items()}
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_a_cycle_is_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
