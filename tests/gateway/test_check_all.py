"""``toolbus check`` validates everything ``serve`` loads and lists every problem of one
run as one ``error:`` line each (SPEC O5, M1, C1), through real ``toolbus``
subprocesses and real mounted MCP servers (``tests/mcp/fault_server.py``).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from catalog.loader import load_catalog
from gateway.mcp.probe import probe_mounts
from tests.support import WAIT, clean_env, run_toolbus

FAULT_SERVER = Path(__file__).resolve().parents[1] / "mcp" / "fault_server.py"
BANNER = "Starting default (STDIO) server..."
NOISY = f"""
import runpy, sys
print({BANNER!r}, file=sys.stderr, flush=True)
runpy.run_path({str(FAULT_SERVER)!r}, run_name="__main__")
"""
BROKEN_TOOL = {
    "name": "broken",
    "description": "x",
    "capability": "faults",
    "mode": "sync",
    "handler": "nowhere_mod:fn",
    "parameters": {"type": "object"},
}


def _toolbus(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env.pop("CHECK_ALL_UNSET", None)
    return run_toolbus(*args, cwd=cwd, env=env)


def _config(tmp: Path, tools: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> Path:
    (tmp / "tools.yaml").write_text(yaml.safe_dump({"tools": tools, "mcp_servers": mounts}))
    (tmp / "profiles.yaml").write_text("profiles:\n  p: {capabilities: [faults]}\n")
    (tmp / "noisy.py").write_text(NOISY)
    config = tmp / "toolbus.yaml"
    catalog = {"tools": ["tools.yaml"], "profiles": ["profiles.yaml"], "hot_reload": False}
    config.write_text(yaml.safe_dump({"data_dir": "data", "catalog": catalog}))
    return config


def _noisy(tmp: Path) -> dict[str, Any]:
    return {"name": "noisy", "command": sys.executable, "args": [str(tmp / "noisy.py")],
            "capability": "faults", "include": ["a*"]}  # fmt: skip


def test_check_refuses_a_data_folder_serve_cannot_create(tmp_path: Path) -> None:
    """SPEC O5: ``data_dir: /proc/nope`` stops ``serve`` ("cannot create it"); ``check``
    says the same, exit 1 (it printed ok and exited 0: root passes the permission test
    on /proc, where nothing can be created)."""
    config = tmp_path / "toolbus.yaml"
    config.write_text("data_dir: /proc/nope\nserver: {port: 0}\n")
    problem = "data_dir /proc/nope: cannot create it: No such file or directory"
    check = _toolbus("check", "--config", str(config), cwd=tmp_path)
    assert (check.returncode, check.stdout, check.stderr) == (1, "", f"error: {problem}\n")
    serve = _toolbus("serve", "--config", str(config), cwd=tmp_path)
    assert (serve.returncode, serve.stderr) == (1, f"toolbus: cannot start: {problem}\n")


def test_check_leaves_nothing_in_the_data_folder(tmp_path: Path) -> None:
    """SPEC O5: the data-folder probe undoes what it tried: a missing folder stays
    missing, an existing one stays empty."""
    config = _config(tmp_path, [], [])
    before = sorted(p.name for p in tmp_path.iterdir())
    assert _toolbus("check", "--config", str(config), cwd=tmp_path).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    (tmp_path / "data").mkdir()
    assert _toolbus("check", "--config", str(config), cwd=tmp_path).returncode == 0
    assert list((tmp_path / "data").iterdir()) == []


def test_check_lists_catalog_and_mount_problems_in_one_run(tmp_path: Path) -> None:
    """SPEC O5, M1, C1: a handler that does not import does not hide the mounts'
    problems (they were probed only once the catalog was fixed); every problem is one
    ``error:`` line; an unset ``${VAR}`` is named in one plain line (it was ``KeyError:
    'environment variable X is not set'``); a mounted server's own stderr stays out of
    the output (it goes to the log)."""
    gone = tmp_path / "no-such-server"
    mounts = [
        _noisy(tmp_path),
        {"name": "gone", "command": str(gone), "capability": "faults"},
        {"name": "h", "url": "http://127.0.0.1:9/mcp", "capability": "faults",
         "headers": {"Authorization": "Bearer ${CHECK_ALL_UNSET}"}},
    ]  # fmt: skip
    config = _config(tmp_path, [BROKEN_TOOL], mounts)
    check = _toolbus("check", "--config", str(config), cwd=tmp_path)
    assert check.returncode == 1
    assert check.stdout == "mcp noisy (stdio): 1 tool(s): noisy_add\n"
    tools = tmp_path / "tools.yaml"
    assert check.stderr.splitlines() == [
        f"error: {tools}: broken: handler: handler 'nowhere_mod:fn': importing 'nowhere_mod' "
        "failed: ModuleNotFoundError: No module named 'nowhere_mod'",
        f"error: mcp gone (stdio: {gone}): cannot load: FileNotFoundError: [Errno 2] No such "
        f"file or directory: '{gone}'",
        "error: mcp h (http: http://127.0.0.1:9/mcp): cannot load: environment variable "
        "CHECK_ALL_UNSET is not set",
    ]
    assert BANNER not in check.stdout + check.stderr


def test_mounted_server_stderr_goes_to_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SPEC M1, O3: what a stdio server writes on stderr is logged (logger
    ``gateway.mcp.stderr``, INFO, naming the mount), not inherited by the terminal."""
    _config(tmp_path, [], [_noisy(tmp_path)])
    catalog = load_catalog([tmp_path / "tools.yaml"], [tmp_path / "profiles.yaml"])
    with caplog.at_level(logging.INFO, logger="gateway.mcp.stderr"):
        notes, failures, count = probe_mounts(catalog.mounts)
        for thread in threading.enumerate():
            if thread.name == "mcp-stderr-noisy":
                thread.join(WAIT)  # ends at the pipe's end: the server has exited
    assert (notes, failures, count) == (["mcp noisy (stdio): 1 tool(s): noisy_add"], [], 1)
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.mcp.stderr"]
    assert f"mcp noisy stderr: {BANNER}" in lines
