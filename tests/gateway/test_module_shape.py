"""Issue 9 (smaller parts, explicit dependencies): the shape of ``gateway/`` stays one a
reader can hold. No import cycle among its modules, counting imports under
``TYPE_CHECKING`` too, and no class longer than :data:`MAX_CLASS_LINES`. Both read the
source with :mod:`ast`; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
MAX_CLASS_LINES = 250
"""About 250 lines, docstrings included: past that a class holds more than one part."""
OVER_THE_CAP: frozenset[str] = frozenset()
"""Classes known to be over the cap, to be split (issue 9). A ratchet: a class not listed
here fails when it grows past the cap, and one listed fails once it is under the cap,
so the list only shrinks. Empty since the split of ``Node``, ``PgStore`` and
``JobRunner``: the cap holds for every class."""


def _modules() -> dict[str, ast.Module]:
    trees = {}
    for path in sorted(GATEWAY.rglob("*.py")):
        parts = path.relative_to(GATEWAY.parent).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        trees[name] = ast.parse(path.read_text(), str(path))
    return trees


def _imports(tree: ast.Module, known: set[str]) -> set[str]:
    """Gateway modules a module imports at its top level (``if`` and ``try`` blocks,
    ``TYPE_CHECKING`` included); imports inside functions are left out on purpose."""
    found: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            found.update(n for n in names if n in known)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.If | ast.Try):
            pending.extend(node.body + node.orelse)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or ``None``."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph[node]):
            found = visit(target)
            if found:
                return found
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start)
        if found:
            return found
    return None


def test_cycle_finder_finds_a_cycle() -> None:
    """The cycle finder itself: a two-module cycle is found, a chain is not."""
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_gateway_imports_have_no_cycle() -> None:
    """Issue 9: the import graph of ``gateway/`` is acyclic, so every part can be built
    from parts built before it (gateway/wiring.py)."""
    trees = _modules()
    known = set(trees)
    graph = {name: _imports(tree, known) - {name} for name, tree in trees.items()}
    assert _cycle(graph) is None


def test_no_gateway_class_is_over_the_size_cap() -> None:
    """Issue 9: no class in ``gateway/`` is longer than MAX_CLASS_LINES lines, except the
    ones OVER_THE_CAP names, each of which still is."""
    long = {
        f"{name}.{node.name}": node.end_lineno - node.lineno + 1
        for name, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    }
    assert set(long) == OVER_THE_CAP, long
