"""The ``mcp_servers`` catalog key and ``toolbus check`` with mounted servers (SPEC M1)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from catalog.errors import CatalogError
from catalog.loader import load_catalog, load_tool_dicts
from catalog.mcp_mounts import MountSpec, expand_env, parse_mounts, tool_definition
from gateway.cli import main
from gateway.mcp.calls import build_tools
from tests.mcp.support import FAULT_SERVER


def _issues(raw: Any) -> list[str]:
    return [str(issue) for issue in parse_mounts(raw, "/cat/tools.yaml")[1]]


def test_parse_stdio_and_http_servers_with_defaults() -> None:
    """SPEC M1: stdio and Streamable HTTP entries; prefix and capability default to the name."""
    specs, issues = parse_mounts(
        [
            {"name": "a", "command": "node", "args": ["x.js"], "env": {"K": "v"}, "cwd": "srv"},
            {"name": "b", "url": "https://h/mcp", "headers": {"Authorization": "Bearer ${T}"}},
        ],
        "/cat/tools.yaml",
    )
    assert issues == []
    a, b = specs
    assert (a.transport, a.prefix, a.capability, a.cwd) == ("stdio", "a_", "a", "/cat/srv")
    assert (b.transport, b.prefix, b.headers["Authorization"]) == ("http", "b_", "Bearer ${T}")


def test_parse_reports_every_problem() -> None:
    """SPEC M1, C1: typos, both or neither transport, stdio keys on HTTP, bad overrides."""
    assert _issues([{"name": "a", "comand": "x"}]) == [
        "/cat/tools.yaml: mcp:a: comand: unknown key (did you mean command?); allowed: args, "
        "backoff_initial, backoff_max, capability, command, connect_timeout, cwd, defaults, "
        "env, exclude, headers, health_interval, include, name, prefix, sampling, tools, url",
        "/cat/tools.yaml: mcp:a: exactly one of command (stdio) or url (Streamable HTTP) "
        "is required",
    ]
    assert _issues([{"name": "a", "url": "ftp://x", "args": []}]) == [
        "/cat/tools.yaml: mcp:a: url: must be an http:// or https:// URL (Streamable HTTP)",
        "/cat/tools.yaml: mcp:a: exactly one of command (stdio) or url (Streamable HTTP) "
        "is required",
    ]
    assert _issues([{"name": "a", "url": "http://x/mcp", "env": {}}]) == [
        "/cat/tools.yaml: mcp:a: env: only for stdio servers (command)"
    ]
    assert _issues([{"name": "a", "command": "x", "tools": {"t": {"handler": "m:f"}}}]) == [
        "/cat/tools.yaml: mcp:a: tools.t: handler: unknown key; allowed: category, "
        "dangerous, description, dispatch_message, idempotent, long_running, mode, "
        "promote_after, read_only, requires_approval, sensitive, timeout, visibility"
    ]
    assert _issues([{"name": "bad name"}]) == [
        "/cat/tools.yaml: mcp_servers[0]: name: 'bad name' must match ^[A-Za-z0-9_-]{1,32}$"
    ]


def test_annotations_give_defaults_and_overrides_win() -> None:
    """SPEC M1: destructiveHint -> dangerous + approval; read-only and idempotent hints
    carry over; server defaults, then per-tool overrides, win."""
    spec = MountSpec(
        name="s",
        source="x",
        command="c",
        prefix="s_",
        capability="cap",
        defaults={"timeout": 5},
        overrides={"rm": {"requires_approval": False, "mode": "async"}},
    )
    entry = {
        "name": "rm",
        "inputSchema": {"type": "object"},
        "annotations": {"destructiveHint": True, "idempotentHint": True},
    }
    assert tool_definition(spec, entry) == {
        "name": "s_rm",
        "description": "rm",
        "parameters": {"type": "object"},
        "capability": "cap",
        "mode": "async",
        "dangerous": True,
        "requires_approval": False,
        "idempotent": True,
        "timeout": 5,
    }
    read = {"name": "ls", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
    catalog = load_tool_dicts([tool_definition(spec, read)], "mcp:s")
    assert catalog.tools["s_ls"].read_only
    assert not catalog.tools["s_ls"].dangerous


def test_a_tool_with_an_unknown_dialect_is_left_out_alone() -> None:
    """SPEC M1, E3: a listed tool whose inputSchema names another $schema is left out
    with a problem naming it (nothing is fetched); the server's other tools stay."""
    spec = MountSpec(name="s", source="x", command="c", prefix="s_", capability="cap")
    remote = {"$schema": "http://169.254.169.254/latest/meta-data/iam", "type": "object"}
    entries = [
        {"name": "remote", "inputSchema": remote},
        {"name": "fine", "inputSchema": {"type": "object"}},
    ]
    tools, problems = build_tools(spec, entries, lambda name: lambda params, ctx: name)
    assert sorted(tools) == ["s_fine"]
    [problem] = problems
    assert problem.startswith("remote: parameters: is not a valid JSON Schema: $schema ")
    assert "169.254.169.254" in problem
    assert "not a dialect toolbus knows" in problem


def test_expand_env_names_a_missing_variable_never_a_value() -> None:
    """SPEC M1: ``${VAR}`` is read from the environment; a missing one is named."""
    assert expand_env("Bearer ${TOK}", {"TOK": "s3cret"}) == "Bearer s3cret"
    with pytest.raises(KeyError, match="environment variable TOK is not set"):
        expand_env("Bearer ${TOK}", {})


def _catalog_dir(tmp: Path, mounts: list[dict[str, Any]], grants: list[str]) -> Path:
    (tmp / "tools.yaml").write_text(yaml.safe_dump({"tools": [], "mcp_servers": mounts}))
    profile = {"capabilities": ["faults"], "allow_dangerous": grants}
    (tmp / "profiles.yaml").write_text(yaml.safe_dump({"profiles": {"p": profile}}))
    config = tmp / "toolbus.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data_dir": "data",
                "catalog": {"tools": ["tools.yaml"], "profiles": ["profiles.yaml"]},
            }
        )
    )
    return config


def test_grants_may_name_mounted_tools_but_duplicates_fail(tmp_path: Path) -> None:
    """SPEC M1, C2: ``allow_dangerous`` may name a tool under a mount's prefix (known only
    once the server answers); another unknown name still fails; names are unique."""
    mount = {"name": "f", "command": "x", "capability": "faults"}
    _catalog_dir(tmp_path, [mount], ["f_wipe"])
    catalog = load_catalog([tmp_path / "tools.yaml"], [tmp_path / "profiles.yaml"])
    assert [spec.name for spec in catalog.mounts] == ["f"]
    _catalog_dir(tmp_path, [mount, mount], ["g_wipe"])
    with pytest.raises(CatalogError) as caught:
        load_catalog([tmp_path / "tools.yaml"], [tmp_path / "profiles.yaml"])
    messages = sorted(issue.message for issue in caught.value.issues)
    assert messages == [
        "allow_dangerous: 'g_wipe' is not a tool of the catalog",
        f"duplicate MCP server 'f': in {tmp_path / 'tools.yaml'} and in {tmp_path / 'tools.yaml'}",
    ]


def test_check_connects_and_reports_what_it_would_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC M1: ``toolbus check`` lists each server's tools; an unreachable one fails."""
    good = {
        "name": "f",
        "command": sys.executable,
        "args": [str(FAULT_SERVER)],
        "capability": "faults",
        "include": ["a*", "w*"],
    }
    config = _catalog_dir(tmp_path, [good], ["f_wipe"])
    assert main(["check", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "mcp f (stdio): 2 tool(s): f_add, f_wipe\nok: 2 tools, 1 profile\n" in out
    bad = {"name": "gone", "command": str(tmp_path / "no-such-server"), "capability": "faults"}
    config = _catalog_dir(tmp_path, [good, bad], ["f_wipe"])
    assert main(["check", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert f"error: mcp gone (stdio: {tmp_path / 'no-such-server'}): cannot load: " in err


def test_m1_relative_args_resolve_against_cwd_not_the_tools_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC M1 (docs/mcp.md, README): a relative path in args resolves against the mount's
    cwd; with ``cwd: .`` that is the tools file's folder from any working directory,
    without cwd it is toolbus's working directory, where the server is not found."""
    folder = tmp_path / "cat"
    (folder / "srv").mkdir(parents=True)
    (folder / "srv" / "server.py").write_text(FAULT_SERVER.read_text())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    mount = {
        "name": "f",
        "command": sys.executable,
        "args": ["srv/server.py"],
        "capability": "faults",
        "include": ["a*"],
    }
    config = _catalog_dir(folder, [{**mount, "cwd": "."}], [])
    assert main(["check", "--config", str(config)]) == 0
    assert "mcp f (stdio): 1 tool(s): f_add\n" in capsys.readouterr().out
    config = _catalog_dir(folder, [mount], [])
    assert main(["check", "--config", str(config)]) == 1
    assert f"error: mcp f (stdio: {sys.executable}): cannot load: " in capsys.readouterr().err
