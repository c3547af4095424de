"""A connected MCP server's tools kept current: listed on change, probed when idle (M2, C3).

:func:`watch` runs while one connection lasts. It lists the tools again (the server's
``refresh``, which republishes them when anything changed, SPEC C3) when the server
announces ``list_changed``, and every ``health_interval`` seconds of quiet as a
liveness probe.

A ``tools/list`` that fails while the connection lives (a JSON-RPC error answer, a
result the SDK cannot parse) is the server's trouble with one listing, not a dead
server: the tools stay as last listed, calls in flight go on, and the listing is tried
again after ``backoff_initial`` seconds, doubling up to ``backoff_max`` (SPEC M2). Only
a dead connection (:mod:`gateway.mcp.transport`) or no answer within
``connect_timeout`` ends the watch, and the supervisor reconnects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import anyio
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from catalog.mcp_mounts import MountSpec
from gateway.mcp.transport import describe

logger = logging.getLogger("gateway.mcp")

Refresh = Callable[[Client], Awaitable[None]]
"""``refresh(client)``: list the tools and republish them if they changed; raises when
the listing failed."""


async def watch(
    client: Client, spec: MountSpec, lost: asyncio.Event, relist: asyncio.Event, refresh: Refresh
) -> None:
    """Until the connection is lost: relist on ``list_changed``, probe when idle (M2).

    Args:
        client: the connected SDK client.
        spec: the server's configuration (intervals and backoff, in seconds).
        lost: set when the connection is dead; :func:`watch` then returns, even from a
            listing that failed meanwhile.
        relist: set on ``list_changed``; cleared here when the listing starts.
        refresh: lists the tools and republishes them (SPEC C3).

    Raises:
        TimeoutError: a listing got no answer within ``connect_timeout``.
        Exception: a listing failed because the connection died.
    """
    listener = None
    if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
        listener = asyncio.ensure_future(_listen(client, spec, lost, relist))
    try:
        await _loop(client, spec, lost, relist, refresh)
    finally:
        if listener is not None:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)


async def _listen(
    client: Client, spec: MountSpec, lost: asyncio.Event, relist: asyncio.Event
) -> None:
    """2026-07-28 servers send ``list_changed`` only on a ``subscriptions/listen``
    stream (older ones as a plain notification, the server's message handler). A
    stream that ends (the server restarted: 2026-07-28 keeps no session to lose) is
    opened again with backoff, and the tools listed again: a stream replays nothing.
    Opening it on a server that is gone fails the transport: the server is reconnected."""
    delay = spec.backoff_initial
    while not lost.is_set():
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    relist.set()
                    # It works. (Not reset on the acknowledgement alone: a server
                    # that acknowledges and closes at once would be listed twice a second.)
                    delay = spec.backoff_initial
        except Exception as exc:  # the probe notices a dead server; this only logs
            logger.info("mcp %s: change stream ended: %s", spec.name, describe(exc))
        relist.set()
        await asyncio.sleep(delay)
        delay = min(delay * 2, spec.backoff_max)


async def _loop(
    client: Client, spec: MountSpec, lost: asyncio.Event, relist: asyncio.Event, refresh: Refresh
) -> None:
    retry: float | None = None
    """Seconds before a failed listing is tried again; ``None`` while the last worked."""
    while not lost.is_set():
        await _next(lost, relist, spec.health_interval if retry is None else retry)
        if lost.is_set():
            return
        relist.clear()
        try:
            with anyio.fail_after(spec.connect_timeout):
                await refresh(client)
        except Exception as exc:
            if lost.is_set():
                return  # the connection is dead, and who found it said why (SPEC M2)
            if _dead(exc):
                raise  # the supervisor reconnects (SPEC M2)
            retry = spec.backoff_initial if retry is None else min(retry * 2, spec.backoff_max)
            logger.warning(
                "mcp %s: tools/list failed: %s; its tools stay as listed, listing again in %.1f s",
                spec.name,
                describe(exc),
                retry,
            )
        else:
            retry = None


async def _next(lost: asyncio.Event, relist: asyncio.Event, seconds: float) -> None:
    """Wait until the connection is lost, a ``list_changed`` came, or ``seconds`` seconds
    passed, whichever is first."""
    waits = {asyncio.ensure_future(lost.wait()), asyncio.ensure_future(relist.wait())}
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


def _dead(exc: Exception) -> bool:
    """Whether a failed listing says the connection is dead, not the server's answer: no
    answer in time, the SDK's "connection closed", or a closed transport stream."""
    if isinstance(exc, MCPError):
        return exc.code == CONNECTION_CLOSED
    return isinstance(exc, TimeoutError | anyio.ClosedResourceError | anyio.BrokenResourceError)
