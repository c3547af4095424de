"""`toolbus check` and `toolbus catalog --format` against provider rules (SPEC C4, O1, F18).

Each test runs the real command in a subprocess on a catalog written to ``tmp_path``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp.types as mcp_types
import pytest
import yaml

from tests.catalog.conftest import ANTHROPIC, CHAT, REALTIME
from tests.support import run_toolbus

F18_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {"event_id": {"type": "string"}, "title": {"type": "string"}},
    "oneOf": [{"required": ["event_id"]}, {"required": ["title"]}],
}
ADAPTED_PARAMS = {"type": "object", "properties": F18_PARAMS["properties"]}
DESCRIPTION = (
    "Look up a calendar event. Arguments must include exactly one of: `event_id` | `title`."
)
NOTE = (
    "get_event: {formats}: root-combinator: oneOf at the root of the parameters is refused; "
    "dropped from the export and stated in the description (toolbus still validates calls "
    "against it)"
)


def write_catalog(folder: Path, parameters: dict[str, Any]) -> tuple[Path, Path]:
    """A config with one client tool ``get_event`` and profile ``p``; returns (config, tools)."""
    tool = {
        "name": "get_event",
        "description": "Look up a calendar event.",
        "capability": "cal",
        "mode": "client",
        "parameters": parameters,
    }
    tools = folder / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": [tool]}), encoding="utf-8")
    (folder / "profiles.yaml").write_text("profiles:\n  p: {capabilities: [cal]}\n")
    config = folder / "toolbus.yaml"
    config.write_text("catalog: {tools: [tools.yaml], profiles: [profiles.yaml]}\n")
    return config, tools


def test_case_f18_check_reports_the_adaptation(tmp_path: Path) -> None:
    """SPEC C4/O1, F18: check names the tool, every format and the rule, and passes."""
    config, tools = write_catalog(tmp_path, F18_PARAMS)
    run = run_toolbus("check", "--config", str(config), cwd=tmp_path)
    formats = "openai-realtime, openai-chat, anthropic, mcp"
    assert run.stdout == f"note: {tools}: {NOTE.format(formats=formats)}\nok: 1 tool, 1 profile\n"
    assert (run.returncode, run.stderr) == (0, "")


EXPECTED: dict[str, Any] = {
    "openai-realtime": {
        "type": "function",
        "name": "get_event",
        "description": DESCRIPTION,
        "parameters": ADAPTED_PARAMS,
    },
    "openai-chat": {
        "type": "function",
        "function": {"name": "get_event", "description": DESCRIPTION, "parameters": ADAPTED_PARAMS},
    },
    "anthropic": {"name": "get_event", "description": DESCRIPTION, "input_schema": ADAPTED_PARAMS},
    "mcp": {
        "name": "get_event",
        "description": DESCRIPTION,
        "inputSchema": ADAPTED_PARAMS,
        "annotations": {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False},
    },
}


def validate_published(fmt: str, entry: dict[str, Any]) -> None:
    """Check ``entry`` against the provider's published type (openai, anthropic, mcp)."""
    if fmt == "mcp":
        assert mcp_types.Tool.model_validate(entry).input_schema == ADAPTED_PARAMS
    else:
        adapter = {"openai-realtime": REALTIME, "openai-chat": CHAT, "anthropic": ANTHROPIC}[fmt]
        assert adapter.validate_python(entry) == entry


@pytest.mark.parametrize("fmt", list(EXPECTED))
def test_case_f18_every_export_is_accepted(tmp_path: Path, fmt: str) -> None:
    """SPEC C4, F18: each export carries no root oneOf, states it in the description."""
    config, tools = write_catalog(tmp_path, F18_PARAMS)
    run = run_toolbus(
        "catalog", "--config", str(config), "--profile", "p", "--format", fmt, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    [entry] = json.loads(run.stdout)
    assert entry == EXPECTED[fmt]
    validate_published(fmt, entry)
    assert run.stderr == f"note: {tools}: {NOTE.format(formats=fmt)}\n"


def test_case_f18_strict_chat_export_is_non_strict(tmp_path: Path) -> None:
    """SPEC C4, F18: with --strict the F18 tool is sent strict: false, each rule named."""
    config, _ = write_catalog(tmp_path, F18_PARAMS)
    args = ("catalog", "--config", str(config), "--profile", "p", "--format", "openai-chat")
    run = run_toolbus(*args, "--strict", cwd=tmp_path)
    [entry] = json.loads(run.stdout)
    assert entry["function"]["strict"] is False
    assert CHAT.validate_python(entry) == entry
    rules = [line.split(": ")[4] for line in run.stderr.splitlines()]
    assert rules == ["root-combinator", "strict-additional-properties", "strict-all-required"]


UNADAPTABLE = {
    **F18_PARAMS,
    "oneOf": [{"required": ["event_id"]}, {"properties": {"title": {"minLength": 3}}}],
}


def test_case_f18_unadaptable_root_fails_check(tmp_path: Path) -> None:
    """SPEC C4/O1, F18: a root oneOf saying more than required names fails check."""
    config, tools = write_catalog(tmp_path, UNADAPTABLE)
    run = run_toolbus("check", "--config", str(config), cwd=tmp_path)
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr.startswith(
        f"error: {tools}: get_event: openai-realtime, openai-chat, anthropic, mcp: "
        "root-combinator: oneOf at the root of the parameters is refused, and it says more"
    )


@pytest.mark.parametrize("fmt", list(EXPECTED))
def test_case_f18_unadaptable_root_prints_no_export(tmp_path: Path, fmt: str) -> None:
    """SPEC C4, F18: no list the provider would reject whole is printed; exit 1."""
    config, tools = write_catalog(tmp_path, UNADAPTABLE)
    run = run_toolbus(
        "catalog", "--config", str(config), "--profile", "p", "--format", fmt, cwd=tmp_path
    )
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr.startswith(f"error: {tools}: get_event: {fmt}: root-combinator: ")
