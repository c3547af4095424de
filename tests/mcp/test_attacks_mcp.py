"""Attacks on ``/mcp`` (SPEC M4, S2, A3, A7, E1): other users' MCP session ids, missing
or malformed headers, huge or deep JSON. A real gateway on 127.0.0.1, raw HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from gateway.server import Gateway
from tests.mcp.support import asker_mount, mcp_settings
from tests.support import Clock, peer, running, settings_for

ACCEPT = "application/json, text/event-stream"


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running(settings_for(tmp_path)) as gw:
        yield gw


def _body(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC message of a JSON or one-event SSE response."""
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:"))
    message: dict[str, Any] = orjson.loads(text)
    return message


async def _open(http: httpx2.AsyncClient, url: str, token: str) -> dict[str, str]:
    """Initialize an MCP session as ``token``; the headers its later requests carry."""
    headers = {"Authorization": f"Bearer {token}", "Accept": ACCEPT, "X-Toolbus-Profile": "demo"}
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "attack", "version": "1"},
        },
    }
    response = await http.post(url, json=init, headers=headers)
    assert response.status_code == 200, response.text
    version = _body(response)["result"]["protocolVersion"]
    headers = {
        **headers,
        "mcp-session-id": response.headers["mcp-session-id"],
        "mcp-protocol-version": version,
    }
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(url, json=note, headers=headers)).status_code == 202
    return headers


async def test_m4_s2_another_users_mcp_session_id_is_not_found(gateway: Gateway) -> None:
    """SPEC M4, S2, A7: bob presenting alice's MCP session id (GET, POST, DELETE) is
    answered exactly like a made-up id (404 ``Session not found``), and alice's session
    keeps working: a session is bound to the principal that opened it."""
    url = f"http://127.0.0.1:{gateway.port}/mcp"
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx2.AsyncClient(timeout=10) as http:
        alice = await _open(http, url, "alice-token")
        bob = await _open(http, url, "bob-token")
        answers = []
        for sid in (alice["mcp-session-id"], "0" * 32):
            forged = {**bob, "mcp-session-id": sid}
            post = await http.post(url, json=listing, headers=forged)
            delete = await http.delete(url, headers=forged)
            answers.append([(r.status_code, r.text) for r in (post, delete)])
        assert answers[0] == answers[1]
        assert answers[0][0][0] == 404
        mine = await http.post(url, json=listing, headers=alice)
        assert mine.status_code == 200
        assert "tools" in _body(mine)["result"]


async def test_m4_e1_huge_or_deep_json_and_bad_headers_are_refused(gateway: Gateway) -> None:
    """SPEC M4, E1: deep JSON, a body over the frame limit, a body that is not JSON, a
    wrong content type and a malformed session id each get an HTTP or JSON-RPC error;
    the endpoint and the WebSocket side keep serving."""
    url = f"http://127.0.0.1:{gateway.port}/mcp"
    async with httpx2.AsyncClient(timeout=10) as http:
        alice = await _open(http, url, "alice-token")
        deep = "[" * 100_000 + "]" * 100_000
        wide = (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"'
            + b"x" * (64 << 20)
            + b'"}}'
        )
        statuses = []
        for content in (deep.encode(), wide, b"\xff\xfe", b"{"):
            response = await http.post(url, content=content, headers=alice)
            statuses.append(response.status_code)
        odd = {**alice, "mcp-session-id": "../x" * 3000, "content-type": "text/plain"}
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        statuses.append((await http.post(url, json=listing, headers=odd)).status_code)
        assert all(400 <= s < 500 for s in statuses), statuses
        mine = await http.post(url, json=listing, headers=alice)
        assert mine.status_code == 200


async def test_m3_a7_another_sessions_elicitation_id_is_unknown(tmp_path: Path) -> None:
    """SPEC M3, A3, A7: a mounted MCP server asks alice a question during her call; bob's
    ``elicit.answer`` for her ``elicitation_id`` and for a made-up one get the same
    answer (not accepted, ``unknown``) and change nothing: her own answer is the one the
    server gets."""
    async with (
        running(mcp_settings(tmp_path, [asker_mount()])) as gw,
        peer(gw) as alice,
        peer(gw, token="bob-token") as bob,
    ):
        tools: list[dict[str, Any]] = (await alice.expect("catalog"))["tools"]
        while not any(t["name"] == "asker_ask" for t in tools):
            tools = (await alice.expect("catalog"))["tools"]
        await alice.invoke("e1", "asker_ask", {"topic": "lunch"})
        asked = await alice.expect("elicit.request", call_id="e1")
        answers = []
        for el_id in (asked["elicitation_id"], "el_" + "A" * 22):
            await bob.send({"type": "elicit.answer", "id": el_id, "elicitation_id": el_id,
                            "action": "accept", "content": {"name": "Mallory"}})  # fmt: skip
            got = await bob.expect("elicit.result", id=el_id)
            answers.append((got["accepted"], got["reason"]))
        assert answers == [(False, "unknown"), (False, "unknown")]
        content = {"name": "Ada", "email": "ada@example.org", "age": 36}
        mine = {"elicitation_id": asked["elicitation_id"], "content": content}
        await alice.send({"type": "elicit.answer", "id": "mine", "action": "accept", **mine})
        got = await alice.expect("elicit.result", id="mine")
        assert (got["accepted"], got.get("reason")) == (True, None)
        result = await alice.terminal("e1")
        assert result["type"] == "result"
        assert "Ada" in result["result"]["text"]
        assert "Mallory" not in result["result"]["text"]


async def test_m3_a4_an_answer_past_expires_at_is_expired_before_the_timeout(
    tmp_path: Path,
) -> None:
    """SPEC M3, A4: the deadline is the `expires_at` that `elicit.request` announced, on
    the gateway's clock. The clock passes it while the wait's timeout (the loop's clock,
    ``calls.approval_timeout``) has not fired: an `accept` then is not accepted
    (`expired`), and the MCP server is answered `cancel`, as at the timeout. Before, the
    late answer was accepted and its content reached the server."""
    clock = Clock()
    gw = Gateway(mcp_settings(tmp_path, [asker_mount()]), clock=clock)
    await gw.start()
    try:
        async with peer(gw) as alice:
            tools: list[dict[str, Any]] = (await alice.expect("catalog"))["tools"]
            while not any(t["name"] == "asker_ask" for t in tools):
                tools = (await alice.expect("catalog"))["tools"]
            await alice.invoke("e1", "asker_ask", {"topic": "lunch"})
            asked = await alice.expect("elicit.request", call_id="e1")
            clock.ahead = asked["expires_at"] - clock() + 1.0
            content = {"name": "Ada", "email": "ada@example.org", "age": 36}
            late = {"elicitation_id": asked["elicitation_id"], "content": content}
            await alice.send({"type": "elicit.answer", "id": "late", "action": "accept", **late})
            got = await alice.expect("elicit.result", id="late")
            assert (got["accepted"], got["reason"]) == (False, "expired")
            result = await alice.terminal("e1")
            assert (result["type"], result["result"]["text"]) == ("result", "cancel")
    finally:
        await gw.drain()


async def test_m4_e1_a_long_json_rpc_id_still_calls_the_tool(gateway: Gateway) -> None:
    """SPEC M4, E1: JSON-RPC bounds no id. A ``tools/call`` whose id has 300 characters
    makes a call id longer than toolbus allows; it is hashed, so the call runs and
    answers under that id, and nothing is left waiting (F33)."""
    url = f"http://127.0.0.1:{gateway.port}/mcp"
    long_id = "r" * 300
    call = {
        "jsonrpc": "2.0",
        "id": long_id,
        "method": "tools/call",
        "params": {
            "name": "convert_units",
            "arguments": {"value": 1, "from_unit": "m", "to_unit": "cm"},
        },
    }
    async with httpx2.AsyncClient(timeout=10) as http:
        alice = await _open(http, url, "alice-token")
        answer = _body(await http.post(url, json=call, headers=alice))
    assert answer["id"] == long_id
    assert answer["result"]["isError"] is False, answer
    assert answer["result"]["structuredContent"]["result"] == 100


@pytest.mark.parametrize(
    ("number", "what"),
    [
        ("1180591620717411303424", "integer 1180591620717411303424 is wider than 64 bits"),
        ("1e400", "number Infinity is past the range of a 64-bit float"),
    ],
)
async def test_m4_e1_a_number_toolbus_cannot_carry_is_refused_alike(
    gateway: Gateway, number: str, what: str
) -> None:
    """SPEC M4, E1, I4: arguments with an integer wider than 64 bits or a number past a
    double's range get invalid_params naming the JSON pointer, the same text at /mcp
    (a tool error, before the call starts) and on the WebSocket (an error with the
    request id)."""
    url = f"http://127.0.0.1:{gateway.port}/mcp"
    arguments = '{"value":' + number + ',"from_unit":"m","to_unit":"cm"}'
    call = (
        '{"jsonrpc":"2.0","id":5,"method":"tools/call",'
        '"params":{"name":"convert_units","arguments":' + arguments + "}}"
    )
    async with httpx2.AsyncClient(timeout=10) as http:
        headers = await _open(http, url, "bob-token")
        headers["content-type"] = "application/json"
        answer = _body(await http.post(url, content=call, headers=headers))
    assert answer["result"]["isError"] is True, answer
    assert answer["result"]["content"][0]["text"] == f"invalid_params: /value: {what}"
    async with peer(gateway) as p:
        await p.expect("catalog")
        frame = '{"type":"invoke","id":"r1","call_id":"c1","tool":"convert_units","params":'
        await p.ws.send(frame + arguments + "}")
        error = await p.expect("error")
    assert (error["code"], error["id"], error["message"]) == (
        "invalid_params",
        "r1",
        f"/value: {what}",
    )
