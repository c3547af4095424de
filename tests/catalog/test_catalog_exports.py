"""Catalog version, wire shape and model-facing exports (SPEC C3, C4, I1)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from catalog.exports import (
    EXPORTERS,
    catalog_version,
    suggest,
    to_anthropic,
    to_mcp,
    to_mcp_carried,
    to_openai_chat,
    to_openai_realtime,
    tool_info,
)
from catalog.loader import load_catalog
from catalog.model import Mode, ToolDef
from gateway.demo import PROFILES_PATH, TOOLS_PATH
from protocol.messages import ToolInfo


def demo_tools() -> list[ToolDef]:
    """Every tool of the demo catalog."""
    return list(load_catalog([TOOLS_PATH], [PROFILES_PATH]).tools.values())


def test_demo_exports_match_published_types(check_exports) -> None:
    """SPEC C4: every demo tool exports to all four formats, each validated."""
    check_exports(demo_tools())


def test_exporter_table() -> None:
    """SPEC C4/O1: the format names map to the exporters."""
    assert {
        "openai-realtime": to_openai_realtime,
        "openai-chat": to_openai_chat,
        "anthropic": to_anthropic,
        "mcp": to_mcp,
    } == EXPORTERS


def test_mcp_hints_from_definition(make_tool) -> None:
    """SPEC C4: destructiveHint follows dangerous; readOnly/idempotent/title carried."""
    tool = make_tool("rm", dangerous=True, idempotent=True, title="Remove")
    [entry] = to_mcp([tool])
    assert entry["annotations"] == {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": True,
        "title": "Remove",
    }
    [safe] = to_mcp([make_tool("ls", read_only=True)])
    assert safe["annotations"] == {
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": False,
    }


def test_exports_copy_parameters(make_tool) -> None:
    """SPEC C4: mutating an export never changes the catalog."""
    tool = make_tool(parameters={"type": "object", "properties": {"a": {"type": "string"}}})
    to_anthropic([tool])[0]["input_schema"]["properties"]["a"]["type"] = "integer"
    tool_info(tool)["parameters"]["properties"].clear()
    assert tool.parameters["properties"]["a"]["type"] == "string"


def test_tool_info_matches_protocol_model() -> None:
    """SPEC C3: tool_info is exactly a protocol ToolInfo, None values left out."""
    for tool in demo_tools():
        info = tool_info(tool)
        assert set(info) <= set(ToolInfo.model_fields)
        assert ToolInfo.model_validate(info).model_dump(exclude_none=True) == info


def test_tool_info_shape(make_tool) -> None:
    """SPEC C3: the wire shape of an async tool and of a plain one."""
    job = make_tool("r", mode=Mode.ASYNC, category="reports", dispatch_message="On it.")
    assert tool_info(job) == {
        "name": "r",
        "description": "r tool",
        "parameters": {"type": "object", "properties": {}},
        "mode": "async",
        "dangerous": False,
        "requires_approval": False,
        "category": "reports",
        "long_running": False,
        "dispatch_message": "On it.",
    }
    assert set(tool_info(make_tool())) == {
        "name",
        "description",
        "parameters",
        "mode",
        "dangerous",
        "requires_approval",
        "long_running",
    }


def test_version_stable_and_order_independent() -> None:
    """SPEC C3: the version depends on content only, not on order."""
    tools = demo_tools()
    version = catalog_version(tools)
    assert re.fullmatch(r"[0-9a-f]{16}", version)
    assert catalog_version(list(reversed(tools))) == version
    assert catalog_version(demo_tools()) == version


def test_version_ignores_dict_key_order(make_tool) -> None:
    """SPEC C3: equal schemas written in another key order hash the same."""
    one = make_tool(parameters={"type": "object", "properties": {"a": {}, "b": {}}})
    two = make_tool(parameters={"properties": {"b": {}, "a": {}}, "type": "object"})
    assert catalog_version([one]) == catalog_version([two])


CHANGES: dict[str, Any] = {
    "description": "other",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    "mode": Mode.ASYNC,
    "dangerous": True,
    "requires_approval": True,
    "category": "c",
    "long_running": True,
    "dispatch_message": "Starting.",
}


@pytest.mark.parametrize(("field", "value"), list(CHANGES.items()), ids=list(CHANGES))
def test_version_changes_with_visible_field(make_tool, field: str, value: Any) -> None:
    """SPEC C3: changing any client-visible field changes the version."""
    base = make_tool("a")
    changed = dataclasses.replace(base, **{field: value})
    assert catalog_version([base]) != catalog_version([changed])


def test_version_changes_with_membership(make_tool) -> None:
    """SPEC C3: adding or removing a tool changes the version; the empty set has one too."""
    a, b = make_tool("a"), make_tool("b")
    versions = {catalog_version([]), catalog_version([a]), catalog_version([a, b])}
    assert len(versions) == 3


def test_version_ignores_server_side_fields(make_tool) -> None:
    """SPEC C3: fields the client never sees (timeout, handler) do not change the version."""
    base = make_tool("a")
    other = dataclasses.replace(base, timeout=9.0, handler="m:f", sensitive=("x",))
    assert catalog_version([base]) == catalog_version([other])


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("notes_lst", ["notes_list"]),
        ("Notes-Search", ["notes_search"]),
        ("clock", ["clock_now"]),
        ("weather", []),
    ],
    ids=["typo", "case-and-dash", "prefix", "nothing-close"],
)
def test_suggest(name: str, expected: list[str]) -> None:
    """SPEC I1: did-you-mean suggestions come from the given names only."""
    names = [tool.name for tool in demo_tools()]
    assert suggest(name, names)[: len(expected) or None] == expected


def test_suggest_limit() -> None:
    """SPEC I1: at most `limit` suggestions, best first."""
    names = ["notes_list", "notes_lists", "notes_listx", "notes_listy"]
    assert suggest("notes_list", names, limit=2) == ["notes_list", "notes_lists"]


def test_mcp_export_leaves_out_only_the_tool_it_cannot_carry(make_tool) -> None:
    """SPEC M4, C4: a root oneOf that bounds a property cannot be dropped; that tool is
    left out with its finding, every other tool is exported as to_mcp exports it."""
    pick = make_tool(
        "pick",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "oneOf": [
                {"properties": {"a": {"minimum": 0}}, "required": ["a"]},
                {"required": ["b"]},
            ],
        },
    )
    fine = make_tool("fine")
    entries, left_out = to_mcp_carried([fine, pick, make_tool("other")])
    assert entries == to_mcp([fine, make_tool("other")])
    assert [(f.tool, f.provider, f.adapted) for f in left_out] == [("pick", "mcp", False)]
