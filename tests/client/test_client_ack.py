"""When the Python client acknowledges (SPEC D2, K1): every ``ack_every`` durable events,
and once the socket has been quiet for ``ack_idle`` seconds with an ack pending.

The quiet-socket ack is one timer per quiet period (issue 13); these tests pin that it
still fires, not before the socket was quiet that long, and that the count rule is
unchanged. The server's own ``acked_seq`` is the witness; a ``grants.list`` request sent
afterwards is the barrier (the server handles one socket's frames in order).
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
from tests.support import MS, WAIT
from toolbus.client_link import SUBPROTOCOL, Connection

KM = {"value": 1, "from_unit": "km", "to_unit": "m"}


def connect(gateway: Gateway, **options: Any) -> toolbus.Client:
    """A client that receives every `tool_start` (SPEC A6), so each call is two events."""
    options.setdefault("tool_start", m.ToolStarts.ALL)
    return toolbus.connect(
        gateway.url, token="alice-token", profile="demo", request_timeout=WAIT, **options
    )


def acked_on_server(gateway: Gateway, bus: toolbus.Client) -> int:
    session = gateway.sessions.get(bus.session_id)
    assert session is not None
    return session.acked_seq


async def test_acks_every_ack_every_events(gateway: Gateway) -> None:
    """SPEC D2: with ack_every=4 the client acks seq 4 (catalog 1, then two calls of
    tool_start + result) before it processes seq 5, and nothing else while busy."""
    async with connect(gateway, ack_every=4, ack_idle=WAIT) as bus:
        for call_id in ("c1", "c2"):
            assert isinstance(await bus.invoke("convert_units", KM, call_id=call_id), m.Result)
        assert bus.last_seq == 5
        await bus.grants()
        assert acked_on_server(gateway, bus) == 4


async def test_quiet_socket_gets_its_ack(gateway: Gateway) -> None:
    """SPEC D2: with a pending ack and no frame for ack_idle seconds, the client acks
    everything processed, and not before the socket was quiet that long."""
    idle = 30 * MS
    async with connect(gateway, ack_every=1000, ack_idle=idle) as bus:
        sent = asyncio.Event()
        fired_after: list[float] = []
        ack = bus._ack

        async def spy(ws: Any) -> None:
            # The catalog's own idle ack (seq 1) may land here too; wait for seq 3's.
            fired_after.append(asyncio.get_running_loop().time() - bus._last_frame)
            await ack(ws)
            if bus._acked == 3:
                sent.set()

        bus._ack = spy  # type: ignore[method-assign]
        assert isinstance(await bus.invoke("convert_units", KM, call_id="c1"), m.Result)
        async with asyncio.timeout(WAIT):
            await sent.wait()
        await bus.grants()
        assert acked_on_server(gateway, bus) == bus.last_seq == 3
        assert fired_after
        assert min(fired_after) >= idle


class Valve:
    """A WebSocket proxy to ``upstream`` that can hold the server's messages
    (:attr:`holding`, :meth:`release`) and stop reading the client's (:attr:`reading`);
    a client message over 100 kB (filler that fills the client's send buffer) is read
    and dropped."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.reading = asyncio.Event()
        self.reading.set()
        self.holding = False
        self.held: list[str | bytes] = []
        self.client: ServerConnection | None = None

    async def handle(self, client: ServerConnection) -> None:
        self.client = client
        async with ws_connect(self.upstream, subprotocols=[SUBPROTOCOL], max_size=None) as server:

            async def up() -> None:
                while True:
                    await self.reading.wait()
                    message = await client.recv()
                    if len(message) <= 100_000:
                        await server.send(message)

            async def down() -> None:
                async for message in server:
                    if self.holding:
                        self.held.append(message)
                    else:
                        await client.send(message)

            with contextlib.suppress(ConnectionClosed):
                await asyncio.gather(up(), down())

    async def release(self) -> None:
        """Send the first held message to the client."""
        assert self.client is not None
        await self.client.send(self.held.pop(0))


@contextlib.asynccontextmanager
async def valved(gateway: Gateway) -> AsyncIterator[tuple[str, Valve]]:
    valve = Valve(gateway.url)
    async with serve(
        valve.handle, "127.0.0.1", 0, subprotocols=[SUBPROTOCOL], max_size=None, max_queue=1
    ) as proxy:
        port = next(iter(proxy.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/", valve


async def _until(condition: Any, what: str) -> None:
    try:
        async with asyncio.timeout(WAIT):
            while not condition():  # noqa: ASYNC110 - client and proxy state, polled
                await asyncio.sleep(MS)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_d2_an_event_read_while_an_ack_waits_for_the_socket_is_acked(
    gateway: Gateway,
) -> None:
    """SPEC D2, K1: with ack_every=1, the ack of seq 2 is sent from the read callback's
    ack task while the client's send buffer is full (a proxy stops reading it), so it
    waits; seq 3 is read meanwhile. Once the socket drains, seq 3 is acked too (within
    ack_idle): no event the client processed stays unacknowledged on a quiet socket."""
    async with (
        valved(gateway) as (url, valve),
        toolbus.connect(
            url,
            token="alice-token",
            profile="demo",
            request_timeout=None,
            ack_every=1,
            ack_idle=20 * MS,
        ) as bus,
    ):
        await bus.grants()
        await _until(lambda: acked_on_server(gateway, bus) == bus.last_seq == 1, "seq 1 acked")
        valve.holding = True
        calls = [
            asyncio.create_task(bus.invoke("convert_units", KM, call_id=c)) for c in ("c1", "c2")
        ]
        await _until(lambda: len(valve.held) == 2, "both results held by the proxy")
        valve.reading.clear()
        ws = bus._link.ws
        assert isinstance(ws, Connection)
        fillers: list[asyncio.Task[Any]] = []
        pad = {**KM, "pad": "x" * 900_000}
        try:
            while not ws.paused:
                assert len(fillers) < 200, "the client's send buffer never filled"
                fillers.append(asyncio.create_task(bus.invoke("convert_units", pad)))
                for _ in range(20):
                    await asyncio.sleep(MS)
                    if ws.paused:
                        break
            waiting = len(ws.drain_waiters)
            await valve.release()  # seq 2: its ack waits for the full socket
            await _until(lambda: len(ws.drain_waiters) == waiting + 1, "seq 2's ack to wait")
            assert bus.last_seq == 2
            await valve.release()  # seq 3, read while that ack waits
            await _until(lambda: bus.last_seq == 3, "seq 3 read")
            valve.reading.set()
            ends = await asyncio.gather(*calls)
            assert all(isinstance(e, m.Result) for e in ends), ends
            await _until(lambda: acked_on_server(gateway, bus) == 3, "seq 3 acked on the server")
        finally:
            for task in [*fillers, *calls]:
                task.cancel()
            await asyncio.gather(*fillers, *calls, return_exceptions=True)
