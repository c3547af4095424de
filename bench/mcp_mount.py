"""Row M3: one call through toolbus to a mounted MCP server, against the same call made
directly with the MCP SDK's client (docs/bench.md, docs/mcp.md).

Two server processes: the bench MCP server (the SDK's MCPServer over Streamable HTTP,
``bench.servers`` kind ``mcp``) and a toolbus gateway (kind ``toolbus_mcp``) whose only
tool is that server's ``noop``, mounted with an empty prefix (SPEC M1). The client
process runs, interleaved round by round: sequential ``invoke noop`` over a toolbus
socket (toolbus validates, gates, audits, commits, then calls the MCP server with the
SDK's ``Client``), and sequential ``call_tool noop`` with the same ``Client`` class
straight to the MCP server. The ratio is the price of toolbus in front of an MCP server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench import clients as c

URL_ENV = "TOOLBUS_BENCH_MCP_URL"


async def serve(args: argparse.Namespace) -> None:
    """The ``toolbus_mcp`` bench server: ready once the MCP server's tools are loaded."""
    from bench.servers import _ready, _until_signalled, toolbus_settings
    from gateway import logs
    from gateway.server import Gateway

    data = Path(args.data)
    settings = toolbus_settings(data)
    tools = data / "mcp_tools.yaml"
    mount = {"name": "peer", "url": os.environ[URL_ENV], "prefix": "", "capability": "bench"}
    tools.write_text(yaml.safe_dump({"tools": [], "mcp_servers": [mount]}))
    catalog = settings.catalog.model_copy(update={"tools": [tools]})
    settings = settings.model_copy(update={"catalog": catalog})
    logs.setup("WARNING", True, settings.data_dir / "audit.jsonl")
    gateway = Gateway(settings)
    await gateway.start()
    async with asyncio.timeout(60):
        await gateway.mcp.servers["peer"].connected.wait()
    _ready(gateway.port)
    try:
        await _until_signalled()
    finally:
        await gateway.drain()


class DirectMcp:
    """The SDK's ``Client`` (the class toolbus mounts with) straight to the MCP server."""

    def __init__(self, stack: contextlib.AsyncExitStack, client: Any) -> None:
        self.stack, self.client = stack, client

    @classmethod
    async def open(cls, url: str) -> DirectMcp:
        from mcp import Client

        stack = contextlib.AsyncExitStack()
        client = await stack.enter_async_context(Client(url, cache=None))
        return cls(stack, client)

    async def call(self, tool: str = "noop") -> None:
        result = await self.client.call_tool(tool, c.MCP_ARGS)
        if result.is_error:
            raise RuntimeError(f"MCP call failed: {result}")

    async def close(self) -> None:
        await self.stack.aclose()


def row(bench: Any, servers: Callable[..., Any]) -> dict[str, Any]:
    """Measure and return the M3 row (fields of ``bench.run.Row``)."""
    plan = bench.plan
    per_round = max(1, plan.p1_mcp_calls // plan.p1_rounds)
    rounds: dict[str, list[float]] = {"toolbus_mounted": [], "mcp_direct": []}
    with servers(["mcp"], bench.uvloop, bench.tmp) as peer:
        os.environ[URL_ENV] = peer["mcp"].url
        with servers(["toolbus_mcp"], bench.uvloop, bench.tmp) as tb_server:

            async def go() -> None:
                tb = await c.ToolbusClient.open(tb_server["toolbus_mcp"].url)
                direct = await DirectMcp.open(peer["mcp"].url)
                systems = [("toolbus_mounted", tb), ("mcp_direct", direct)]
                for _, client in systems:  # warm-up, not recorded
                    await c.sequential(client, 20)
                for r in range(plan.p1_rounds):
                    for name, client in systems if r % 2 == 0 else systems[::-1]:
                        rounds[name].append(c.median(await c.sequential(client, per_round)))
                await tb.close()
                await direct.close()

            bench.loop(go())
    bench.raw["M3"] = {"round_median_rtt_s": rounds, "calls_per_round": per_round}
    med = {k: c.median(v) for k, v in rounds.items()}
    ratio = med["toolbus_mounted"] / med["mcp_direct"]
    return {
        "id": "M3",
        "metric": "sequential call to a mounted MCP tool, median RTT",
        "floor": "",
        "toolbus": f"{med['toolbus_mounted'] * 1e6:,.0f} us",
        "mcp": f"{med['mcp_direct'] * 1e6:,.0f} us",
        "ratio": f"{ratio:.2f}x direct MCP",
        "target": "report only",
        "passed": None,
        "values": med,
    }
