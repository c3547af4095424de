"""A call of a tool outside its session's catalog never reaches the principal's call
ledger (SPEC C3, I1 before I15).

The tool does not exist for that session: its call ends ``unknown_tool`` without being
given another session's recorded outcome or attached to its running call, and without
taking the principal's key, ending another session's running call in the ledger, or
running when the catalog shows the tool by the time the call's task starts.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.server import Gateway
from tests.gateway.test_wslib_fast_read import write_at_once
from tests.support import Peer, barrier, peer

NOTE = {"title": "payroll", "body": "salaries 2027"}
"""Arguments of a demo ``notes_create`` call (capability ``notes.write``, not in the
``readonly`` profile)."""


def terminals(p: Peer, call_id: str) -> list[dict[str, Any]]:
    """Every terminal event of ``call_id`` that ``p`` received so far."""
    kinds = ("result", "dispatched", "call.error")
    return [m for m in p.seen if m.get("call_id") == call_id and m["type"] in kinds]


async def test_c3_i15_a_call_outside_the_catalog_leaves_the_key_to_sessions_with_the_tool(
    gateway: Gateway,
) -> None:
    """SPEC C3, I15: alice's ``readonly`` session calls ``notes_create`` as ``x1``
    (``unknown_tool``); her ``demo`` session's ``x1`` then runs the tool (nothing ran
    before, nothing was recorded for her), and the readonly session's re-send gets its
    own ``unknown_tool`` again, not the demo call's result."""
    async with peer(gateway, profile="readonly") as ro, peer(gateway) as demo:
        await ro.invoke("x1", "notes_create", NOTE)
        assert (await ro.terminal("x1"))["code"] == "unknown_tool"
        await demo.invoke("x1", "notes_create", NOTE)
        assert (await demo.terminal("x1"))["type"] == "result"
        await ro.invoke("x1", "notes_create", NOTE)
        again = await ro.terminal("x1")
        assert (again["type"], again.get("code")) == ("call.error", "unknown_tool")


async def test_c3_i15_a_call_outside_the_catalog_does_not_end_the_running_call_of_its_id(
    gateway: Gateway,
) -> None:
    """SPEC C3, I12, I15: alice's ``demo`` call ``n1`` waits for approval; her
    ``readonly`` session's ``n1`` ends ``unknown_tool`` meanwhile. The demo call still
    ends once, with its own ``result``, which the ledger then holds: a third session's
    re-send gets that result, not the readonly session's ``unknown_tool``."""
    async with peer(gateway, options={"confirm_tool_calls": True}) as demo:
        await demo.invoke("n1", "notes_create", NOTE)
        approval = (await demo.expect("tool_start", call_id="n1"))["approval_id"]
        async with peer(gateway, profile="readonly") as ro:
            await ro.invoke("n1", "notes_create", NOTE)
            assert (await ro.terminal("n1"))["code"] == "unknown_tool"
        await demo.send({"type": "tool.confirm", "approval_id": approval, "decision": "allow"})
        result = await demo.terminal("n1")
        assert result["type"] == "result"
        await barrier(demo)
        assert len(terminals(demo, "n1")) == 1
        async with peer(gateway) as other:
            await other.invoke("n1", "notes_create", NOTE)
            replayed = await other.terminal("n1")
            assert (replayed["type"], replayed["result"]) == ("result", result["result"])


async def test_c3_i15_a_call_admitted_outside_the_catalog_does_not_run_once_it_shows(
    gateway: Gateway,
) -> None:
    """SPEC C3, I15: ``project_summary`` needs ``project_id``. An ``invoke`` of it and a
    ``context.update`` that links a project, read in one socket read: the call was
    admitted while the tool was absent (its key never opened in the ledger), so it ends
    ``unknown_tool`` even though the catalog shows the tool when its task starts."""
    async with peer(gateway) as p:
        await p.expect("catalog")
        call = {"type": "invoke", "call_id": "p1", "tool": "project_summary", "params": {}}
        update = {"type": "context.update", "id": "u", "context": {"project_id": "p9"}}
        write_at_once(
            p.ws, ("text", orjson.dumps(call), True), ("text", orjson.dumps(update), True)
        )
        ended = await p.terminal("p1")
        assert (ended["type"], ended.get("code")) == ("call.error", "unknown_tool")
        await p.invoke("p2", "project_summary", {})
        assert (await p.terminal("p2"))["type"] == "result"


async def test_c3_i12_an_attached_session_that_lost_the_tool_gets_one_terminal(
    gateway: Gateway,
) -> None:
    """SPEC C3, I12, I15: alice's session B, attached to her session A's pending call
    ``q1`` of ``project_summary``, unlinks its project (the tool leaves its catalog)
    and re-sends ``q1``: it gets ``unknown_tool``, and when A's call ends B gets no
    second terminal event for ``q1``."""
    linked = {"project_id": "p9"}
    async with (
        peer(gateway, context=linked, options={"confirm_tool_calls": True}) as a,
        peer(gateway, context=linked) as b,
    ):
        await a.invoke("q1", "project_summary", {})
        approval = (await a.expect("tool_start", call_id="q1"))["approval_id"]
        await b.invoke("q1", "project_summary", {})
        await barrier(b)  # attached: no reply yet
        await b.send({"type": "context.update", "id": "u", "context": {"project_id": None}})
        await b.expect("context", id="u")
        await b.invoke("q1", "project_summary", {})
        assert (await b.terminal("q1"))["code"] == "unknown_tool"
        await a.send({"type": "tool.confirm", "approval_id": approval, "decision": "allow"})
        assert (await a.terminal("q1"))["type"] == "result"
        await barrier(a)
        await barrier(b)
        assert [m["type"] for m in terminals(b, "q1")] == ["call.error"]
