"""Bad input and limits over real sockets (SPEC E1, E2, cases F13, F14)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from gateway.server import Gateway
from tests.gateway import edge_tools as et
from tests.support import CONVERT, WAIT, Peer, closed, peer, running, settings_for


async def still_serves(p: Peer, call_id: str) -> None:
    """The connection (and the server) still answer a real call."""
    await p.invoke(call_id, "convert_units", CONVERT)
    result = await p.terminal(call_id)
    assert result["type"] == "result"
    assert result["result"]["result"] == 100.0


# -- E1: each bad input gets its typed error, and the connection goes on --------------------

BAD_INPUTS: list[tuple[str, str | bytes, str, str | None]] = [
    ("malformed", '{"type": "ack", "seq": ', "malformed_json", None),
    ("bom", '\ufeff{"type":"ack","seq":1}', "malformed_json", None),
    (
        "nan",
        '{"type":"invoke","id":"r1","call_id":"c","tool":"t","params":{"x":NaN}}',
        "nan_not_allowed",
        None,
    ),
    ("infinity", '{"type":"ack","seq":-Infinity}', "nan_not_allowed", None),
    ("duplicate", '{"type":"grants.list","id":"r2","id":"r2"}', "duplicate_key", "r2"),
    (
        "nested_duplicate",
        '{"type":"invoke","id":"r3","call_id":"c","tool":"t","params":{"a":1,"a":2}}',
        "duplicate_key",
        "r3",
    ),
    (
        "too_deep",
        '{"type":"invoke","id":"r4","call_id":"c","tool":"t","params":'
        + '{"a":' * 40
        + "1"
        + "}" * 40
        + "}",
        "too_deep",
        "r4",
    ),
    ("array", "[1,2,3]", "not_an_object", None),
    ("string", '"hello"', "not_an_object", None),
    ("no_type", '{"id":"r5"}', "missing_type", "r5"),
    ("unknown_type", '{"type":"launch","id":"r6"}', "unknown_type", "r6"),
    ("missing_field", '{"type":"invoke","id":"r7","tool":"convert_units"}', "missing_field", "r7"),
    ("extra_field", '{"type":"grants.list","id":"r8","x":1}', "extra_field", "r8"),
    ("wrong_type", '{"type":"ack","seq":"1"}', "wrong_type", None),
    ("bool_for_int", '{"type":"ack","seq":true}', "wrong_type", None),
    ("invalid_value", '{"type":"job.list","id":"r9","limit":0}', "invalid_value", "r9"),
    (
        "bad_decision",
        '{"type":"tool.confirm","id":"r10","approval_id":"a","decision":"maybe"}',
        "invalid_value",
        "r10",
    ),
    ("binary", b'{"type":"grants.list"}', "binary_frame", None),
]


@pytest.mark.parametrize(
    ("raw", "code", "request_id"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
async def test_bad_input_typed_error_and_connection_usable(
    gateway: Gateway, raw: str | bytes, code: str, request_id: str | None
) -> None:
    """SPEC E1: a bad frame gets an error with its code (and the id when readable); the
    connection and its session go on."""
    async with peer(gateway) as p:
        await p.expect("catalog")
        await p.ws.send(raw)
        error = await p.expect("error")
        assert error["code"] == code, error
        assert error.get("id") == request_id
        assert "seq" not in error
        await still_serves(p, "after")


async def test_bad_input_never_disturbs_another_session(gateway: Gateway) -> None:
    """SPEC E1: a stream of bad frames on one socket; a second session never sees a thing."""
    async with peer(gateway) as bad, peer(gateway, token="bob-token") as good:
        await good.expect("catalog")
        await good.invoke("g1", "convert_units", CONVERT)
        for _, raw, _, _ in BAD_INPUTS:
            await bad.ws.send(raw)
        for _, _, code, _ in BAD_INPUTS:
            assert (await bad.expect("error"))["code"] == code
        await good.terminal("g1")
        await still_serves(good, "g2")
        assert [m["type"] for m in good.seen] == [
            "welcome",
            "catalog",
            "tool_start",
            "result",
            "tool_start",
            "result",
        ]


async def test_case_f13_invalid_utf8_text_frame_closes_1007(gateway: Gateway) -> None:
    """F13 / SPEC E1: a text frame of bytes 7B FF FE 7D closes 1007; others unaffected."""
    async with peer(gateway) as p, peer(gateway, token="bob-token") as other:
        await p.expect("catalog")
        await p.ws.send(b"\x7b\xff\xfe\x7d", text=True)  # sent as TEXT, bytes unchecked
        error = await closed(p)
        assert error.rcvd is not None
        assert error.rcvd.code == 1007
        assert [m["type"] for m in p.seen] == ["welcome", "catalog"]  # nothing ran
        await still_serves(other, "o1")
    assert gateway.metrics.invocations.labels("ok")._value.get() == 1


async def test_case_f13_invalid_utf8_in_hello_position(gateway: Gateway) -> None:
    """F13 / SPEC E1: invalid UTF-8 as the very first frame also closes 1007, no session."""
    async with peer(gateway, hello=False) as p:
        await p.ws.send(b"\x7b\xff\xfe\x7d", text=True)
        error = await closed(p)
        assert error.rcvd is not None
        assert error.rcvd.code == 1007
    assert not gateway.sessions.sessions


async def test_case_f14_oversized_frame_closes_1009(tmp_path: Path) -> None:
    """F14 / SPEC E1, E2, scaled: one frame over max_message_bytes (64 KB here; F14 sends
    50 MB against the 1 MB default) closes 1009; other sessions unaffected."""
    limit = 64 * 1024
    settings = settings_for(tmp_path, server={"max_message_bytes": limit})
    async with running(settings) as gw, peer(gw) as p, peer(gw, token="bob-token") as other:
        assert p.welcome["limits"]["max_message_bytes"] == limit
        await p.expect("catalog")
        body = "x" * limit
        await p.send(
            {
                "type": "invoke",
                "call_id": "big",
                "tool": "notes_create",
                "params": {"title": "t", "body": body},
            }
        )
        error = await closed(p)
        assert error.rcvd is not None
        assert error.rcvd.code == 1009
        await still_serves(other, "o1")
        assert not any(m.get("call_id") == "big" for m in p.seen)


async def test_case_f14_fragments_over_limit_close_1009(tmp_path: Path) -> None:
    """F14 / SPEC E1, E2, scaled: fragments each under the limit but adding up over it
    (5 x 16 KB against 64 KB) close 1009 once the sum crosses it."""
    limit = 64 * 1024
    settings = settings_for(tmp_path, server={"max_message_bytes": limit})
    async with running(settings) as gw, peer(gw) as p, peer(gw, token="bob-token") as other:
        await p.expect("catalog")
        fragments = ['{"type":"ack","seq":1,"pad":"', *["y" * (16 * 1024)] * 5, '"}']
        with contextlib.suppress(ConnectionClosed):  # the close may beat the last fragment
            await p.ws.send(iter(fragments))
        error = await closed(p)
        assert error.rcvd is not None
        assert error.rcvd.code == 1009
        assert p.ws.close_code == 1009
        await still_serves(other, "o1")


async def test_frame_just_under_limit_accepted(tmp_path: Path) -> None:
    """SPEC E2: a message of exactly max_message_bytes is accepted and parsed."""
    limit = 64 * 1024
    async with (
        running(settings_for(tmp_path, server={"max_message_bytes": limit})) as gw,
        peer(gw) as p,
    ):
        head = '{"type":"grants.list","id":"'
        tail = '"}'
        await p.send(head + "i" * (limit - len(head) - len(tail)) + tail)
        error = await p.expect("error")  # an id over 128 chars: invalid_value, not a close
        assert error["code"] == "invalid_value"
        await still_serves(p, "c1")


# -- E2: limits, announced and enforced ---------------------------------------------------


async def test_invoke_rate_limited(tmp_path: Path) -> None:
    """SPEC E2: past invoke_burst (rate ~0) an invoke gets error rate_limited naming the call."""
    settings = settings_for(tmp_path, limits={"invoke_rate": 0.001, "invoke_burst": 2})
    async with running(settings) as gw, peer(gw) as p:
        assert p.welcome["limits"]["invoke_rate"] == 0.001
        assert p.welcome["limits"]["invoke_burst"] == 2
        for call_id in ("c1", "c2"):
            await p.invoke(call_id, "convert_units", CONVERT)
            await p.terminal(call_id)
        await p.invoke("c3", "convert_units", CONVERT, id="r3")
        error = await p.expect("error")
        assert error == {
            "type": "error",
            "id": "r3",
            "code": "rate_limited",
            "message": error["message"],
            "details": {"call_id": "c3"},
        }
        assert not any(m.get("call_id") == "c3" and "seq" in m for m in await _barrier(p))


async def _barrier(p: Peer) -> list[dict[str, object]]:
    start = len(p.seen)
    await p.send({"type": "grants.list", "id": "barrier"})
    await p.expect("grants", id="barrier")
    return p.seen[start:]


async def test_too_many_inflight(tmp_path: Path) -> None:
    """SPEC E2: with max_inflight_calls 1 and a call awaiting approval, the next invoke is
    too_many_inflight; once the first ends the next is admitted."""
    async with (
        running(settings_for(tmp_path, limits={"max_inflight_calls": 1})) as gw,
        peer(gw) as p,
    ):
        assert p.welcome["limits"]["max_inflight_calls"] == 1
        await p.invoke("gated", "notes_delete", {"note_id": 1})
        start = await p.expect("tool_start", call_id="gated")
        await p.invoke("c2", "convert_units", CONVERT, id="r2")
        error = await p.expect("error")
        assert (error["code"], error["id"], error["details"]) == (
            "too_many_inflight",
            "r2",
            {"call_id": "c2"},
        )
        await p.send(
            {"type": "tool.confirm", "approval_id": start["approval_id"], "decision": "deny"}
        )
        await p.terminal("gated")
        await still_serves(p, "c2")  # the refused call_id may be retried


async def test_too_many_sessions_per_user_closes_1013(tmp_path: Path) -> None:
    """SPEC E2: past max_sessions_per_user hello gets too_many_sessions and close 1013;
    another user is not counted against it."""
    async with (
        running(settings_for(tmp_path, limits={"max_sessions_per_user": 1})) as gw,
        peer(gw) as first,
    ):
        assert first.welcome["limits"]["max_sessions_per_user"] == 1
        async with peer(gw, hello=False) as second:
            await second.send(
                {"type": "hello", "id": "h2", "token": "alice-token", "profile": "demo"}
            )
            error = await second.recv()
            assert (error["type"], error["code"], error["id"]) == (
                "error",
                "too_many_sessions",
                "h2",
            )
            closing = await closed(second)
            assert closing.rcvd is not None
            assert closing.rcvd.code == 1013
        async with peer(gw, token="bob-token") as bob:
            assert bob.welcome["resumed"] is False
        await still_serves(first, "c1")


async def test_too_many_pending_approvals(tmp_path: Path) -> None:
    """SPEC E2: past max_pending_approvals a gated call ends with too_many_pending_approvals."""
    async with (
        running(settings_for(tmp_path, limits={"max_pending_approvals": 1})) as gw,
        peer(gw) as p,
    ):
        assert p.welcome["limits"]["max_pending_approvals"] == 1
        await p.invoke("a1", "notes_delete", {"note_id": 1})
        await p.expect("tool_start", call_id="a1")
        await p.invoke("a2", "notes_delete", {"note_id": 2})
        refused = await p.terminal("a2")
        assert refused["type"] == "call.error"
        assert refused["code"] == "too_many_pending_approvals"


# -- E2, M3: a mounted MCP server's question is a frame like any other ----------------


async def test_e2_elicit_request_frame_fits_max_message_bytes(tmp_path: Path) -> None:
    """SPEC E2, M3: ``max_message_bytes`` 2048. The mounted `asker` server
    (tests/mcp/elicit_server.py) asks a question that quotes its ``topic`` argument; a
    topic of 1,500 characters fits the call's params, but the question's
    ``elicit.request`` would be larger than the announced limit. It is never sent: the
    MCP server is answered ``cancel`` (its tool then answers "cancel"), and every frame
    the client gets fits. Before, the oversized frame was sent."""
    from tests.mcp.support import asker_mount, mcp_settings

    server = {"port": 0, "heartbeat_interval": 0, "max_message_bytes": 2048}
    settings = mcp_settings(tmp_path, [asker_mount()], server=server)
    async with running(settings) as gw, peer(gw) as p:
        limit = p.welcome["limits"]["max_message_bytes"]
        assert limit == 2048
        async with asyncio.timeout(WAIT):
            while not any(
                m["type"] == "catalog" and any(t["name"] == "asker_ask" for t in m["tools"])
                for m in p.seen
            ):
                await p.recv()
        await p.invoke("e1", "asker_ask", {"topic": "x" * 1500})
        frames: list[tuple[dict[str, Any], int]] = []
        async with asyncio.timeout(WAIT):
            while (
                not frames
                or frames[-1][0].get("call_id") != "e1"
                or frames[-1][0]["type"] not in ("result", "call.error")
            ):
                raw = await p.ws.recv()
                frames.append(
                    (orjson.loads(raw), len(raw.encode() if isinstance(raw, str) else raw))
                )
        assert [f["type"] for f, _ in frames if f["type"] == "elicit.request"] == []
        assert max(size for _, size in frames) <= limit
        assert frames[-1][0]["result"]["text"] == "cancel"


# -- E2: job.done is sized with seq 1 -------------------------------------------------


async def test_e2_job_done_frame_fits_max_message_bytes_at_any_seq(tmp_path: Path) -> None:
    """SPEC E2: a job.done is checked against ``max_message_bytes`` "whole, where the
    job runner encodes it" (gateway/framesize.py), but it is sized with ``seq: 1``
    (`_done_fields`); the frame sent carries the session's real seq. Past seq 99 a
    result sized within 2 bytes of the limit leaves in a frame 1-2 bytes larger than
    the limit the server announced."""
    et.reset()
    limit = 4096
    settings = et.settings(
        tmp_path,
        server={"port": 0, "heartbeat_interval": 0, "max_message_bytes": limit},
        limits={"invoke_rate": 10000.0, "invoke_burst": 10000},
    )
    async with running(settings) as gw, peer(gw) as p:
        for n in range(60):  # the session's seq past 100
            await p.invoke(f"q{n}", "async_quick", {})
            await p.terminal(f"q{n}")

        async def job_frame(call_id: str, n: int) -> tuple[str, int]:
            await p.invoke(call_id, "pad_job", {"n": n})
            job_id = (await p.terminal(call_id))["job_id"]
            async with asyncio.timeout(WAIT):
                while True:
                    raw = await p.ws.recv()
                    frame = orjson.loads(raw)
                    if frame.get("job_id") == job_id and frame["type"] in (
                        "job.done",
                        "job.failed",
                    ):
                        return frame["type"], len(raw.encode() if isinstance(raw, str) else raw)

        kind, probe = await job_frame("probe", 10)
        assert kind == "job.done"
        target = limit - probe + 10
        sent = []
        for n in range(target - 40, target + 8):
            kind, size = await job_frame(f"p{n}", n)
            if kind == "job.done":
                sent.append(size)
        assert sent, "no job.done near the limit was sent"
        assert max(sent) <= limit, (limit, sorted(sent)[-4:])
