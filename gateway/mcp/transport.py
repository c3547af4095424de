"""The transports of a mounted MCP server, watched for a dead connection (SPEC M2).

A connection is dead when the server can no longer answer on it, whatever the SDK makes
of that for the request at hand:

- a stdio server's output ends (it exited): :func:`watched` sees its read stream end;
- a Streamable HTTP request that the server refused below JSON-RPC: HTTP 404 for the
  ``Mcp-Session-Id`` (the MCP Streamable HTTP spec's "session not found", as after a
  restart of the server), or an HTTP error whose body is not a JSON-RPC error answering
  that request (a server that keeps its sessions in memory and says 400, a proxy's 502).
  The SDK turns those into a JSON-RPC error for the request (``-32603 Server returned an
  error response``, ``-32600 Session terminated``); :func:`http` tells ``broken`` first,
  so the caller can answer ``unavailable`` and reconnect instead of ``handler_error``;
- a refused or reset HTTP connection ends the SDK's transport, hence its read stream.

A JSON-RPC error the server sends as the answer to a request (at HTTP 200, or at an
error status with the request's id) is the server's answer, not a dead connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx2
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCRequest, jsonrpc_message_adapter
from pydantic import ValidationError

from catalog.mcp_mounts import UnsetVariable
from gateway.mcp.calls import unparsed_answer

MCP_SESSION_ID = "mcp-session-id"
NOT_FOUND = 404


@contextlib.asynccontextmanager
async def watched(inner: Any, lost: asyncio.Event) -> AsyncIterator[Any]:
    """The SDK transport ``inner``, with ``lost`` set when its read stream ends: a stdio
    server that exits, or an HTTP transport that failed, is noticed at once, not at the
    next call (SPEC M2)."""
    async with inner as (read, write):
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def pump() -> None:
            try:
                async with send:
                    async for item in read:
                        if isinstance(item, Exception):
                            # SPEC M3, J6: a line the SDK could not parse answers its
                            # request when its id can be read (calls.unparsed_answer).
                            item = unparsed_answer(item) or item
                        await send.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass
            finally:
                lost.set()

        async with anyio.create_task_group() as group:
            group.start_soon(pump)
            try:
                yield receive, write
            finally:
                group.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def http(
    url: str, headers: dict[str, str], broken: Callable[[str], None]
) -> AsyncIterator[Any]:
    """Streamable HTTP with our headers; the HTTP client is closed with the transport
    (the SDK leaves a client it was given open).

    Args:
        url: the server's MCP endpoint.
        headers: sent with every request.
        broken: told (one line, no header values) when a ``POST`` was refused below
            JSON-RPC (:func:`refusal`), before the SDK answers the request (SPEC M2).
    """

    async def on_response(response: httpx2.Response) -> None:
        why = await refusal(response)
        if why is not None:
            broken(why)

    async with create_mcp_http_client(headers=headers) as client:
        client.event_hooks = {**client.event_hooks, "response": [on_response]}
        async with streamable_http_client(url, http_client=client) as streams:
            yield streams


async def refusal(response: httpx2.Response) -> str | None:
    """Why the HTTP ``response`` to a ``POST`` says the connection is dead, or ``None``
    when it does not: a success; a JSON-RPC error answering the request (the server's
    own answer, SPEC M3); a notification refused otherwise than by a 404 for the session
    (the MCP spec lets a server refuse one with a 400 and carries no call). Reads a JSON
    body, which the SDK then reads again from memory."""
    request = response.request
    status = response.status_code
    if request.method != "POST" or status < httpx2.codes.BAD_REQUEST:
        return None
    if status == NOT_FOUND and MCP_SESSION_ID in request.headers:
        return "the server does not know toolbus's MCP session (HTTP 404); it restarted?"
    sent = _request(request.content)
    if sent is None:
        return None
    if response.headers.get("content-type", "").lower().startswith("application/json"):
        await response.aread()
        if _answers(sent, response.content):
            return None
    return f"the server refused a request with HTTP {status} and no JSON-RPC answer"


def _request(sent: bytes) -> JSONRPCRequest | None:
    """The JSON-RPC request ``sent``, or ``None`` for a notification or a response."""
    try:
        message = jsonrpc_message_adapter.validate_json(sent, by_name=False)
    except ValidationError:
        return None
    return message if isinstance(message, JSONRPCRequest) else None


def _answers(request: JSONRPCRequest, received: bytes) -> bool:
    """Whether ``received`` is a JSON-RPC error answering ``request``."""
    try:
        answer = jsonrpc_message_adapter.validate_json(received, by_name=False)
    except ValidationError:
        return False
    return isinstance(answer, JSONRPCError) and answer.id == request.id


def describe(exc: BaseException) -> str:
    """One line about a failure of the peer; exception groups are unwrapped. Never holds
    header or environment values: only the exception's own text."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return "no answer within connect_timeout"
    if isinstance(exc, UnsetVariable):
        return str(exc)  # names the variable only, never a value (SPEC M1)
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
