"""When the Python client acknowledges (SPEC D2, K1): every ``ack_every`` durable events,
and once the socket has been quiet for ``ack_idle`` seconds with an ack pending.

The quiet-socket ack is one timer per quiet period (issue 13); these tests pin that it
still fires, not before the socket was quiet that long, and that the count rule is
unchanged. The server's own ``acked_seq`` is the witness; a ``grants.list`` request sent
afterwards is the barrier (the server handles one socket's frames in order).
"""

from __future__ import annotations

import asyncio
from typing import Any

import toolbus
from gateway.server import Gateway
from protocol import messages as m
from tests.support import MS, WAIT

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
