"""The transports of a mounted MCP server, watched for a dead connection (SPEC M2).

:func:`watched` sets ``lost`` when the SDK transport's read stream ends: a stdio server
that exited, or an HTTP transport that failed (a refused or reset connection).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import SessionMessage

from catalog.mcp_mounts import UnsetVariable


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
async def http(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """Streamable HTTP with our headers; the HTTP client is closed with the transport
    (the SDK leaves a client it was given open)."""
    async with (
        create_mcp_http_client(headers=headers) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams


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
