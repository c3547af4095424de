"""The browser's `openai-realtime` rules agree with the Python exporter (SPEC C4, F18).

``gateway/static/exportrules.js`` runs in Node 20 (installed on every test machine) on the
same tools that :func:`catalog.exports.to_openai_realtime` exports.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from catalog.exports import ExportError, to_openai_realtime
from catalog.model import ToolDef
from tests.catalog.conftest import build_tool
from tests.catalog.test_catalog_exports import demo_tools

MODULE = Path(__file__).resolve().parents[2] / "gateway" / "static" / "exportrules.js"
RUNNER = """
const { pathToFileURL } = await import("node:url");
const { realtimeExport } = await import(pathToFileURL(process.argv[1]).href);
let text = "";
for await (const chunk of process.stdin) text += chunk;
process.stdout.write(JSON.stringify(realtimeExport(JSON.parse(text))));
"""
PROPS = {"a": {"type": "string"}, "b": {"type": "integer"}}


def schema(**root: Any) -> dict[str, Any]:
    """An object schema over a, b with extra root keywords."""
    return {"type": "object", "properties": PROPS, **root}


CASES: dict[str, dict[str, Any]] = {
    "f18": schema(oneOf=[{"required": ["a"]}, {"required": ["b"]}]),
    "any-of": schema(anyOf=[{"required": ["a", "b"]}, {"required": []}]),
    "all-of-merge": schema(required=["b"], allOf=[{"required": ["a", "b"]}]),
    "all-of-new": schema(allOf=[{"required": ["a"], "description": "x"}]),
    "not": schema(**{"not": {"required": ["a", "b"]}}),
    "two-keys": schema(oneOf=[{"required": ["a"]}], anyOf=[{"required": ["b"]}]),
    "enum-error": schema(enum=[{"a": "x"}]),
    "branch-error": schema(oneOf=[{"required": ["a"]}, {"properties": {"a": {}}}]),
    "not-list-error": schema(anyOf=[{"required": "a"}]),
    "plain": schema(required=["a"]),
}


def run_js(tools: list[ToolDef]) -> dict[str, Any]:
    """``realtimeExport`` of the tools' wire shape, computed by Node."""
    wire = [
        {"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools
    ]
    run = subprocess.run(
        ["node", "--input-type=module", "-e", RUNNER, str(MODULE)],
        input=json.dumps(wire),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(run.stdout)
    return result


def python_export(tools: list[ToolDef]) -> tuple[list[dict[str, Any]], list[str]]:
    """The Python export of each tool alone: (entries, names it refuses)."""
    entries, refused = [], []
    for tool in tools:
        try:
            entries += to_openai_realtime([tool])
        except ExportError:
            refused.append(tool.name)
    return entries, refused


def test_js_and_python_agree_on_every_case() -> None:
    """SPEC C4/F18: same entries, same refused tools, for every root-keyword case."""
    tools = [build_tool(name, description=" d  ", parameters=p) for name, p in CASES.items()]
    tools.append(build_tool("no_text", description="", parameters=CASES["f18"]))
    entries, refused = python_export(tools)
    js = run_js(tools)
    assert js["tools"] == entries
    assert [d["name"] for d in js["dropped"]] == refused
    assert refused == ["enum-error", "branch-error", "not-list-error"]
    assert {d["rule"] for d in js["dropped"]} == {"root-combinator"}


def test_js_matches_the_demo_export() -> None:
    """SPEC C4: on the demo catalog the browser export is the Python export."""
    tools = demo_tools()
    assert run_js(tools) == {"tools": to_openai_realtime(tools), "dropped": []}
