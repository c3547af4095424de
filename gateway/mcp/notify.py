"""Catalog changes told to the MCP clients of ``/mcp`` (SPEC M4, C3).

A catalog pushed to an internal session makes one ``notifications/tools/list_changed``
for every MCP client, whatever protocol version it negotiated:

- 2026-07-28 clients get it on the ``subscriptions/listen`` stream they opened
  (the SDK's :class:`~mcp.server.subscriptions.ListenHandler` on :attr:`ListChanged.bus`);
- initialize-handshake clients (versions before 2026-07-28) get it on their standalone
  (GET) stream, once they have listed or called tools. Their ``initialize`` answer
  declares ``tools.listChanged`` (:class:`ListChangedServer`).

Everyone is told of every change: a client may hear of another profile's change and
list again to find its own unchanged; it never misses its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS


class ListChangedServer(Server[Any]):
    """The SDK's low-level server, whose ``initialize`` answer (protocol versions before
    2026-07-28) declares ``tools.listChanged`` (SPEC M4). 2026-07-28 clients learn it
    from ``server/discover`` (``subscriptions/listen`` is served)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


class ListChanged:
    """Who to tell of a catalog change, and the telling (SPEC M4, C3)."""

    def __init__(self) -> None:
        self.bus = InMemorySubscriptionBus()
        """``notifications/tools/list_changed`` to ``subscriptions/listen`` streams."""
        self._handshake: dict[str, ServerSession] = {}
        """``Mcp-Session-Id`` -> the SDK session of an initialize-handshake client that
        listed or called tools. Kept until its ``DELETE`` (:meth:`forget`), as long as
        the SDK's session manager keeps the session itself."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._scheduled = False

    def handshake_clients(self) -> int:
        """How many initialize-handshake clients are told of changes now."""
        return len(self._handshake)

    def remember(self, ctx: ServerRequestContext[Any]) -> None:
        """A request of an initialize-handshake client that lists or calls tools: the
        client is told of changes from now on. Other requests change nothing."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or ctx.request is None:
            return
        mcp_session = ctx.request.headers.get("mcp-session-id")
        if mcp_session:
            self._handshake[mcp_session] = ctx.session

    def forget(self, mcp_session: str) -> None:
        """The client ended its MCP session (``DELETE``)."""
        self._handshake.pop(mcp_session, None)

    def changed(self) -> None:
        """A session's catalog changed. The pushes of one change (one per internal
        session, in the same turn of the loop) make one notification."""
        if self._scheduled:
            return  # a notification not sent yet covers this change too
        self._scheduled = True
        task = asyncio.get_running_loop().create_task(self._tell())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tell(self) -> None:
        self._scheduled = False  # running now: a later change needs a new notification
        await self.bus.publish(ToolsListChanged())
        for session in list(self._handshake.values()):
            await session.send_tool_list_changed()  # dropped by the SDK once closed
