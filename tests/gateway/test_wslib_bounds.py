"""What one peer can make the server do per read and owe per socket (``gateway.wslib``
``WsConnection`` and ``ReadGate``; SPEC D5, E2, E3).

A read holding more frames than one turn's budget is handled over several turns, whole
and in order; a peer that sends pings and never reads is not read while the server's write
buffer is above its high-water mark, and is read again once it reads.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway import wslib
from gateway.server import Gateway
from tests.gateway.test_wslib_fast_read import invoke, write_at_once
from tests.support import WAIT, peer, resume_fields, signal

TURN = 4
"""The turn budget these tests run with, so that a few frames take several turns."""


def grants_list(n: int) -> bytes:
    return orjson.dumps({"type": "grants.list", "id": f"g{n}"})


async def test_e3_a_read_past_its_budget_is_handled_over_turns_whole_and_in_order(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC E3, E1, I12: the frames of one read past :data:`wslib.MESSAGES_PER_TURN` wait
    for later turns (reading held meanwhile); none is lost and none overtakes another,
    including a binary frame among them (read through ``recv``)."""
    monkeypatch.setattr(wslib, "MESSAGES_PER_TURN", TURN)
    holds = _spy_holds(monkeypatch)
    async with peer(gateway, options={"tool_start": "gated"}) as p:
        await p.expect("catalog")
        frames: list[tuple[str, bytes, bool]] = [("text", grants_list(n), True) for n in range(9)]
        frames.insert(5, ("binary", b"\x00", True))
        frames.append(("text", invoke("c1"), True))
        write_at_once(p.ws, *frames)
        await p.terminal("c1")
        got = [(m["type"], m.get("id") or m.get("code") or m.get("call_id")) for m in p.seen]
        after = got[got.index(("catalog", None)) + 1 :]
        assert after == [
            *[("grants", f"g{n}") for n in range(5)],
            ("error", "binary_frame"),
            *[("grants", f"g{n}") for n in range(5, 9)],
            ("result", "c1"),
        ]
    assert wslib.ReadGate.TURN in holds


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


async def test_e3_frames_read_before_a_drop_are_handled_in_their_turns(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC E3, D3: a read past the turn budget whose socket is then dropped (a reset)
    still has every frame handled, in order, before the session is parked: a resume
    replays a result for each call."""
    monkeypatch.setattr(wslib, "MESSAGES_PER_TURN", TURN)
    parked = signal(gateway, "park")
    async with peer(gateway, options={"tool_start": "gated"}) as p:
        await p.expect("catalog")
        # The replies to the first requests meet the reset while the rest still wait.
        asks = [("text", grants_list(n), True) for n in range(10 * TURN)]
        calls = [("text", invoke(f"c{n}"), True) for n in range(3 * TURN + 1)]
        write_at_once(p.ws, *asks, *calls)
        p.ws.transport.abort()
        async with asyncio.timeout(WAIT):
            await parked.wait()
    async with peer(gateway, hello=False) as again:
        await again.hello(**resume_fields(p, 0))
        assert again.welcome["resumed"] is True
        results = [(await again.terminal(f"c{n}"))["type"] for n in range(3 * TURN + 1)]
    assert results == ["result"] * (3 * TURN + 1)
