"""Every close the server sends is counted, and a slow reader is closed before the log
drops what it has not read (SPEC O2, D2, D5)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gateway.server import Gateway
from protocol import messages as m
from tests.gateway.store_faults import until
from tests.support import (
    closed,
    park_signal,
    peer,
    resume_fields,
    running,
    sequenced,
    settings_for,
)


def _closes(gw: Gateway, code: int) -> float | None:
    return gw.metrics.registry.get_sample_value("toolbus_closes_total", {"code": str(code)})


async def test_closes_websockets_sends_itself_are_counted(tmp_path: Path) -> None:
    """SPEC O2: 1002 (a frame with a reserved bit), 1007 (a text frame that is not
    UTF-8) and 1009 (a frame over ``max_message_bytes``) are closed by websockets
    itself, and each is counted once under its code, as are our own closes."""
    settings = settings_for(tmp_path, server={"max_message_bytes": 8192})
    async with running(settings) as gw:
        parked = park_signal(gw)
        async with peer(gw) as p:
            mask = os.urandom(4)
            p.ws.transport.write(b"\xc1\x80" + mask)  # FIN + RSV1 + text, masked, empty
            assert (await closed(p)).rcvd.code == 1002  # type: ignore[union-attr]
        async with peer(gw) as p:
            await p.ws.send(b'{"type":"ack","seq":\xff}', text=True)
            assert (await closed(p)).rcvd.code == 1007  # type: ignore[union-attr]
        async with peer(gw) as p:
            await p.send({"type": "grants.list", "id": "x" * 9000})
            assert (await closed(p)).rcvd.code == 1009  # type: ignore[union-attr]
        async with peer(gw) as p:
            await p.send({"type": "bye"})
            assert (await closed(p)).rcvd.code == 4001  # type: ignore[union-attr]
        await until(lambda: not gw.handlers, "every handler ended (each counts its close)")
        assert parked.is_set()
        counted = {code: _closes(gw, code) for code in (1002, 1007, 1009, 4001, 1012)}
        assert counted == {1002: 1.0, 1007: 1.0, 1009: 1.0, 4001: 1.0, 1012: None}
        async with peer(gw) as a, peer(gw, token="bob-token") as b:
            await a.expect("catalog")
            await b.expect("catalog")
            await gw.drain()
    assert _closes(gw, 1012) == 2.0  # drain: once per socket, not twice


async def test_slow_reader_closed_before_the_cap_drops_unread_events(tmp_path: Path) -> None:
    """SPEC D5, D2: a reader that stops reading, with a byte bound too large to trip,
    is closed 1013 once its unacknowledged events pass 90% of
    ``sessions.max_unacked_events`` while frames still wait for it. Its resume from
    ``last_seq`` 0 then replays every event: nothing was dropped unread."""
    cap = 2000
    settings = settings_for(
        tmp_path,
        server={"max_outbound_bytes": 1 << 30},
        sessions={"max_unacked_events": cap},
    )
    async with running(settings) as gw:
        async with peer(gw) as p:
            await p.expect("catalog")
            p.ws.transport.pause_reading()  # the reader stops; TCP buffers fill up
            session = gw.sessions.get(p.welcome["session_id"])
            assert session is not None
            for i in range(cap + 500):  # past the cap unless the socket is closed first
                link = session.link
                if link is None or link.closed:
                    break
                gw.catalog.push(session, m.CatalogReason.REQUESTED, force=True)
                if i % 20 == 0:
                    await asyncio.sleep(0)  # let the outbox commit and the writer write
            last = session.last_seq
            assert cap * 9 // 10 < last <= cap
            assert session.floor_seq == 0  # nothing dropped
        async with peer(gw, **resume_fields(p, 0)) as again:
            assert again.welcome["resumed"] is True
            await again.send({"type": "grants.list", "id": "b"})
            await again.expect("grants", id="b")
            assert sequenced(again.seen) == list(range(1, last + 1))
    assert _closes(gw, 1013) == 1.0
