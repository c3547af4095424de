"""A mounted MCP server's tools: built from ``tools/list``, called by ``tools/call`` (M1, M3).

:func:`list_entries` reads ``tools/list``, :func:`build_tools` turns its entries into
toolbus tools, and :func:`call_tool` makes one call through the SDK's :class:`mcp.Client`
and maps what comes back (progress, result, ``isError``, JSON-RPC errors, a lost
connection) to toolbus terms.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from catalog.mcp_mounts import MountSpec, tool_definition
from catalog.model import ToolDef
from catalog.tooldefs import parse_tool
from gateway.context import ToolContext
from gateway.failures import ToolFailure
from gateway.mcp.mapping import error_text, to_result
from gateway.mcp.peer import PeerRequests
from protocol.errors import ErrorCode

Handler = Callable[[dict[str, Any], ToolContext], Any]


async def list_entries(client: Client) -> list[dict[str, Any]]:
    """Every ``tools/list`` entry of the server, as JSON objects (wire names), all pages
    (at most 100: a server whose pages never end cannot hang us)."""
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(100):
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        entries.extend(
            t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools
        )
        cursor = page.next_cursor
        if cursor is None:
            break
    return entries


def build_tools(
    spec: MountSpec, entries: list[dict[str, Any]], handler: Callable[[str], Handler]
) -> tuple[dict[str, ToolDef], list[str]]:
    """toolbus tools from ``tools/list`` entries (SPEC M1): filtered by include and
    exclude, defaults from annotations, overrides applied, each checked like a file tool
    (SPEC C1); a tool that fails is left out and its problems returned.

    Args:
        spec: the server's configuration.
        entries: the listed tools as JSON objects (wire names).
        handler: the toolbus handler calling one MCP tool, by its MCP name.

    Returns:
        ``(tools by toolbus name, problems)``.
    """
    tools: dict[str, ToolDef] = {}
    problems: list[str] = []
    source = f"mcp:{spec.name}"
    for index, entry in enumerate(entries):
        mcp_name = str(entry.get("name"))
        if not spec.wanted(mcp_name):
            continue
        parsed = parse_tool(tool_definition(spec, entry), source, index, resolve_handlers=False)
        if parsed.tool is None:
            problems.extend(f"{mcp_name}: {p}" for p in parsed.problems)
            continue
        tools[parsed.tool.name] = replace(parsed.tool, func=handler(mcp_name))
    return tools, problems


MALFORMED: Final = "toolbus: malformed response"
"""``data`` of the JSON-RPC error :func:`unparsed_answer` makes: :func:`call_tool` reads
it as "the server sent a malformed result" (SPEC M3)."""


def unparsed_answer(exc: Exception) -> SessionMessage | None:
    """A JSON-RPC error answering the request whose response the SDK could not parse
    (SPEC M3, J6), or ``None`` when no request can be named.

    The transport watch (:mod:`gateway.mcp.server`) asks for each parse failure the
    SDK's transport reports. The SDK hands a line it cannot parse (a lone surrogate
    escape, a bad envelope) to the message handler, not to the request it answers: the
    call would wait for its timeout, a job for ever. The line is read again, leniently
    (``json`` accepts what pydantic's parser refuses), only for its ``id``; a line that
    is not a response (no ``id``, or neither ``result`` nor ``error``) stays the SDK's
    (logged by it; no call can be named).
    """
    if not isinstance(exc, ValidationError) or not exc.errors():
        return None
    first = exc.errors()[0]
    raw = first.get("input")
    try:
        message = json.loads(raw) if isinstance(raw, str | bytes) else raw
    except ValueError:
        return None
    if not isinstance(message, dict) or not ("result" in message or "error" in message):
        return None
    request_id = message.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    problem = f"{exc.error_count()} problem(s), first: {first['msg']}"
    error = types.ErrorData(code=types.INTERNAL_ERROR, message=problem, data=MALFORMED)
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))


async def call_tool(
    client: Client,
    peer: PeerRequests,
    mcp_name: str,
    params: dict[str, Any],
    ctx: ToolContext,
    lost: Callable[[], None],
    dead: Callable[[], bool],
) -> dict[str, Any]:
    """Call the MCP tool ``mcp_name`` for the toolbus call ``ctx`` (SPEC M3).

    MCP progress becomes ``ctx.progress`` (a fraction when there is a total); cancelling
    the caller's task makes the SDK send ``notifications/cancelled``.

    Args:
        client: the connected SDK client.
        peer: the server's callbacks, told which call runs (elicitation, SPEC M3).
        mcp_name: the tool's MCP name.
        params: the arguments, already validated (I4).
        ctx: the toolbus call.
        lost: called when the connection closed during the call (SPEC M2).
        dead: whether the connection is known dead (the HTTP transport saw a request
            refused below JSON-RPC, :mod:`gateway.mcp.transport`): a JSON-RPC error
            then is the SDK's stand-in for the refusal, not the server's answer (M2).

    Returns:
        The result object of :func:`gateway.mcp.mapping.to_result`.

    Raises:
        ToolFailure: ``unavailable`` when the connection is lost during the call, or
            the call was refused by a transport found dead;
            ``handler_error`` with the server's text for ``isError``, with the MCP error
            for a JSON-RPC error, or naming a malformed result.
    """

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        # SPEC M3, J2: MCP progress (value, optional total) -> fraction and message.
        fraction = progress / total if total else None
        if fraction is not None and not math.isfinite(fraction):
            # A server's overflowing numbers must not raise in the SDK's callback (I16):
            # the step is still reported, as text.
            fraction = None
        text = f"{progress:g}/{total:g}" if total else f"{progress:g}"
        ctx.progress(fraction, message or text)

    name = peer.spec.name
    with peer.calling(ctx):
        try:
            result = await client.call_tool(mcp_name, params, progress_callback=on_progress)
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED or dead():
                lost()
                text = f"MCP server {name!r} went away during the call"
                raise ToolFailure(ErrorCode.UNAVAILABLE, text) from None
            if exc.data == MALFORMED:
                # SPEC M3, J6: the response reached no call (gateway.mcp.server._watched).
                text = f"MCP server {name!r} sent a malformed result: {exc}"
                raise ToolFailure(ErrorCode.HANDLER_ERROR, text) from None
            raise ToolFailure(ErrorCode.HANDLER_ERROR, f"MCP error {exc.code}: {exc}") from None
        except ValidationError as exc:
            raise ToolFailure(
                ErrorCode.HANDLER_ERROR,
                f"MCP server {name!r} sent a malformed result: "
                f"{exc.error_count()} problem(s), first: {exc.errors()[0]['msg']}",
            ) from None
    if result.is_error:
        raise ToolFailure(ErrorCode.HANDLER_ERROR, error_text(result))
    return to_result(result, ctx.tool)
