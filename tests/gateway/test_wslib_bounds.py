"""What one peer can make the server do per read and owe per socket (``gateway.wslib``
``WsConnection`` and ``ReadGate``; SPEC D5, E2, E3).

A peer that sends pings and never reads is not read while the server's write
buffer is above its high-water mark, and is read again once it reads.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway import wslib
from gateway.server import Gateway
from tests.support import WAIT, peer


async def test_d5_e2_a_peer_that_never_reads_is_not_read_until_it_reads(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC D5, E2: a peer that floods pings before ``hello`` and reads nothing owes the
    server no more than its write limit and one read of pongs: past the limit the server
    stops reading it; once it reads, the server reads it again and answers its ``hello``."""
    holds = _spy_holds(monkeypatch)
    async with peer(gateway, hello=False) as p:
        client = p.ws.transport
        client.pause_reading()  # this client reads nothing from now on
        server: Any = next(iter(gateway.server.connections))
        peak, bound = 0, server.write_limit_high + (512 << 10)
        async with asyncio.timeout(WAIT):
            while wslib.ReadGate.WRITE not in holds and peak < bound:
                if client.get_write_buffer_size() < 256 << 10:
                    for _ in range(512):
                        p.ws.protocol.send_ping(b"x" * 125)
                    client.write(b"".join(p.ws.protocol.data_to_send()))
                await asyncio.sleep(0)
                peak = max(peak, server.transport.get_write_buffer_size())
            for _ in range(50):  # more pings: none of them is read
                for _ in range(512):
                    p.ws.protocol.send_ping(b"x" * 125)
                client.write(b"".join(p.ws.protocol.data_to_send()))
                await asyncio.sleep(0)
                peak = max(peak, server.transport.get_write_buffer_size())
        assert not server.transport.is_reading()
        assert peak < bound, f"{peak} bytes of pongs held"
        client.resume_reading()
        await p.hello()
    assert p.welcome["type"] == "welcome"


def _spy_holds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every reason any connection's reading is held for, in order, from now on."""
    holds: list[int] = []
    hold = wslib.ReadGate.hold

    def spy(gate: wslib.ReadGate, why: int) -> None:
        holds.append(why)
        hold(gate, why)

    monkeypatch.setattr(wslib.ReadGate, "hold", spy)
    return holds
