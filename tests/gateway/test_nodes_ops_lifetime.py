"""A socket's bounded lifetime (SPEC N6): it ends like a drain ends every socket (S4),
the ``reconnect`` hint then 1012, so its client resumes with no visible failure, and the
jitter spreads the ends of sockets opened together."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from websockets.asyncio.client import connect

import toolbus
from gateway.sockets import LIFETIME_REASON, SocketLifetime
from protocol import messages as m
from tests.support import CONVERT, WAIT, Peer, closed, running, settings_for

SUB: Any = ["toolbus.v1"]


def test_n6_lifetime_draws_stay_in_bounds_and_spread() -> None:
    """SPEC N6: each draw is in ``[(1 - jitter) * L, L]``; the same seed draws the same
    lifetimes; the draws cover the jitter band; 0 turns lifetimes off."""
    first = SocketLifetime(60.0, 0.2, random.Random(7))
    draws = [first.draw() for _ in range(500)]
    assert all(d is not None and 48.0 <= d <= 60.0 for d in draws)
    again = SocketLifetime(60.0, 0.2, random.Random(7))
    assert [again.draw() for _ in range(500)] == draws
    values = [d for d in draws if d is not None]
    assert min(values) < 49.0
    assert max(values) > 59.0
    assert SocketLifetime(60.0, 0.0).draw() == 60.0
    assert SocketLifetime(0.0, 0.5).draw() is None


async def test_n6_socket_lifetime_ends_with_the_drain_hint_and_1012(tmp_path: Path) -> None:
    """SPEC N6, S4: at its lifetime a socket gets exactly the ``reconnect`` hint (retry at
    once) then a 1012 close, and its session resumes on the next socket."""
    settings = settings_for(tmp_path, server={"max_socket_lifetime": 0.3})
    async with running(settings) as gw:
        async with connect(gw.url, subprotocols=SUB) as ws:
            p = Peer(ws)
            await p.hello()
            hint = await p.expect("reconnect")
            assert hint == {"type": "reconnect", "reason": "socket lifetime", "retry_after": 0.0}
            gone = await closed(p)
            assert gone.rcvd is not None
            assert (gone.rcvd.code, gone.rcvd.reason) == (1012, LIFETIME_REASON)
        async with connect(gw.url, subprotocols=SUB) as ws:
            again = Peer(ws)
            welcome = await again.hello(
                session_id=p.welcome["session_id"],
                resume_token=p.welcome["resume_token"],
                last_seq=max(msg["seq"] for msg in p.seen if "seq" in msg),
            )
            assert welcome["resumed"] is True
        assert gw.metrics.closes.labels("1012")._value.get() >= 1


async def test_n6_client_keeps_calling_across_several_lifetimes(tmp_path: Path) -> None:
    """SPEC N6, K1: with a 0.2 s socket lifetime a client calling without pause goes
    through at least 4 lifetimes, every call returns its result, no error reaches the
    caller, and the session is the same throughout (each reconnect resumed it)."""
    settings = settings_for(
        tmp_path,
        server={"max_socket_lifetime": 0.2, "max_socket_lifetime_jitter": 0.5},
        # Calls without pause: the invoke rate limit (SPEC E2) is not under test here.
        limits={"invoke_rate": 1e6, "invoke_burst": 1_000_000},
    )
    hints: list[m.Reconnect] = []

    def seen(message: BaseModel) -> None:
        if isinstance(message, m.Reconnect):
            hints.append(message)

    async with running(settings) as gw:
        # ack_every=1: an ack follows every event, so one is often sent while the server
        # is closing; the frames read before the close (the hint) must still be handled.
        bus = toolbus.connect(
            gw.url,
            token="alice-token",
            profile="demo",
            request_timeout=WAIT,
            on_message=seen,
            ack_every=1,
        )
        async with bus:
            session = bus.session_id
            calls = 0
            async with asyncio.timeout(6 * WAIT):
                while bus.reconnects < 4:
                    out = await bus.invoke("convert_units", CONVERT, timeout=WAIT)
                    assert isinstance(out, m.Result)
                    assert out.result["result"] == 100.0
                    calls += 1
            assert bus.session_id == session
            assert bus.welcome is not None
            assert bus.welcome.resumed is True
    assert calls > bus.reconnects
    # Every reconnect followed a hint the client read (none waited out a backoff).
    assert len(hints) >= bus.reconnects >= 4
    assert {(h.reason, h.retry_after) for h in hints} == {(LIFETIME_REASON, 0.0)}


async def test_n6_jitter_spreads_the_ends_of_sockets_opened_together(tmp_path: Path) -> None:
    """SPEC N6: 8 sockets opened together with a 1 s lifetime and jitter 0.5 (seeded
    draws) each live between 0.5 s and 1 s (plus a generous margin for a loaded machine),
    and their ends spread over at least half the span of the drawn lifetimes."""
    settings = settings_for(
        tmp_path, server={"max_socket_lifetime": 1.0, "max_socket_lifetime_jitter": 0.5}
    )
    async with running(settings) as gw:
        gw.parts.sockets.lifetime = SocketLifetime(1.0, 0.5, random.Random(11))
        expected = SocketLifetime(1.0, 0.5, random.Random(11))
        drawn = [expected.draw() or 0.0 for _ in range(8)]
        loop = asyncio.get_running_loop()

        async def one() -> tuple[float, float]:
            async with connect(gw.url, subprotocols=SUB) as ws:
                p = Peer(ws)
                opened = loop.time()
                await p.hello()
                await p.expect("reconnect")
                await closed(p)
                return opened, loop.time()

        spans = await asyncio.gather(*(one() for _ in range(8)))
    lived = [end - start for start, end in spans]
    assert all(0.5 - 0.05 <= life <= 1.0 + WAIT for life in lived), lived
    ends = [end for _, end in spans]
    assert max(ends) - min(ends) >= 0.5 * (max(drawn) - min(drawn)), (ends, drawn)
