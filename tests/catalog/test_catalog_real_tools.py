"""Real published tool definitions: load, export, validate as labelled (SPEC C1, C4, I4).

The data (159 tool definitions published by public MCP servers and OpenAI examples, and
181 labelled argument objects) lives beside the repository in the team's shared folder
and is read at test time, never copied; a clone without it skips this module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from catalog.compat import STRICT_ADDITIONAL, STRICT_KEYWORD, STRICT_REQUIRED
from catalog.exports import export_findings, to_openai_chat
from catalog.loader import load_tool_dicts
from catalog.model import Catalog
from catalog.params import validators_for
from catalog.tooldefs import TOOL_NAME, from_mcp_tool

REAL_TOOLS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real-tools"
if not REAL_TOOLS.is_dir():
    pytest.skip(
        f"real tool definitions not present at {REAL_TOOLS} (the team's shared data folder "
        "beside the repository; not part of a clone)",
        allow_module_level=True,
    )
FILES = sorted(REAL_TOOLS.glob("*/*.json"))
ARGS = [
    json.loads(line)
    for line in (REAL_TOOLS / "args.jsonl").read_text("utf-8").splitlines()
    if line.strip()
]


def real_catalog() -> Catalog:
    """All real tools in one catalog, capability = folder name, sync, no handlers."""
    defs = [
        from_mcp_tool(json.loads(path.read_text("utf-8")), capability=path.parent.name)
        for path in FILES
    ]
    return load_tool_dicts(defs, str(REAL_TOOLS))


_CATALOG: list[Catalog] = []


def cached_catalog() -> Catalog:
    """:func:`real_catalog`, built once per session (loading compiles 159 schemas)."""
    if not _CATALOG:
        _CATALOG.append(real_catalog())
    return _CATALOG[0]


def test_all_real_tools_load() -> None:
    """SPEC C1: all 159 real definitions load into one catalog with model-safe names."""
    catalog = cached_catalog()
    assert len(FILES) == 159
    assert len(catalog.tools) == 159
    assert all(TOOL_NAME.match(name) for name in catalog.tools)


def test_real_tools_keep_their_schemas() -> None:
    """SPEC C1: parameters are the published inputSchema, unchanged."""
    catalog = cached_catalog()
    for path in FILES:
        entry: dict[str, Any] = json.loads(path.read_text("utf-8"))
        assert catalog.tools[entry["name"]].parameters == entry["inputSchema"]


def test_real_tools_export_to_every_format(check_exports) -> None:
    """SPEC C4: every real tool exports to all four formats, validated by their types."""
    check_exports(list(cached_catalog().tools.values()))


def test_real_tools_break_no_provider_rule() -> None:
    """SPEC C4/F18: no real tool needs adapting for any format (no root combinators)."""
    assert export_findings(cached_catalog().tools.values()) == []


def test_real_tools_strict_mode_findings() -> None:
    """SPEC C4: OpenAI strict mode fits none of the real tools; each is sent strict: false."""
    tools = list(cached_catalog().tools.values())
    findings = export_findings(tools, strict=True)
    by_rule: dict[str, set[str]] = {}
    for finding in findings:
        assert (finding.provider, finding.adapted) == ("openai-chat", True)
        by_rule.setdefault(finding.rule, set()).add(finding.tool)
    assert {rule: len(names) for rule, names in by_rule.items()} == {
        STRICT_ADDITIONAL: 159,
        STRICT_REQUIRED: 91,
        # 3 with allOf/oneOf/not; the rest use `default` or another keyword strict mode
        # refuses (catalog.compat.STRICT_UNSUPPORTED).
        STRICT_KEYWORD: 25,
    }
    assert by_rule[STRICT_KEYWORD] >= {
        "projects_write",
        "update_issue_assignees",
        "update_issue_labels",
    }
    entries = to_openai_chat(tools, strict=True)
    assert [entry["function"]["strict"] for entry in entries] == [False] * 159


def test_args_file_size() -> None:
    """SPEC I4: the labelled argument cases are all present."""
    assert len(ARGS) == 181


@pytest.mark.parametrize(
    "case",
    ARGS,
    ids=[f"{i:03d}-{c['tool']}-{'ok' if c['valid'] else 'bad'}" for i, c in enumerate(ARGS)],
)
def test_real_args_validate_as_labelled(case: dict[str, Any]) -> None:
    """SPEC I4: each labelled argument object is valid or invalid exactly as labelled."""
    violations = validators_for(cached_catalog())[case["tool"]].validate(case["args"])
    if case["valid"]:
        assert violations == [], case["why"]
    else:
        assert violations, case["why"]
        assert all(v.pointer == "" or v.pointer.startswith("/") for v in violations)
