"""Messages read in the socket's read callback keep their order with those read through
``recv`` (``gateway.wslib.WsConnection.process_event``; SPEC E1, I12; issue 13).

Each test writes several frames in one ``transport.write``, so the server reads them in
one ``data_received``: a whole text message there must never overtake a binary frame, a
fragmented message or a message sent before ``hello`` was answered.
"""

from __future__ import annotations

import logging

import orjson
import pytest
from websockets.asyncio.client import ClientConnection

from gateway.server import Gateway
from tests.support import CONVERT, Peer, closed, peer


def write_at_once(ws: ClientConnection, *frames: tuple[str, bytes, bool]) -> None:
    """Frames ``(kind, payload, fin)`` (kind ``text``, ``cont`` or ``binary``), masked by
    the client's own protocol, in one write to the socket."""
    protocol = ws.protocol
    for kind, data, fin in frames:
        if kind == "text":
            protocol.send_text(data, fin=fin)
        elif kind == "cont":
            protocol.send_continuation(data, fin=fin)
        else:
            protocol.send_binary(data, fin=fin)
    ws.transport.write(b"".join(protocol.data_to_send()))


def invoke(call_id: str) -> bytes:
    return orjson.dumps(
        {"type": "invoke", "call_id": call_id, "tool": "convert_units", "params": CONVERT}
    )


def replies(p: Peer) -> list[tuple[str, str | None]]:
    """``(type, call_id or error code)`` of each message seen after the catalog."""
    return [
        (m["type"], m.get("call_id") or m.get("code"))
        for m in p.seen
        if m["type"] not in ("welcome", "catalog")
    ]


async def test_e1_binary_frame_then_text_in_one_read_answer_in_order(gateway: Gateway) -> None:
    """SPEC E1: a binary frame's error comes before the answers to the text frames behind
    it (one answered at once, malformed JSON, and an invoke)."""
    async with peer(gateway, options={"tool_start": "gated"}) as p:
        await p.expect("catalog")
        write_at_once(
            p.ws,
            ("binary", b"\x00\x01", True),
            ("text", b'{"type": "ack", "seq": ', True),
            ("text", invoke("c1"), True),
        )
        await p.terminal("c1")
        assert replies(p) == [
            ("error", "binary_frame"),
            ("error", "malformed_json"),
            ("result", "c1"),
        ]


async def test_i12_fragmented_invoke_then_whole_one_run_in_order(gateway: Gateway) -> None:
    """SPEC I12: a fragmented invoke is admitted before the whole one sent after it."""
    async with peer(gateway, options={"tool_start": "gated"}) as p:
        await p.expect("catalog")
        first = invoke("c1")
        write_at_once(
            p.ws,
            ("text", first[:20], False),
            ("cont", first[20:], True),
            ("text", invoke("c2"), True),
        )
        await p.terminal("c2")
        assert replies(p) == [("result", "c1"), ("result", "c2")]
        seqs = [m["seq"] for m in p.seen if m["type"] == "result"]
        assert seqs == sorted(seqs)


async def test_s1_invoke_pipelined_behind_hello_is_answered(gateway: Gateway) -> None:
    """SPEC S1: an invoke in the same read as its hello waits for the session, then runs;
    the ones after it, read in the callback, follow in order."""
    async with peer(gateway, hello=False) as p:
        hello = orjson.dumps(
            {
                "type": "hello",
                "token": "alice-token",
                "profile": "demo",
                "options": {"tool_start": "gated"},
            }
        )
        write_at_once(p.ws, ("text", hello, True), ("text", invoke("c1"), True))
        await p.terminal("c1")
        await p.send(invoke("c2").decode())
        await p.terminal("c2")
        assert [m["type"] for m in p.seen[:2]] == ["welcome", "catalog"]
        assert replies(p) == [("result", "c1"), ("result", "c2")]


@pytest.mark.parametrize("one_read", [True, False])
async def test_e1_nothing_after_bye_is_handled(
    gateway: Gateway, caplog: pytest.LogCaptureFixture, one_read: bool
) -> None:
    """SPEC E1, S1 (found in review): once a message stops the connection taking requests
    (``bye``), nothing read after it is handled, through either read path: an ``ack`` and
    an ``invoke`` behind it neither run nor log an internal error; the close is 4001."""
    caplog.set_level(logging.INFO, logger="gateway.connection")
    async with peer(gateway) as p:
        await p.expect("catalog")
        after = (b'{"type": "ack", "seq": 1}', invoke("late"))
        if one_read:
            write_at_once(
                p.ws, ("text", b'{"type": "bye"}', True), *(("text", f, True) for f in after)
            )
        else:
            await p.send({"type": "bye"})
            for frame in after:
                await p.send(frame.decode())
        error = await closed(p)
    assert error.rcvd is not None
    assert error.rcvd.code == 4001
    assert [m["type"] for m in p.seen] == ["welcome", "catalog"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert gateway.metrics.invocations.labels("ok")._value.get() == 0
