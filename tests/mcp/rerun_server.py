"""A small MCP server (the SDK's MCPServer, stdio) that counts its runs (SPEC J5, M1).

``once`` and ``again`` append a line to ``<RUNS_DIR>/<tool>.runs`` each time they start.
The first run of each never answers (the gateway is killed while it runs); every later
run answers ``run <n>`` at once. ``again`` carries ``idempotentHint: true``, so toolbus
marks it ``idempotent`` and re-runs its job after a restart; ``once`` carries no hint.
Run with ``python tests/mcp/rerun_server.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import mcp_types as types
from mcp.server.mcpserver import MCPServer

server = MCPServer("reruns")
RUNS = Path(os.environ.get("RUNS_DIR", "."))


async def _run(tool: str) -> str:
    log = RUNS / f"{tool}.runs"
    with log.open("a") as out:
        out.write(f"{os.getpid()}\n")
    count = len(log.read_text().splitlines())
    if count == 1:
        await anyio.sleep_forever()  # the first run is cut off by the gateway's death
    return f"run {count}"


@server.tool(annotations=types.ToolAnnotations(idempotentHint=True))
async def again(label: str) -> str:
    """Idempotent work: safe to run again."""
    return await _run("again")


@server.tool()
async def once(label: str) -> str:
    """Work with effects: must not run twice."""
    return await _run("once")


if __name__ == "__main__":
    server.run("stdio")
