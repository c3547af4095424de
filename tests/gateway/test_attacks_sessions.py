"""Attacks on sessions (SPEC D3, D4, S2): two sockets resume the same session at once;
a JWT with a malformed ``tenant`` claim.

Both hellos arrive before either is answered. Whatever their order, exactly one socket
carries the session afterwards; the other is closed 4000 (``session resumed on another
connection``); the one that remains gets the replay once and its new calls work.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import jwt
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.outbox import Link
from gateway.server import Gateway
from tests.support import (
    CONVERT,
    Peer,
    closed,
    dropped,
    park_signal,
    peer,
    resume_fields,
    running,
    settings_for,
)


async def _raw(gw: Gateway) -> Peer:
    ws = await connect(gw.url, subprotocols=["toolbus.v1"], max_size=None)  # type: ignore[list-item]
    return Peer(ws)


@pytest.mark.parametrize("writes", ["direct", "queued"])
async def test_concurrent_resume_of_one_session_leaves_one_socket(
    tmp_path: Path, writes: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC D3, D4: two resumes of one session sent in the same instant: the later one
    wins, keeps the session, gets the replay once and its calls work; the other is
    closed 4000, with or without its ``welcome`` (a takeover drops what the replaced
    socket still had queued, its welcome too when the writer had not sent it yet:
    ``queued`` forces every frame through the writer task, as a busy socket does)."""
    if writes == "queued":
        monkeypatch.setattr(Link, "_send_now", lambda self, frames: False)
    async with running(settings_for(tmp_path)) as gw:
        parked = park_signal(gw)
        async with peer(gw) as first:
            await first.invoke("c1", "convert_units", CONVERT)
            result = await first.terminal("c1")
            await dropped(first, parked)
        a, b = await _raw(gw), await _raw(gw)
        try:
            hello = {"type": "hello", "token": "alice-token", "profile": "demo"}
            hello |= resume_fields(first, 0)
            frame = orjson.dumps(hello).decode()
            await asyncio.gather(a.ws.send(frame), b.ws.send(frame))
            # Exactly one of the two is closed, 4000; the other carries the session,
            # was welcomed resumed, got the whole replay and runs new calls.
            outcomes = await asyncio.gather(_closed_or_works(a, "a2"), _closed_or_works(b, "b2"))
            assert sorted(outcomes) == [0, 4000], outcomes
            survivor = a if outcomes[0] == 0 else b
            welcomes = [m for p in (a, b) for m in p.seen if m["type"] == "welcome"]
            assert survivor.seen[0]["type"] == "welcome"
            assert {(w["resumed"], w["session_id"]) for w in welcomes} == {
                (True, first.welcome["session_id"])
            }
            c1 = [m for m in survivor.seen if m.get("call_id") == "c1"]
            assert [m["type"] for m in c1] == ["tool_start", "result"]
            assert c1[-1] == result
            assert len(gw.sessions.sessions) == 1
        finally:
            await a.ws.close()
            await b.ws.close()


async def _closed_or_works(p: Peer, call_id: str) -> int:
    """0 when ``p`` is welcomed and a new call on it answers; the close code when ``p``
    was closed (before or after its welcome)."""
    try:
        await p.expect("welcome")
        await p.invoke(call_id, "convert_units", CONVERT)
        reply = await p.terminal(call_id)
    except ConnectionClosed:
        exc = await closed(p)
        return exc.rcvd.code if exc.rcvd is not None else -1
    assert reply["type"] == "result"
    return 0


async def test_jwt_with_a_non_string_tenant_is_refused_typed(tmp_path: Path) -> None:
    """SPEC S2, E1: a JWT whose ``tenant`` claim is an object or a number is refused
    ``auth_failed`` like any bad credential (before: an object tenant closed the socket
    1011 from inside the session table; a number was taken as a tenant)."""
    secret = "a-test-only-hs256-secret-of-32-bytes-or-more!"
    async with running(settings_for(tmp_path, auth={"jwt_secret": secret})) as gw:
        for tenant in ({"a": 1}, 5):
            claims = {"sub": "ana", "exp": time.time() + 60, "profiles": ["demo"]}
            credential = jwt.encode({**claims, "tenant": tenant}, secret, "HS256")
            p = await _raw(gw)
            try:
                await p.send({"type": "hello", "token": credential, "profile": "demo"})
                error = await p.expect("error")
                assert error["code"] == "auth_failed"
                assert (await closed(p)).rcvd.code == 4003  # type: ignore[union-attr]
            finally:
                await p.ws.close()
