"""catalog modules stay small (STYLE); its import rules are import-linter contracts.

What catalog/ may import is checked by ``lint-imports`` (``[tool.importlinter]`` in
pyproject.toml, run by scripts/check and by tests/test_layers.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "catalog"


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_modules_stay_small(path: Path) -> None:
    """STYLE: one concept per module, under 600 lines."""
    assert len(path.read_text("utf-8").splitlines()) < 600
