"""Support for the MCP tests: catalogs that mount real MCP servers (SPEC M1-M3).

Servers used: ``tests/mcp/fault_server.py`` (the SDK's MCPServer over stdio, for faults)
and the MCP project's reference server "everything", installed by
``scripts/ensure-mcp-everything`` into ``.cache/mcp-everything`` (a missing install
fails the tests that need it, with the command to run).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

import toolbus
from gateway.config import DEMO_DIR, Settings
from gateway.server import Gateway
from tests.support import MS, WAIT, settings_for

ROOT = Path(__file__).resolve().parents[2]
FAULT_SERVER = Path(__file__).resolve().parent / "fault_server.py"
ELICIT_SERVER = Path(__file__).resolve().parent / "elicit_server.py"
EVERYTHING = (
    ROOT
    / ".cache/mcp-everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)


def everything_entry() -> Path:
    """The installed everything server's entry point; fails (never skips) when absent."""
    assert EVERYTHING.is_file(), (
        f"{EVERYTHING} is missing: run scripts/ensure-mcp-everything (scripts/check does)"
    )
    return EVERYTHING


def fault_mount(tmp: Path, **extra: Any) -> dict[str, Any]:
    """An ``mcp_servers`` entry for the fault server, markers in ``tmp``."""
    return {
        "name": "f",
        "command": sys.executable,
        "args": [str(FAULT_SERVER)],
        "env": {"FAULT_DIR": str(tmp)},
        "capability": "faults",
        **extra,
    }


def asker_mount() -> dict[str, Any]:
    """An ``mcp_servers`` entry for ``tests/mcp/elicit_server.py``: tool ``asker_ask``
    (capability ``asker``) asks its user a form (SPEC M3)."""
    return {"name": "asker", "command": sys.executable, "args": [str(ELICIT_SERVER)]}


def mcp_settings(
    tmp: Path,
    mounts: list[dict[str, Any]],
    *,
    allow_dangerous: list[str] = (),  # type: ignore[assignment]
    tools: list[dict[str, Any]] | None = None,
    **sections: Any,
) -> Settings:
    """Settings whose catalog is ``mounts`` (and ``tools``), profile ``demo`` granting
    every mount's capability (the test tokens may use ``demo``)."""
    catalog = tmp / "catalog"
    catalog.mkdir(exist_ok=True)
    (catalog / "tools.yaml").write_text(
        yaml.safe_dump({"tools": tools or [], "mcp_servers": mounts})
    )
    capabilities = sorted({m.get("capability", m["name"]) for m in mounts})
    profile = {"capabilities": capabilities, "allow_dangerous": list(allow_dangerous)}
    (catalog / "profiles.yaml").write_text(yaml.safe_dump({"profiles": {"demo": profile}}))
    return settings_for(
        tmp,
        catalog={
            "tools": [catalog / "tools.yaml"],
            "profiles": [catalog / "profiles.yaml"],
            "hot_reload": False,
        },
        **sections,
    )


def client(gateway: Gateway, **options: Any) -> toolbus.Client:
    options.setdefault("token", "alice-token")
    options.setdefault("profile", "demo")
    options.setdefault("request_timeout", WAIT)
    return toolbus.connect(gateway.url, **options)


async def has_tools(bus: toolbus.Client, *names: str) -> None:
    """Wait until the session's catalog holds ``names`` (pushed, SPEC C3, M2)."""
    await bus.wait_catalog(lambda tools: set(names) <= {t.name for t in tools}, timeout=WAIT)


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    """Wait for an effect in another process (a marker file, a reconnect), bounded by
    :data:`WAIT`; polling is the only way to observe a subprocess's file."""
    try:
        async with asyncio.timeout(WAIT):
            while not predicate():  # noqa: ASYNC110 - another process's effect: poll it
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT} s: {what}") from None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def reloading_catalog(tmp: Path) -> tuple[dict[str, Any], Path]:
    """A copy of the demo catalog with hot reload every 10 ms; returns the catalog
    section and the profiles file to change."""
    folder = tmp / "catalog"
    folder.mkdir()
    shutil.copy(DEMO_DIR / "tools.yaml", folder / "tools.yaml")
    profiles = folder / "profiles.yaml"
    shutil.copy(DEMO_DIR / "profiles.yaml", profiles)
    catalog = {
        "tools": [folder / "tools.yaml"],
        "profiles": [profiles],
        "hot_reload": True,
        "reload_interval": 10 * MS,
    }
    return catalog, profiles
