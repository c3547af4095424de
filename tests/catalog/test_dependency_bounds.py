"""The declared lower bounds cover the APIs the code calls (issue kind 9)."""

from __future__ import annotations

import dataclasses
import inspect
import re
import tomllib
from pathlib import Path

import jsonschema_rs
from websockets.http11 import Request

ROOT = Path(__file__).resolve().parents[2]

JSONSCHEMA_RS_OFFLINE = (0, 52)
"""jsonschema-rs 0.52.0 added ``offline=`` to ``validator_for`` (its Python release notes:
"The offline argument, refusing to fetch references outside registry"); 0.51.0 raises
``TypeError: unexpected keyword argument 'offline'``. ``catalog/params.py`` passes it."""

WEBSOCKETS_REQUEST_METHOD = (17, 0)
"""websockets 17.0 added ``Request.method`` (16.x parses only GET and has no such
field); the gateway answers HEAD and 405 from it (``gateway/http_front.py``). The rest of
what ``gateway/wslib.py`` relies on is pinned by ``tests/gateway/test_wslib_seam.py``."""


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


def test_websockets_bound_covers_request_method() -> None:
    """SPEC O2: HEAD and non-GET side-route requests are told apart by ``Request.method``;
    the declared ``websockets`` lower bound is a release that has it."""
    assert _lower_bound("websockets") >= WEBSOCKETS_REQUEST_METHOD
    gateway = (ROOT / "gateway").rglob("*.py")
    assert any("request.method" in path.read_text() for path in gateway)
    assert "method" in [field.name for field in dataclasses.fields(Request)]
