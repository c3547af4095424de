"""The sans-I/O rule: protocol/ imports no I/O, clock, thread or gateway module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROTOCOL = Path(__file__).resolve().parents[2] / "protocol"
FORBIDDEN = {"asyncio", "websockets", "socket", "time", "threading", "selectors", "gateway"}
MODULES = sorted(PROTOCOL.rglob("*.py"))


def _imported_roots(tree: ast.AST) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_forbidden_imports_are_detected() -> None:
    """SPEC layout: the checker sees plain, dotted, from- and nested (function-level) imports."""
    source = (
        "import os, asyncio.tasks\nfrom time import monotonic\ndef f():\n    import gateway.x\n"
    )
    assert _imported_roots(ast.parse(source)) & FORBIDDEN == {"asyncio", "time", "gateway"}


def test_protocol_has_modules() -> None:
    """SPEC layout: the walk below actually visits protocol/ (a walk over nothing cannot fail)."""
    assert {path.name for path in MODULES} >= {"codec.py", "messages.py", "session.py"}


@pytest.mark.parametrize("path", MODULES, ids=[path.name for path in MODULES])
def test_protocol_module_is_sans_io(path: Path) -> None:
    """SPEC layout: no protocol/ module imports asyncio, websockets, socket, time, ... gateway."""
    found = _imported_roots(ast.parse(path.read_text(), filename=str(path))) & FORBIDDEN
    assert not found, f"{path.name} imports {sorted(found)}: protocol/ is sans-I/O"
