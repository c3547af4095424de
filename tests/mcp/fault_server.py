"""A small MCP server (the SDK's MCPServer, stdio) for the mounting tests (SPEC M1-M3).

Tools cover every content type and the faults a real server shows: an ``isError``
result, a crash mid-call, a hang (cancellation reaches it and it says so in a marker
file), progress, a tool list that changes, and a destructive tool. Run with
``python tests/mcp/fault_server.py``; ``FAULT_DIR`` names the folder for marker files.
"""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("faults")
MARKERS = Path(os.environ.get("FAULT_DIR", "."))
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
WAV = base64.b64encode(b"RIFF....WAVEfmt ").decode()


def _mark(name: str) -> None:
    (MARKERS / name).write_text("1")


@server.tool(annotations=types.ToolAnnotations(readOnlyHint=True, idempotentHint=True))
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def media() -> types.CallToolResult:
    """Return one block of every content type, and structured content."""
    return types.CallToolResult(
        content=[
            types.TextContent(type="text", text="every kind"),
            types.ImageContent(type="image", data=PNG, mime_type="image/png"),
            types.AudioContent(type="audio", data=WAV, mime_type="audio/wav"),
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri="file:///notes/a.txt", mime_type="text/plain", text="note a"
                ),
            ),
            types.EmbeddedResource(
                type="resource",
                resource=types.BlobResourceContents(
                    uri="file:///bin/b.dat", mime_type="application/octet-stream", blob=PNG
                ),
            ),
            types.ResourceLink(
                type="resource_link",
                uri="file:///docs/c.md",
                name="c.md",
                mime_type="text/markdown",
            ),
        ],
        structured_content={"kinds": 6},
    )


@server.tool()
def fail(reason: str) -> types.CallToolResult:
    """Answer isError with the reason."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"cannot: {reason}")], is_error=True
    )


@server.tool()
async def crash() -> str:
    """Exit the process in the middle of the call."""
    _mark("crash-started")
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answer; write a marker when the call is cancelled."""
    _mark("hang-started")
    try:
        await anyio.sleep(3600)
    except anyio.get_cancelled_exc_class():
        _mark("hang-cancelled")
        raise
    return "never"


@server.tool()
async def steps(count: int, ctx: Context) -> str:
    """Report progress ``count`` times, then answer."""
    for step in range(1, count + 1):
        await ctx.report_progress(step, count, f"step {step}")
        await anyio.sleep(0.02)
    return f"{count} steps"


@server.tool()
async def overflow(ctx: Context) -> str:
    """Report progress whose fraction overflows a float (1e308 of 1e-308), then answer."""
    await ctx.report_progress(1e308, 1e-308, "huge")
    return "overflowed"


@server.tool(annotations=types.ToolAnnotations(destructiveHint=True))
def wipe(target: str) -> str:
    """A destructive tool: needs approval and an allow_dangerous opt-in."""
    return f"wiped {target}"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool ``extra`` and announce list_changed."""

    def extra() -> str:
        """A tool that appears later."""
        return "extra"

    server.add_tool(extra)
    await ctx.notify_tools_changed()
    return "grown"


@server.tool()
def bad_schema_tool_ok() -> str:
    """A plain tool (the name exercises include/exclude patterns)."""
    return "ok"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "http":
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run("stdio")
