"""The declared lower bounds cover the APIs the code calls (issue kind 9)."""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import jsonschema_rs

ROOT = Path(__file__).resolve().parents[2]

JSONSCHEMA_RS_OFFLINE = (0, 52)
"""jsonschema-rs 0.52.0 added ``offline=`` to ``validator_for`` (its Python release notes:
"The offline argument, refusing to fetch references outside registry"); 0.51.0 raises
``TypeError: unexpected keyword argument 'offline'``. ``catalog/params.py`` passes it."""


def _lower_bound(name: str) -> tuple[int, ...]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for spec in data["project"]["dependencies"]:
        match = re.fullmatch(rf"{re.escape(name)}\s*>=\s*([0-9.]+)(,.*)?", spec.strip())
        if match:
            return tuple(int(part) for part in match.group(1).split("."))
    raise AssertionError(f"{name} has no '>=' lower bound in pyproject.toml")


def test_jsonschema_rs_bound_covers_offline() -> None:
    """SPEC C1, I4: the catalog compiles schemas with ``offline=True``; the declared
    ``jsonschema-rs`` lower bound is a release that accepts it."""
    assert _lower_bound("jsonschema-rs") >= JSONSCHEMA_RS_OFFLINE
    assert "offline" in (ROOT / "catalog" / "params.py").read_text()
    assert "offline" in inspect.signature(jsonschema_rs.validator_for).parameters
