"""``toolbus check``'s look at each mounted MCP server (SPEC M1).

Each server of the catalog is connected once, its ``tools/list`` turned into toolbus
tools exactly as ``serve`` would, and the outcome printed: the tools it would load,
each tool left out and why, or why the server could not be reached.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from catalog.mcp_mounts import MountSpec
from gateway.mcp.server import MountedServer, describe


async def _probe_one(spec: MountSpec) -> tuple[list[str], list[str], int]:
    server = MountedServer(spec, lambda _server: None)
    where = spec.command if spec.command is not None else spec.url
    try:
        await server.probe()
    except Exception as exc:  # report whatever the peer did; check must not crash
        error = f"mcp {spec.name} ({spec.transport}: {where}): cannot load: {describe(exc)}"
        return [], [error], 0
    names = ", ".join(sorted(server.tools)) or "(none)"
    notes = [f"mcp {spec.name} ({spec.transport}): {len(server.tools)} tool(s): {names}"]
    errors = [f"mcp {spec.name}: tool left out: {problem}" for problem in server.problems]
    return notes, errors, len(server.tools)


def probe_mounts(specs: Sequence[MountSpec]) -> tuple[list[str], list[str], int]:
    """Connect to every server in ``specs`` (in parallel) and report (SPEC M1).

    Returns:
        ``(notes, errors, tools)``: one note per reachable server with the tools it
        would load; an error per unreachable server and per tool left out; how many
        tools the servers would add. Never holds a header or environment value.
    """

    async def run() -> list[tuple[list[str], list[str], int]]:
        return await asyncio.gather(*(_probe_one(spec) for spec in specs))

    notes: list[str] = []
    errors: list[str] = []
    count = 0
    for found, failed, tools in asyncio.run(run()) if specs else []:
        notes.extend(found)
        errors.extend(failed)
        count += tools
    return notes, errors, count
