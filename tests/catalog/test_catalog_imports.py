"""catalog stays sans-I/O: no gateway, asyncio, sockets or clock (SPEC layout, STYLE)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "catalog"
FORBIDDEN = {"gateway", "asyncio", "websockets", "socket", "time", "threading"}


def imported_roots(path: Path) -> set[str]:
    """Top-level module names imported by one source file."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_forbidden_imports(path: Path) -> None:
    """SPEC layout: catalog imports no gateway, asyncio, websockets, socket or time."""
    assert imported_roots(path) & FORBIDDEN == set()


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_modules_stay_small(path: Path) -> None:
    """STYLE: one concept per module, under 600 lines."""
    assert len(path.read_text("utf-8").splitlines()) < 600
