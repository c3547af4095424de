"""Fixtures of the catalog tests: a tool factory and a YAML writer."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mcp.types as mcp_types
import pytest
from anthropic.types import ToolParam
from openai.types.chat import ChatCompletionToolParam
from openai.types.realtime.realtime_function_tool_param import RealtimeFunctionToolParam
from openai.types.realtime.session_update_event_param import SessionUpdateEventParam
from pydantic import TypeAdapter

from catalog.exports import to_anthropic, to_mcp, to_openai_chat, to_openai_realtime
from catalog.model import Mode, ToolDef, Visibility

ToolFactory = Callable[..., ToolDef]
YamlWriter = Callable[[str, str], Path]


def build_tool(name: str = "t", **overrides: Any) -> ToolDef:
    """A valid sync tool; keyword arguments replace fields."""
    fields: dict[str, Any] = {
        "name": name,
        "description": f"{name} tool",
        "parameters": {"type": "object", "properties": {}},
        "capability": "cap",
        "mode": Mode.SYNC,
        "visibility": Visibility(),
    }
    fields.update(overrides)
    return ToolDef(**fields)


@pytest.fixture
def make_tool() -> ToolFactory:
    """Factory of :class:`ToolDef` records with sensible defaults."""
    return build_tool


@pytest.fixture
def write_yaml(tmp_path: Path) -> YamlWriter:
    """Write dedented YAML text to ``tmp_path / name`` and return the path."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    return write


REALTIME = TypeAdapter(RealtimeFunctionToolParam)
SESSION_UPDATE = TypeAdapter(SessionUpdateEventParam)
CHAT = TypeAdapter(ChatCompletionToolParam)
ANTHROPIC = TypeAdapter(ToolParam)


def _check_exports(tools: list[ToolDef]) -> None:
    """Validate every export of ``tools`` against the published types, exact keys included.

    Pydantic drops unknown keys of a TypedDict silently, so each entry must also survive
    validation unchanged (no extra, no missing, no coerced key).
    """
    realtime = to_openai_realtime(tools)
    for entry in realtime:
        assert REALTIME.validate_python(entry) == entry
        assert set(entry) == {"type", "name", "description", "parameters"}
    event = {"type": "session.update", "session": {"type": "realtime", "tools": realtime}}
    assert SESSION_UPDATE.validate_python(event) == event
    for entry in to_openai_chat(tools):
        assert CHAT.validate_python(entry) == entry
        assert set(entry["function"]) == {"name", "description", "parameters"}
    for entry in to_anthropic(tools):
        assert ANTHROPIC.validate_python(entry) == entry
        assert set(entry) == {"name", "description", "input_schema"}
    for entry in to_mcp(tools):
        model = mcp_types.Tool.model_validate(entry)
        assert model.model_dump(by_alias=True, exclude_none=True) == entry
        assert model.input_schema["type"] == "object"


@pytest.fixture
def check_exports() -> Callable[[list[ToolDef]], None]:
    """Validator of the four exports of a tool list against the published types (SPEC C4)."""
    return _check_exports
