"""docs/protocol.md documents every wire message and every field (SPEC layout: docs in step)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from protocol.errors import ErrorCode
from protocol.messages import CLIENT_TYPES, SERVER_TYPES, type_name

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()


def _section(kind: str) -> str:
    match = re.search(rf"^### `{re.escape(kind)}`\n(.*?)(?=^### |\Z)", DOC, re.S | re.M)
    assert match, f"docs/protocol.md has no section for {kind!r}"
    return match.group(1)


@pytest.mark.parametrize("model", CLIENT_TYPES + SERVER_TYPES, ids=type_name)
def test_every_field_documented(model: type[BaseModel]) -> None:
    """Every field of every message has a row in its docs/protocol.md table."""
    section = _section(type_name(model))
    missing = [name for name in model.model_fields if f"| `{name}` |" not in section]
    assert not missing, f"docs/protocol.md {type_name(model)}: fields not documented: {missing}"


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_every_error_code_documented(code: ErrorCode) -> None:
    """Every wire error code has a row in the docs/protocol.md error table."""
    assert f"| `{code.value}` |" in DOC, f"docs/protocol.md: error code {code.value} missing"
