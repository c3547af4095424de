"""Attacks at the protocol level (SPEC D4, C3, I15): a socket that lost its session to a
resume still acting on it; a profile that lacks a tool getting that tool's outcome
through the principal's call ledger.

Each test states the input and the right behaviour; they fail on the code they were
written against (branch h-proto) and pass once the fault is fixed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    CONVERT,
    MS,
    WAIT,
    Peer,
    barrier,
    peer,
    resume_fields,
    running,
    settings_for,
)

NOTE = {"title": "payroll", "body": "salaries 2027"}
"""Arguments of a demo ``notes_create`` call (capability ``notes.write``)."""


async def _answer(p: Peer, call_id: str) -> dict[str, Any]:
    """The first frame about ``call_id``: its terminal event, or an ``error`` reply
    naming it (``details.call_id``)."""
    async with asyncio.timeout(WAIT):
        while True:
            msg = await p.recv()
            if msg.get("call_id") == call_id and msg["type"] in (
                "result",
                "dispatched",
                "call.error",
            ):
                return msg
            if msg["type"] == "error" and (msg.get("details") or {}).get("call_id") == call_id:
                return msg


async def test_d4_a_replaced_socket_cannot_end_the_session_it_lost(tmp_path: Path) -> None:
    """SPEC D4, I12: a resume on a new socket takes the session over; the old socket is
    closed 4000 and no longer carries the session. Input: alice's socket ``old`` is
    alive but slow to read (it has not read the 4000 close yet, as on a congested
    network); a new socket resumes the session; ``old`` then sends ``bye``, which it
    wrote before it learned it was replaced. Right: the ``bye`` of a socket that no
    longer holds the session changes nothing; the new socket's calls still get their
    terminal reply. Seen: the stale ``bye`` ends the resumed session; the new socket
    stays open on an ended session and its ``invoke`` never gets a terminal reply."""
    async with running(settings_for(tmp_path)) as gw:
        async with peer(gw) as old:
            await old.invoke("c1", "convert_units", CONVERT)
            await old.terminal("c1")
            old.ws.transport.pause_reading()  # it does not see the 4000 close
            async with peer(gw, hello=False) as new:
                await new.hello(**resume_fields(old, 0))
                assert new.welcome["resumed"] is True
                await old.send({"type": "bye", "id": "stale"})
                await asyncio.sleep(300 * MS)  # the stale frame reaches the server
                await new.invoke("c2", "convert_units", CONVERT)
                try:
                    async with asyncio.timeout(2.0):
                        reply = await _answer(new, "c2")
                except TimeoutError:
                    reply = {"type": "nothing within 2 s"}
                ended = gw.sessions.get(new.welcome["session_id"]) is None
                assert (reply["type"], ended) == ("result", False), (reply, ended)
            old.ws.transport.resume_reading()


async def test_d4_a_replaced_socket_cannot_change_the_context(tmp_path: Path) -> None:
    """SPEC D4, S5: as above, the replaced socket sends ``context.update`` after the
    takeover. Right: the session's context is the new socket's alone (unchanged).
    Seen: the stale socket's update is applied to the session the new socket holds."""
    async with running(settings_for(tmp_path)) as gw:
        async with peer(gw) as old:
            await barrier(old)
            old.ws.transport.pause_reading()
            async with peer(gw, hello=False) as new:
                await new.hello(**resume_fields(old, 0))
                assert new.welcome["resumed"] is True
                update = {"type": "context.update", "id": "stale", "context": {"project_id": "p9"}}
                await old.send(update)
                await asyncio.sleep(300 * MS)
                await new.send({"type": "context.update", "id": "mine", "context": {}})
                reply = await new.expect("context", id="mine")
                assert reply["context"] == {}, reply
            old.ws.transport.resume_reading()


@pytest.mark.parametrize("when", ["finished", "running"])
async def test_c3_i15_a_profile_without_the_tool_never_gets_its_outcome(
    tmp_path: Path, when: str
) -> None:
    """SPEC C3, I1, I15: a tool absent from a session's catalog does not exist for it;
    invoking it fails exactly like an unknown tool. Input: alice runs ``notes_create``
    (capability ``notes.write``) in a ``demo`` session under call id ``n1``; her
    ``readonly`` session (no ``notes.write``: the tool is not in its catalog) sends the
    same ``invoke`` (same call id, tool and params), after the call ``finished`` or
    while it is ``running`` (approval pending). Right: ``call.error unknown_tool``, as
    for any call of that tool from this session. Seen: the ledger answers first, and
    the readonly session gets the write tool's recorded ``result`` (or is attached to
    the running call and gets it when it ends)."""
    async with running(settings_for(tmp_path)) as gw:
        async with peer(gw, options={"confirm_tool_calls": when == "running"}) as demo:
            await demo.invoke("n1", "notes_create", NOTE)
            if when == "running":
                start = await demo.expect("tool_start", call_id="n1")
                assert start.get("approval_id")
            else:
                assert (await demo.terminal("n1"))["type"] == "result"
            async with peer(gw, profile="readonly") as ro:
                names = {t["name"] for t in (await ro.expect("catalog"))["tools"]}
                assert "notes_create" not in names
                await ro.invoke("n0", "notes_create", NOTE)
                own = await _answer(ro, "n0")
                assert (own["type"], own.get("code")) == ("call.error", "unknown_tool")
                await ro.invoke("n1", "notes_create", NOTE)
                if when == "running":
                    await asyncio.sleep(100 * MS)
                    approval = start["approval_id"]
                    await demo.send(
                        {"type": "tool.confirm", "approval_id": approval, "decision": "allow"}
                    )
                reply = await _answer(ro, "n1")
                assert (reply["type"], reply.get("code")) == ("call.error", "unknown_tool"), reply


async def test_e2_re_sends_of_a_finished_call_are_rate_limited_too(tmp_path: Path) -> None:
    """SPEC E2, I12: the invoke rate per session bounds every ``invoke``. Input:
    ``invoke_rate`` ~0, ``invoke_burst`` 2; call ``c1`` finishes; the client then sends
    the same ``invoke`` 50 times. Right: past the burst, the re-sends are refused
    ``rate_limited`` (typed, nothing recorded; the client retries later). Seen: the
    re-sends bypass the limit (the recorded-outcome path is taken before the rate
    check): every one is answered with the recorded ``result``, each costing the
    server a store flush and read on the event loop, at whatever rate the client sends."""
    settings = settings_for(tmp_path, limits={"invoke_rate": 0.001, "invoke_burst": 2})
    async with running(settings) as gw, peer(gw) as p:
        await p.invoke("c1", "convert_units", CONVERT)
        assert (await p.terminal("c1"))["type"] == "result"
        for _ in range(50):
            await p.invoke("c1", "convert_units", CONVERT)
        answers = [await _answer(p, "c1") for _ in range(50)]
        kinds = [a["type"] if a["type"] != "error" else a["code"] for a in answers]
        assert kinds.count("rate_limited") >= 48, kinds
