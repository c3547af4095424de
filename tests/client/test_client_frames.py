"""The Python client handles server messages in arrival order, whole or fragmented
(SPEC K1, D1; RFC 6455 section 5.4).

The client hands a whole text frame to its inbound part from websockets' read callback
(:class:`toolbus.client_link.Connection`, issue 13) and leaves a fragmented message to
websockets' assembler and ``recv``. The real server never fragments; a proxy in front of
it does here, splitting every other server message in two fragments (as an
intermediary may, RFC 6455 section 5.4), so that both paths carry one session's events,
often within one read. The client's ``on_message`` callback sees the events in the
order it handled them: their ``seq`` must run 1, 2, 3, ... with no gap and none twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

import toolbus
from gateway.server import Gateway
from protocol import messages as m
from tests.support import WAIT
from toolbus.client_link import SUBPROTOCOL, Connection

KM = {"value": 1, "from_unit": "km", "to_unit": "m"}


class Splitter:
    """A WebSocket proxy to ``upstream`` that sends every other server message to the
    client as two fragments (RFC 6455 section 5.4) and the others whole."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.fragmented = 0
        self.whole = 0

    async def handle(self, client: ServerConnection) -> None:
        async with ws_connect(self.upstream, subprotocols=[SUBPROTOCOL]) as server:

            async def up() -> None:
                async for message in client:
                    await server.send(message)

            async def down() -> None:
                async for message in server:
                    assert isinstance(message, str)
                    if (self.fragmented + self.whole) % 2:
                        cut = len(message) // 2
                        await client.send([message[:cut], message[cut:]])
                        self.fragmented += 1
                    else:
                        await client.send(message)
                        self.whole += 1

            with contextlib.suppress(ConnectionClosed):
                await asyncio.gather(up(), down())


@contextlib.asynccontextmanager
async def splitting(gateway: Gateway) -> AsyncIterator[tuple[str, Splitter]]:
    splitter = Splitter(gateway.url)
    async with serve(splitter.handle, "127.0.0.1", 0, subprotocols=[SUBPROTOCOL]) as proxy:
        port = next(iter(proxy.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/", splitter


async def test_k1_whole_and_fragmented_messages_are_handled_in_arrival_order(
    gateway: Gateway,
) -> None:
    """SPEC K1, D1: through a proxy that fragments every other server message, 8 rounds
    of 6 concurrent calls (each `tool_start`, then `result`) all end with their own
    result, and the client handled every event once, in `seq` order: a whole message
    never overtook a fragmented one before it."""
    seen: list[Any] = []
    async with (
        splitting(gateway) as (url, splitter),
        toolbus.connect(
            url,
            token="alice-token",
            profile="demo",
            request_timeout=WAIT,
            tool_start=m.ToolStarts.ALL,
            on_message=seen.append,
        ) as bus,
    ):
        assert isinstance(bus._ws, Connection)
        for round_ in range(8):
            ids = [f"r{round_}-{i}" for i in range(6)]
            ends = await asyncio.gather(
                *(bus.invoke("convert_units", KM, call_id=call_id) for call_id in ids)
            )
            assert all(isinstance(e, m.Result) for e in ends), ends
            assert [(e.type, e.call_id, e.result) for e in ends if isinstance(e, m.Result)] == [
                ("result", call_id, ends[0].result) for call_id in ids
            ]
        await bus.grants()
        session = gateway.sessions.get(bus.session_id)
        assert session is not None
        last = session.last_seq
    seqs = [msg.seq for msg in seen if getattr(msg, "seq", None) is not None]
    assert seqs == list(range(1, last + 1))
    assert last == 1 + 8 * 6 * 2  # the catalog, then tool_start and result per call
    assert splitter.fragmented >= last // 2
    assert splitter.whole >= last // 2
