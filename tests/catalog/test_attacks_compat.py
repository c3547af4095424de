"""Attacks on SPEC C4 (case F18's kind): schema keywords OpenAI strict mode refuses that
the first rule list missed. Each makes the tool go out ``strict: false`` (accepted, only
not constrained) with a ``strict-unsupported-keyword`` note, never ``strict: true``."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.compat import STRICT_KEYWORD, strict_findings
from catalog.exports import to_openai_chat
from tests.catalog.test_catalog_provider_rules import build_tool, flat

REFUSED: dict[str, dict[str, Any]] = {
    "default": {"type": "string", "default": "x"},
    "uniqueItems": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    "contains": {"type": "array", "items": {"type": "string"}, "contains": {"const": "a"}},
    "patternProperties": {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
        "patternProperties": {"^x": {"type": "string"}},
    },
    "minProperties": {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
        "minProperties": 1,
    },
}


@pytest.mark.parametrize("keyword", sorted(REFUSED))
def test_strict_mode_keyword_sends_strict_false(keyword: str) -> None:
    """SPEC C4: a property using ``keyword`` is reported and the export is not strict."""
    schema = flat({"a": REFUSED[keyword]})
    findings = strict_findings("t", schema)
    assert [f.rule for f in findings] == [STRICT_KEYWORD]
    assert keyword in findings[0].message
    [entry] = to_openai_chat([build_tool(parameters=schema)], strict=True)
    assert entry["function"]["strict"] is False


def test_a_property_named_like_a_keyword_is_not_flagged() -> None:
    """SPEC C4: only keywords count, not property names (``default`` as a name is fine)."""
    schema = flat({"default": {"type": "string"}, "contains": {"type": "string"}})
    assert strict_findings("t", schema) == []
