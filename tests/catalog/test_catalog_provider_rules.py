"""Provider rules on tool parameter schemas: adapt or report, never pass (SPEC C4, F18)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from catalog.compat import (
    ANTHROPIC,
    FORMATS,
    MCP,
    OPENAI_CHAT,
    OPENAI_REALTIME,
    ROOT_COMBINATOR,
    ROOT_OBJECT,
    STRICT_ADDITIONAL,
    STRICT_DEPTH,
    STRICT_ENUMS,
    STRICT_KEYWORD,
    STRICT_PROPERTIES,
    STRICT_REQUIRED,
    STRICT_STRINGS,
    Finding,
    adapt,
    render_findings,
    strict_findings,
)
from catalog.exports import EXPORTERS, ExportError, export_findings, to_openai_chat
from catalog.params import compiled
from tests.catalog.conftest import CHAT, build_tool

F18: dict[str, Any] = {
    "type": "object",
    "properties": {"event_id": {"type": "string"}, "title": {"type": "string"}},
    "oneOf": [{"required": ["event_id"]}, {"required": ["title"]}],
}
PROPS = {"a": {"type": "string"}, "b": {"type": "string"}}


def with_root(key: str, value: Any) -> dict[str, Any]:
    """An object schema over a, b with one extra root keyword."""
    return {"type": "object", "properties": copy.deepcopy(PROPS), key: value}


@pytest.mark.parametrize("provider", FORMATS)
def test_root_one_of_required_lists_is_described(provider: str) -> None:
    """SPEC C4/F18: a root oneOf of required lists leaves the export and enters the text."""
    tool = build_tool("get_event", description="Find an event.", parameters=F18)
    done = adapt(tool, provider)
    assert done.parameters == {"type": "object", "properties": F18["properties"]}
    assert done.description == (
        "Find an event. Arguments must include exactly one of: `event_id` | `title`."
    )
    [finding] = done.findings
    assert (finding.tool, finding.provider, finding.rule, finding.adapted) == (
        "get_event",
        provider,
        ROOT_COMBINATOR,
        True,
    )
    assert tool.parameters == F18


def test_f18_exports_validate_against_published_types(check_exports) -> None:
    """SPEC C4/F18: every adapted export still matches the provider's published type."""
    check_exports([build_tool("get_event", parameters=F18)])


def test_server_still_validates_the_full_schema() -> None:
    """SPEC I4/F18: the dropped oneOf is still enforced on calls."""
    validator = compiled(F18)
    assert validator.is_valid({"event_id": "e1"})
    assert validator.is_valid({"title": "standup"})
    assert not validator.is_valid({})
    assert not validator.is_valid({"event_id": "e1", "title": "standup"})


def test_root_any_of_is_described() -> None:
    """SPEC C4: a root anyOf of required lists becomes 'at least one of'."""
    schema = with_root("anyOf", [{"required": ["a", "b"]}, {"required": ["b"]}])
    done = adapt(build_tool(parameters=schema), ANTHROPIC)
    assert "anyOf" not in done.parameters
    assert done.description.endswith("at least one of: `a` and `b` | `b`.")


def test_root_all_of_of_required_lists_merges() -> None:
    """SPEC C4: a root allOf of required lists merges into required, text unchanged."""
    schema = with_root("allOf", [{"required": ["b"]}, {"required": ["a", "b"]}])
    schema["required"] = ["b"]
    done = adapt(build_tool(description="d", parameters=schema), OPENAI_CHAT)
    assert done.parameters == {"type": "object", "properties": PROPS, "required": ["b", "a"]}
    assert done.description == "d"


def test_root_not_is_openai_only() -> None:
    """SPEC C4: OpenAI refuses a root not; Anthropic's documented list does not name it."""
    schema = with_root("not", {"required": ["a", "b"]})
    openai = adapt(build_tool(description="d", parameters=schema), OPENAI_REALTIME)
    assert openai.description == "d Arguments must not include all of: `a` and `b`."
    assert "not" not in openai.parameters
    anthropic = adapt(build_tool(parameters=schema), ANTHROPIC)
    assert anthropic.findings == ()
    assert anthropic.parameters == schema


@pytest.mark.parametrize("provider", FORMATS)
def test_root_combinator_with_subschemas_is_an_error(provider: str) -> None:
    """SPEC C4/F18: a branch saying more than required names cannot be dropped: error."""
    schema = with_root("oneOf", [{"required": ["a"]}, {"properties": {"a": {"minLength": 2}}}])
    tool = build_tool("bad", parameters=schema)
    [finding] = adapt(tool, provider).findings
    assert not finding.adapted
    assert finding.rule == ROOT_COMBINATOR
    assert str(finding).startswith(f"bad: {provider}: root-combinator: oneOf at the root")
    with pytest.raises(ExportError) as raised:
        EXPORTERS[provider]([build_tool("fine"), tool])
    assert raised.value.findings == [finding]


def test_root_enum_is_refused_by_openai_and_mcp_only() -> None:
    """SPEC C4: a root enum is an error for OpenAI (and MCP hosts), not for Anthropic."""
    schema = with_root("enum", [{"a": "x"}])
    tool = build_tool("e", parameters=schema)
    errors = [f.provider for f in export_findings([tool]) if not f.adapted]
    assert errors == [OPENAI_REALTIME, OPENAI_CHAT, MCP]
    assert adapt(tool, ANTHROPIC).findings == ()


def test_render_findings_groups_formats() -> None:
    """SPEC O1: one check line per tool and rule, the formats joined, file named."""
    findings = export_findings([build_tool("get_event", parameters=F18)])
    [line] = render_findings(findings, {"get_event": "tools.yaml"})
    assert line.startswith(
        "note: tools.yaml: get_event: openai-realtime, openai-chat, anthropic, mcp: "
        "root-combinator: oneOf at the root of the parameters is refused; dropped"
    )
    error = Finding("x", MCP, ROOT_COMBINATOR, "m", adapted=False)
    assert render_findings([error], {}) == ["error: x: mcp: root-combinator: m"]


STRICT_OK: dict[str, Any] = {
    "type": "object",
    "properties": {
        "unit": {"type": ["string", "null"], "enum": ["C", "F", None]},
        "at": {
            "type": "object",
            "properties": {"lat": {"type": "number"}},
            "required": ["lat"],
            "additionalProperties": False,
        },
    },
    "required": ["unit", "at"],
    "additionalProperties": False,
}


def test_strict_eligible_tool_is_sent_strict() -> None:
    """SPEC C4: a schema inside the Structured Outputs subset is exported strict: true."""
    assert strict_findings("t", STRICT_OK) == []
    [entry] = to_openai_chat([build_tool(parameters=STRICT_OK)], strict=True)
    assert entry["function"]["strict"] is True
    assert CHAT.validate_python(entry) == entry


def nested(levels: int) -> dict[str, Any]:
    """``levels`` objects nested through property ``n``, each strict-clean."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {
            "type": "object",
            "properties": {"n": schema},
            "required": ["n"],
            "additionalProperties": False,
        }
    return schema


def flat(properties: dict[str, Any]) -> dict[str, Any]:
    """A strict-clean root object with ``properties``."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


STRICT_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "additional": ({**STRICT_OK, "additionalProperties": True}, STRICT_ADDITIONAL),
    "nested-additional": (
        flat({"o": {"type": "object", "properties": {}, "required": []}}),
        STRICT_ADDITIONAL,
    ),
    "required": ({**STRICT_OK, "required": ["unit"]}, STRICT_REQUIRED),
    "keyword": (flat({"a": {"allOf": [{"type": "string"}]}}), STRICT_KEYWORD),
    "depth": (nested(11), STRICT_DEPTH),
    "properties": (flat({f"p{i}": {"type": "string"} for i in range(5001)}), STRICT_PROPERTIES),
    "strings": (
        flat({"a": {"type": "string", "enum": ["x" * 60_000] * 2 + ["y"]}}),
        STRICT_STRINGS,
    ),
    "enum-count": (flat({"a": {"type": "integer", "enum": list(range(1001))}}), STRICT_ENUMS),
    "big-enum": (
        flat({"a": {"type": "string", "enum": [f"{i:060d}" for i in range(300)]}}),
        STRICT_ENUMS,
    ),
}


@pytest.mark.parametrize(("schema", "rule"), list(STRICT_CASES.values()), ids=list(STRICT_CASES))
def test_strict_rule(schema: dict[str, Any], rule: str) -> None:
    """SPEC C4: each strict-mode rule is reported and the tool is sent strict: false."""
    assert rule in {f.rule for f in strict_findings("t", schema)}
    assert all(f.adapted for f in strict_findings("t", schema))
    [entry] = to_openai_chat([build_tool(parameters=schema)], strict=True)
    assert entry["function"]["strict"] is False


def test_strict_limits_are_inclusive() -> None:
    """SPEC C4: exactly 10 levels and exactly 5000 properties still fit strict mode."""
    assert strict_findings("t", nested(10)) == []
    assert strict_findings("t", flat({f"p{i}": {"type": "string"} for i in range(5000)})) == []


@pytest.mark.parametrize("provider", FORMATS)
def test_root_must_be_an_object(provider: str) -> None:
    """SPEC C4/C1: a root without type: object is refused by every format (load refuses
    it too; the exporters do not rely on that)."""
    tool = build_tool("arr", parameters={"type": "array"})
    [finding] = adapt(tool, provider).findings
    assert (finding.rule, finding.adapted) == (ROOT_OBJECT, False)
    with pytest.raises(ExportError):
        EXPORTERS[provider]([tool])


def test_strict_findings_only_for_openai_chat() -> None:
    """SPEC C4: strict mode is an OpenAI Chat Completions option; other formats ignore it."""
    tool = build_tool(parameters={"type": "object", "properties": {"a": {"type": "string"}}})
    findings = export_findings([tool], strict=True)
    assert {(f.provider, f.rule) for f in findings} == {
        (OPENAI_CHAT, STRICT_ADDITIONAL),
        (OPENAI_CHAT, STRICT_REQUIRED),
    }
    assert export_findings([tool]) == []
