"""Loading tool files: every problem reported with file and tool (SPEC C1)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from catalog.errors import CatalogError, LoadIssue
from catalog.loader import load_catalog, load_tool_dicts
from catalog.model import Mode
from catalog.tooldefs import from_mcp_tool
from gateway.demo.handlers import clock_now

HANDLER = "gateway.demo.handlers:clock_now"

GOOD = f"""\
tools:
  - name: clock
    description: What time is it.
    capability: time
    handler: {HANDLER}
    parameters:
      type: object
      properties:
        timezone: {{type: string}}
      required: [timezone]
"""


def tool_yaml(body: str) -> str:
    """A tools file with one tool named ``bad`` whose extra keys are ``body``."""
    return (
        "tools:\n  - name: bad\n    description: d\n    capability: c\n"
        f"    handler: {HANDLER}\n" + body
    )


def issues_of(*args: object, **kwargs: object) -> list[LoadIssue]:
    """The issues ``load_catalog`` raises with."""
    with pytest.raises(CatalogError) as info:
        load_catalog(*args, **kwargs)  # type: ignore[arg-type]
    return info.value.issues


def test_valid_file_loads_with_defaults(write_yaml) -> None:
    """SPEC C1: a valid definition loads; unspecified keys take their documented defaults."""
    path = write_yaml("tools.yaml", GOOD)
    catalog = load_catalog([path])
    tool = catalog.tools["clock"]
    assert tool.mode is Mode.SYNC
    assert (tool.dangerous, tool.requires_approval, tool.long_running) == (False, False, False)
    assert (tool.timeout, tool.promote_after, tool.category, tool.dispatch_message) == (
        None,
        None,
        None,
        None,
    )
    assert tool.source == str(path)
    assert tool.func is clock_now
    assert tool.parameters["required"] == ["timezone"]


def test_async_tool_gets_default_dispatch_message(write_yaml) -> None:
    """SPEC C1/I9: an async tool without dispatch_message gets "Started NAME."."""
    path = write_yaml("t.yaml", tool_yaml("    mode: async\n"))
    assert load_catalog([path]).tools["bad"].dispatch_message == "Started bad."


def test_missing_parameters_means_no_arguments(write_yaml) -> None:
    """SPEC C1: a tool without parameters takes an empty object and nothing else."""
    path = write_yaml("t.yaml", tool_yaml(""))
    assert load_catalog([path]).tools["bad"].parameters == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }


def test_unknown_key_is_refused_with_file_and_tool(write_yaml) -> None:
    """SPEC C1: a misspelt key is an error naming the file, the tool and the key."""
    path = write_yaml("t.yaml", tool_yaml("    dangerus: true\n"))
    [issue] = issues_of([path])
    assert (issue.file, issue.tool) == (str(path), "bad")
    assert issue.message.startswith("dangerus: unknown key (did you mean dangerous?); allowed: ")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("    mode: remote\n", "mode: must be one of sync, async, client, not 'remote'"),
        ("    dangerous: yes please\n", "dangerous: must be true or false"),
        ("    timeout: -1\n", "timeout: must be zero or positive"),
        ("    promote_after: 0\n", "promote_after: must be positive"),
        ("    sensitive: password\n", "sensitive: must be a list of non-empty strings"),
        ("    visibility: {requires_ctx: [a]}\n", "visibility: unknown key(s) requires_ctx"),
        ("    category: ''\n", "category: must be a non-empty string"),
    ],
    ids=["mode", "dangerous", "timeout", "promote_after", "sensitive", "visibility", "category"],
)
def test_bad_values_are_named(write_yaml, body: str, expected: str) -> None:
    """SPEC C1: a bad value is reported with its key."""
    path = write_yaml("t.yaml", tool_yaml(body))
    [issue] = issues_of([path])
    assert issue.tool == "bad"
    assert issue.message.startswith(expected)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("    mode: client\n", "handler: a client-mode tool runs in the frontend"),
        ("    mode: sync\n    dispatch_message: hi\n", "dispatch_message: only async tools"),
        ("    mode: async\n    promote_after: 1\n", "promote_after: only sync tools"),
        ("    long_running: true\n    timeout: 3\n", "timeout: a long_running tool"),
        ("    read_only: true\n    dangerous: true\n", "read_only: a dangerous tool"),
        ("    sensitive: [password]\n", "sensitive: 'password' is not a top-level parameter"),
    ],
    ids=["client-handler", "dispatch", "promote", "long-running", "read-only", "sensitive"],
)
def test_contradictory_keys_are_refused(write_yaml, body: str, expected: str) -> None:
    """SPEC C1: combinations that cannot both hold are load errors."""
    path = write_yaml("t.yaml", tool_yaml(body))
    [issue] = issues_of([path])
    assert issue.message.startswith(expected)


def test_required_keys_reported_together(write_yaml) -> None:
    """SPEC C1: every missing required key is listed, not only the first."""
    path = write_yaml("t.yaml", "tools:\n  - name: lonely\n")
    messages = [issue.message for issue in issues_of([path])]
    assert messages == ["description: required", "capability: required"]


@pytest.mark.parametrize(
    "name",
    ["get weather", "a" * 65, "notes.create", "émoji", ""],
    ids=["space", "too-long", "dot", "non-ascii", "empty"],
)
def test_model_unsafe_names_refused(write_yaml, name: str) -> None:
    """SPEC C1/C4: names outside ^[a-zA-Z0-9_-]{1,64}$ are refused."""
    path = write_yaml("t.yaml", f"tools:\n  - {{name: '{name}', description: d, capability: c}}\n")
    issues = issues_of([path], resolve_handlers=False)
    assert any(issue.message.startswith("name: ") for issue in issues)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ("{type: object, properties: {a: {type: strng}}}", "at /properties/a/type"),
        ("{type: array, items: {type: string}}", "must have type: object at the root"),
        ("{type: object, properties: {a: {type: string, pattern: '(['}}}", "parameters: "),
        ("{type: object, properties: {a: {$ref: '#/$defs/missing'}}}", "does not compile"),
        ("{type: object, properties: {a: {default: 2024-01-01}}}", "is not plain JSON"),
        ("[1, 2]", "must be a JSON Schema object"),
        ("{$schema: 'http://example.com/custom', type: object}", "is not a valid JSON Schema"),
        (
            "{type: object, properties: {name: {type: string}}, required: [name, nam],"
            " additionalProperties: false}",
            "requires 'nam' but does not declare it",
        ),
    ],
    ids=[
        "bad-type",
        "root-not-object",
        "bad-regex",
        "dangling-ref",
        "yaml-date",
        "list",
        "meta",
        "uncallable",
    ],
)
def test_invalid_parameter_schemas_refused(write_yaml, schema: str, expected: str) -> None:
    """SPEC C1/I4: parameters must be a valid, compilable JSON Schema of an object."""
    path = write_yaml("t.yaml", tool_yaml(f"    parameters: {schema}\n"))
    [issue] = issues_of([path])
    assert issue.tool == "bad"
    assert issue.message.startswith("parameters: ")
    assert expected in issue.message


def test_handler_import_failure_reported_at_load(write_yaml) -> None:
    """SPEC C1: a handler whose module does not exist fails the load, not the first call."""
    path = write_yaml("t.yaml", GOOD.replace(HANDLER, "toolbus_no_such_module:fn"))
    [issue] = issues_of([path])
    assert issue.tool == "clock"
    assert "importing 'toolbus_no_such_module' failed: ModuleNotFoundError" in issue.message


def test_handler_module_raising_reported(write_yaml, tmp_path: Path, monkeypatch) -> None:
    """SPEC C1: an exception raised while importing the handler module is a load issue."""
    (tmp_path / "toolbus_broken_mod.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toolbus_broken_mod", raising=False)
    path = write_yaml("t.yaml", GOOD.replace(HANDLER, "toolbus_broken_mod:fn"))
    [issue] = issues_of([path])
    assert "RuntimeError: boom" in issue.message


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        ("gateway.demo.handlers:no_such_function", "has no attribute 'no_such_function'"),
        ("gateway.demo.handlers:NOTES_DB", "is not callable"),
        ("gateway.demo.handlers.clock_now", "is not a 'module:function' path"),
    ],
    ids=["missing-attr", "not-callable", "no-colon"],
)
def test_bad_handler_paths(write_yaml, handler: str, expected: str) -> None:
    """SPEC C1: handler paths are resolved at load and each failure is explained."""
    path = write_yaml("t.yaml", GOOD.replace(HANDLER, handler))
    [issue] = issues_of([path])
    assert expected in issue.message


def test_sync_tool_without_handler_refused_when_resolving(write_yaml) -> None:
    """SPEC C1: a server-run tool needs a handler; a definitions-only load allows none."""
    path = write_yaml("t.yaml", GOOD.replace(f"    handler: {HANDLER}\n", ""))
    [issue] = issues_of([path])
    assert issue.message.startswith("handler: required for a sync tool")
    assert load_catalog([path], resolve_handlers=False).tools["clock"].func is None


def test_case_f10_duplicate_tool_across_files(write_yaml) -> None:
    """SPEC C1 / F10: two files defining send_email fail the load naming both files."""
    body = "tools:\n  - {name: send_email, description: d, capability: mail}\n"
    first = write_yaml("a/mail.yaml", body)
    second = write_yaml("b/mail.yaml", body)
    [issue] = issues_of([first, second], resolve_handlers=False)
    assert (issue.file, issue.tool) == (str(second), "send_email")
    assert str(first) in issue.message
    assert str(second) in issue.message


def test_duplicate_tool_in_one_file(write_yaml) -> None:
    """SPEC C1: a name defined twice in one file is refused too."""
    body = "tools:\n" + "  - {name: x, description: d, capability: c}\n" * 2
    path = write_yaml("t.yaml", body)
    [issue] = issues_of([path], resolve_handlers=False)
    assert issue.message == f"duplicate tool name 'x': in {path} and in {path}"


def test_duplicate_yaml_key_refused(write_yaml) -> None:
    """SPEC C1: a key written twice in one mapping is an error, not last-one-wins."""
    path = write_yaml("t.yaml", tool_yaml("    dangerous: true\n    dangerous: false\n"))
    [issue] = issues_of([path])
    assert (issue.file, issue.tool) == (str(path), None)
    assert issue.message == "line 7: duplicate key 'dangerous'"


def test_all_issues_of_all_files_collected(write_yaml) -> None:
    """SPEC C1: loading goes on past the first problem and reports every one."""
    one = write_yaml("1.yaml", tool_yaml("    colour: red\n"))
    two = write_yaml("2.yaml", "tools:\n  - {name: ok, description: d, capability: c, mode: x}\n")
    three = write_yaml("3.yaml", "tools: [1\n")
    issues = issues_of([one, two, three])
    assert [(issue.file, issue.tool) for issue in issues] == [
        (str(one), "bad"),
        (str(two), "ok"),
        (str(three), None),
    ]
    assert issues[2].message.startswith("invalid YAML: ")
    rendered = str(CatalogError(issues))
    assert rendered.splitlines()[0] == "3 catalog issues:"
    assert f"{one}: bad: colour: unknown key" in rendered


def test_file_level_problems(write_yaml, tmp_path: Path) -> None:
    """SPEC C1: unknown top-level keys, a non-list tools entry and missing paths are issues."""
    path = write_yaml("t.yaml", "tool: []\ntools: {x: 1}\n")
    issues = issues_of([path, tmp_path / "nope.yaml"])
    assert [issue.message for issue in issues] == [
        "no such file or directory",
        "tool: unknown top-level key; allowed: guidance, mcp_servers, tools",
        "tools: must be a list of definitions",
    ]


def test_directory_loads_yaml_files_sorted(write_yaml, tmp_path: Path) -> None:
    """SPEC C1: a directory contributes its *.yaml / *.yml files, in name order."""
    write_yaml("dir/b.yml", "tools:\n  - {name: b, description: d, capability: c}\n")
    write_yaml("dir/a.yaml", "tools:\n  - {name: a, description: d, capability: c}\n")
    write_yaml("dir/notes.txt", "not yaml: [")
    catalog = load_catalog([tmp_path / "dir"], resolve_handlers=False)
    assert [(t.name, Path(t.source).name) for t in catalog.tools.values()] == [
        ("a", "a.yaml"),
        ("b", "b.yml"),
    ]


def test_guidance_loaded_from_tools_file(write_yaml) -> None:
    """SPEC I1: guidance for invented names loads from the tools file."""
    path = write_yaml("t.yaml", GOOD + "guidance:\n  search_web: Use notes_search.\n")
    assert dict(load_catalog([path]).guidance) == {"search_web": "Use notes_search."}


def test_guidance_for_a_real_tool_refused(write_yaml) -> None:
    """SPEC I1: guidance is for names that do not exist; shadowing a tool is an error."""
    path = write_yaml("t.yaml", GOOD + "guidance:\n  clock: Use clock.\n")
    [issue] = issues_of([path])
    assert issue.message.startswith("guidance: 'clock' is a defined tool")


def test_load_tool_dicts_same_rules() -> None:
    """SPEC C1: in-memory definitions are validated exactly like files."""
    with pytest.raises(CatalogError) as info:
        load_tool_dicts([{"name": "x", "description": "d", "capability": "c", "x": 1}], "mem")
    assert info.value.issues == [
        LoadIssue(
            "mem",
            "x",
            "x: unknown key; allowed: capability, category, dangerous, description, "
            "dispatch_message, handler, idempotent, long_running, mode, name, parameters, "
            "promote_after, read_only, requires_approval, sensitive, timeout, title, "
            "visibility",
        )
    ]


def test_from_mcp_tool_maps_annotations() -> None:
    """SPEC C1/C4: an MCP entry's schema and hints become a definition."""
    entry = {
        "name": "delete_file",
        "title": "Delete file",
        "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
        "annotations": {"destructiveHint": True, "idempotentHint": True},
        "outputSchema": {"type": "object"},
    }
    definition = from_mcp_tool(entry, capability="fs")
    assert definition == {
        "name": "delete_file",
        "description": "Delete file",
        "parameters": entry["inputSchema"],
        "capability": "fs",
        "mode": "sync",
        "dangerous": True,
        "idempotent": True,
        "title": "Delete file",
    }
    tool = load_tool_dicts([definition], "mcp").tools["delete_file"]
    assert (tool.dangerous, tool.read_only, tool.idempotent) == (True, False, True)


def test_yaml_syntax_error_names_line_and_column(write_yaml) -> None:
    """SPEC C1: a YAML syntax error is one readable line with its line and column."""
    path = write_yaml("t.yaml", "tools:\n  - name: greet\n  description: x\n")
    [issue] = issues_of([path])
    assert issue.file == str(path)
    assert issue.message.startswith("invalid YAML: line 3, column 3: ")
    assert "\n" not in issue.message
