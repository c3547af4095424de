"""One listening socket for WebSocket and ``/mcp`` (SPEC M4, S1).

websockets reads request heads only, so an MCP request (``POST /mcp`` with a JSON body,
``GET /mcp`` for the SSE stream, ``DELETE /mcp``) cannot go through it. Each accepted
connection first gets a :class:`Sniffer`: it looks at the request line of the first
bytes, then hands the transport (and those bytes) either to websockets' connection,
:class:`gateway.wslib.WsConnection` (everything else, as before), or to
uvicorn's h11 HTTP/1.1 protocol serving the MCP ASGI app. The decision costs one prefix
test per connection; a WebSocket's frames never pass through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import h11
from uvicorn import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

MCP_PREFIXES = (b"POST /mcp", b"GET /mcp", b"DELETE /mcp", b"OPTIONS /mcp")
"""Request lines that go to the MCP app when followed by a space, ``?`` or ``/``."""

_LONGEST = max(len(p) for p in MCP_PREFIXES) + 1


def is_mcp(head: bytes) -> bool | None:
    """Whether a connection's first bytes are an MCP request; ``None``: not enough yet."""
    undecided = False
    for prefix in MCP_PREFIXES:
        if head.startswith(prefix):
            if len(head) == len(prefix):
                return None
            return head[len(prefix) : len(prefix) + 1] in (b" ", b"?", b"/")
        if prefix.startswith(head):
            undecided = True
    return None if undecided else False


class HeadTimed(H11Protocol):
    """uvicorn's h11 protocol with a deadline on every request head (SPEC E1, E3, S1).

    uvicorn arms no timer while a request head is incomplete (its keep-alive timer runs
    only between requests and stops at the first byte), so a client that sends half a
    head would hold the socket forever, before any credential is checked. Once bytes of
    a head wait (h11's ``their_state`` is ``IDLE`` with data buffered), the connection
    gets ``head_timeout`` seconds in all to complete it (a slow trickle does not move
    the deadline), else it is closed, as websockets closes a WebSocket's half-sent
    upgrade after its ``open_timeout`` (10 s by default, which toolbus keeps).
    """

    head_timeout = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        waiting = self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])
        if waiting and self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_late)
        elif not waiting and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)


class McpHttp:
    """uvicorn's h11 protocol, configured once, for connections that asked for ``/mcp``.

    Args:
        app: the ASGI app (:class:`gateway.mcp.serve.McpEndpoint`).
        head_timeout: seconds a request head may take to arrive whole (:class:`HeadTimed`);
            websockets' default ``open_timeout``.
    """

    def __init__(self, app: Any, head_timeout: float = 10.0) -> None:
        self.config = Config(
            app, http="h11", lifespan="off", log_config=None, access_log=False, ws="none"
        )
        self.config.load()
        self.state = ServerState()
        self.head_timeout = head_timeout

    def protocol(self) -> H11Protocol:
        protocol = HeadTimed(self.config, self.state, {})
        protocol.head_timeout = self.head_timeout
        return protocol

    def shutdown(self) -> None:
        """Close idle keep-alive connections and end open responses (SPEC S4)."""
        for connection in list(self.state.connections):
            connection.shutdown()


class Sniffer(asyncio.Protocol):
    """The first protocol of an accepted connection; replaced after the first bytes.

    Args:
        websocket: makes websockets' connection for this socket (not yet told of it).
        mcp: makes the HTTP protocol for ``/mcp``; ``None`` while MCP is not served.
        timeout: seconds a silent connection is kept before it is dropped.
    """

    def __init__(
        self,
        websocket: Callable[[], asyncio.Protocol],
        mcp: Callable[[], asyncio.Protocol] | None,
        timeout: float,
    ) -> None:
        self._websocket = websocket
        self._mcp = mcp
        self._timeout = timeout
        self._head = b""
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's TCP transport has the methods without subclassing.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        if self._mcp is None:
            self._hand_over(self._websocket())
            return
        self._timer = asyncio.get_running_loop().call_later(self._timeout, transport.abort)

    def data_received(self, data: bytes) -> None:
        self._head += data
        verdict = is_mcp(self._head[:_LONGEST])
        if verdict is None:
            return
        assert self._mcp is not None
        self._hand_over(self._mcp() if verdict else self._websocket())

    def _hand_over(self, protocol: asyncio.Protocol) -> None:
        if self._timer is not None:
            self._timer.cancel()
        transport = self._transport
        assert transport is not None
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._head:
            protocol.data_received(self._head)
            self._head = b""

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
