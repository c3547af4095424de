"""A decision routed to another node is answered as one node would answer it (SPEC A3,
A4, N3, M3): the session moved to node B while its call waits on node A.

Two real gateways share one PostgreSQL schema, in this process, on one :class:`Clock`
the test moves (the wall clock of both nodes; their timers keep real time). A
``tool.confirm`` or ``elicit.answer`` sent on B after the ``expires_at`` that
``tool_start`` or ``elicit.request`` announced is ``expired``, as on one node, and the
call on A is settled as its timeout would settle it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gateway.server import Gateway
from tests.gateway import thread_tools
from tests.gateway.store_faults import until
from tests.gateway.thread_tools import RUNS
from tests.mcp.support import asker_mount, mcp_settings
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import WAIT, Clock, Peer, barrier, own_catalog, peer, resume_fields, settings_for

TOOLS = """
tools:
  - name: gated_quick
    description: Needs approval, then records its run.
    capability: r.basic
    requires_approval: true
    handler: tests.gateway.thread_tools:mark
"""
PROFILES = "profiles:\n  demo:\n    capabilities: [r.basic]\n"
TIMEOUT = 300.0
"""``calls.approval_timeout``: the nodes' timers (real time) never fire in a test."""
SHORT = 30.0
"""An approval timeout shorter than ``REQUEST_TTL`` (60 s), for a node that applies a
routed decision past ``expires_at`` (its timers, real time, do not fire in a test)."""
ADA = {"name": "Ada", "email": "ada@example.org", "age": 36}


@asynccontextmanager
async def two_nodes(
    tmp: Path,
    url: str,
    clock: Clock,
    mcp: bool = False,
    clock_b: Clock | None = None,
    approval_timeout: float = TIMEOUT,
    lease_interval: float = 0.2,
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """Nodes ``a`` and ``b`` on the store ``url``, each with its own data folder, both
    on ``clock`` (or B on ``clock_b``: their wall clocks differ); the gated catalog
    above, or (``mcp``) the asker MCP server mounted; ``approval_timeout`` and the
    nodes' ``lease_interval`` in seconds."""
    started: list[Gateway] = []
    try:
        for name, own in (("a", clock), ("b", clock_b or clock)):
            folder = tmp / name
            folder.mkdir()
            sections: dict[str, Any] = {
                "store": {"url": url},
                "nodes": {
                    "node_id": f"n-{name}",
                    "lease_interval": lease_interval,
                    "lease_ttl": max(1.0, lease_interval * 5),
                },
                "calls": {"approval_timeout": approval_timeout},
            }
            settings = (
                mcp_settings(folder, [asker_mount()], **sections)
                if mcp
                else settings_for(folder, catalog=own_catalog(folder, TOOLS, PROFILES), **sections)
            )
            gateway = Gateway(settings, clock=own)
            await gateway.start()
            started.append(gateway)
        yield started[0], started[1]
    finally:
        for gateway in reversed(started):
            await gateway.drain()


async def _on_a(a: Gateway, first: str, call_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Invoke ``call_id`` on A, wait for its event ``first`` (``tool_start`` or
    ``elicit.request``), close the socket. Returns the hello fields that resume the
    session before that event (it is replayed), and the event."""
    async with peer(a) as on_a:
        if first == "elicit.request":
            await _asker_listed(on_a)
            await on_a.invoke(call_id, "asker_ask", {"topic": "lunch"})
        else:
            await on_a.invoke(call_id, "gated_quick", {})
        event = await on_a.expect(first, call_id=call_id)
    return resume_fields(on_a, event["seq"] - 1), event


async def _asker_listed(p: Peer) -> None:
    """Wait for a catalog that lists ``asker_ask`` (the mount connects after the start)."""
    tools: list[dict[str, Any]] = (await p.expect("catalog"))["tools"]
    while not any(t["name"] == "asker_ask" for t in tools):
        tools = (await p.expect("catalog"))["tools"]


async def _confirm(p: Peer, approval_id: str, rid: str, decision: str = "allow") -> Any:
    await p.send(
        {"type": "tool.confirm", "id": rid, "approval_id": approval_id, "decision": decision}
    )
    got = await p.expect("confirm.result", id=rid)
    return got["accepted"], got.get("reason")


async def test_a4_n3_a_confirm_on_b_past_expires_at_is_expired_and_the_call_times_out(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC A4, A3, N3: the call waits for approval on A; the session resumed on B. The
    clock passes the ``expires_at`` of ``tool_start`` (the nodes' timers, real time,
    have not fired). An ``allow`` sent on B then is not accepted (``expired``), as on
    one node; the call is denied ``timeout`` (``tool.resolved``, a declined ``result``)
    and its tool never runs; a second ``allow`` is ``expired`` too. Before, B answered
    ``accepted`` for a decision that did not count: A settled it ``timeout``."""
    thread_tools.reset()
    clock = Clock()
    async with two_nodes(tmp_path, pg_url, clock) as (a, b):
        fields, start = await _on_a(a, "tool_start", "c1")
        async with peer(b, **fields) as on_b:
            assert on_b.welcome["resumed"] is True
            replayed = await on_b.expect("tool_start", call_id="c1")
            assert replayed["approval_id"] == start["approval_id"]
            clock.ahead = start["expires_at"] - clock() + 1.0
            assert await _confirm(on_b, start["approval_id"], "k1") == (False, "expired")
            resolved = await on_b.expect("tool.resolved", call_id="c1")
            assert (resolved["resolution"], resolved["reason"]) == ("denied", "timeout")
            result = await on_b.terminal("c1")
            assert (result["type"], result["declined"], result["result"]["reason"]) == (
                "result",
                True,
                "timeout",
            )
            assert await _confirm(on_b, start["approval_id"], "k2") == (False, "expired")
            await barrier(on_b)
        assert RUNS == []
        assert a.approvals.pending == {}


async def test_a3_n3_a_confirm_on_b_after_the_call_was_settled_on_a_is_as_on_one_node(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC A3, N3: the call waits for approval on A; the session resumed on B, whose
    ``call.cancel`` reaches A: the approval is denied ``cancelled`` there, and its
    ``tool.resolved`` reaches B. An ``allow`` sent on B after that is
    ``already_decided``, as one node answers a decision after the settlement. Before,
    B answered ``unknown``: the call's row on A no longer named the approval."""
    thread_tools.reset()
    clock = Clock()
    async with two_nodes(tmp_path, pg_url, clock) as (a, b):
        fields, start = await _on_a(a, "tool_start", "c1")
        async with peer(b, **fields) as on_b:
            await on_b.expect("tool_start", call_id="c1")
            await on_b.send({"type": "call.cancel", "id": "x", "call_id": "c1"})
            resolved = await on_b.expect("tool.resolved", call_id="c1")
            assert (resolved["resolution"], resolved["reason"]) == ("denied", "cancelled")
            assert (await on_b.terminal("c1"))["code"] == "cancelled"
            reply = await _confirm(on_b, start["approval_id"], "k1")
            assert reply == (False, "already_decided")
        assert RUNS == []


async def test_m3_n3_an_answer_on_b_past_expires_at_is_expired_and_the_server_gets_cancel(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC M3, A4, N3: the mounted MCP tool of call ``e1`` asks its user on A; the
    session resumed on B. The clock passes the ``expires_at`` of ``elicit.request``. An
    ``accept`` sent on B then is not accepted (``expired``), as on one node, and the MCP
    server on A is answered ``cancel``, as at the timeout. Before, B answered
    ``accepted`` while A answered the server ``cancel``."""
    clock = Clock()
    async with two_nodes(tmp_path, pg_url, clock, mcp=True) as (a, b):
        fields, asked = await _on_a(a, "elicit.request", "e1")
        async with peer(b, **fields) as on_b:
            await on_b.expect("elicit.request", call_id="e1")
            clock.ahead = asked["expires_at"] - clock() + 1.0
            answer = {"elicitation_id": asked["elicitation_id"], "content": ADA}
            await on_b.send({"type": "elicit.answer", "id": "late", "action": "accept", **answer})
            got = await on_b.expect("elicit.result", id="late")
            assert (got["accepted"], got.get("reason")) == (False, "expired")
            result = await on_b.terminal("e1")
            assert (result["type"], result["result"]["text"]) == ("result", "cancel")


async def test_a4_n3_a_confirm_in_time_on_b_that_a_applies_past_expires_at_counts(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC A4, A3, N3: the call waits for approval on A; the session resumed on B. B
    receives an ``allow`` before the ``expires_at`` of ``tool_start`` and routes it;
    A's clock is already past that deadline (30 s away) when it applies the row (A is
    late, or its clock runs ahead). The decision counts, judged by B's time of receipt that the row
    carries: ``accepted``, ``tool.resolved`` allowed by the user, and the tool runs."""
    thread_tools.reset()
    clock_a, clock_b = Clock(), Clock()
    async with two_nodes(tmp_path, pg_url, clock_a, clock_b=clock_b, approval_timeout=SHORT) as (
        a,
        b,
    ):
        fields, start = await _on_a(a, "tool_start", "c1")
        async with peer(b, **fields) as on_b:
            await on_b.expect("tool_start", call_id="c1")
            clock_a.ahead = start["expires_at"] - clock_a() + 1.0
            assert await _confirm(on_b, start["approval_id"], "k1") == (True, None)
            resolved = await on_b.expect("tool.resolved", call_id="c1")
            assert (resolved["resolution"], resolved["reason"]) == ("allowed", "user")
            result = await on_b.terminal("c1")
            assert (result["type"], bool(result.get("declined"))) == ("result", False), result
        assert RUNS == ["c1"]
        assert a.approvals.pending == {}


async def test_m3_n3_an_answer_in_time_on_b_that_a_applies_past_expires_at_counts(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC M3, A4, N3: the mounted MCP tool of call ``e1`` asks its user on A; the
    session resumed on B, which receives an ``accept`` before the ``expires_at`` of
    ``elicit.request``; A's clock is past it when it applies the routed row. The answer
    counts (B's time of receipt): accepted, and the MCP server gets the form."""
    clock_a, clock_b = Clock(), Clock()
    nodes = two_nodes(tmp_path, pg_url, clock_a, mcp=True, clock_b=clock_b, approval_timeout=SHORT)
    async with nodes as (a, b):
        fields, asked = await _on_a(a, "elicit.request", "e1")
        async with peer(b, **fields) as on_b:
            await on_b.expect("elicit.request", call_id="e1")
            clock_a.ahead = asked["expires_at"] - clock_a() + 1.0
            answer = {"elicitation_id": asked["elicitation_id"], "content": ADA}
            await on_b.send({"type": "elicit.answer", "id": "ok", "action": "accept", **answer})
            got = await on_b.expect("elicit.result", id="ok")
            assert (got["accepted"], got.get("reason")) == (True, None)
            result = await on_b.terminal("e1")
            assert result["type"] == "result", result
            assert result["result"]["text"].startswith("accept {"), result


async def test_n3_a_routed_confirm_is_applied_by_a_node_whose_clock_runs_ahead(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N3, A3, A4: the call waits for approval on A, whose wall clock runs two
    minutes ahead of B's (the approval's 300 s are not over on either clock); the
    session resumed on B, which receives an ``allow`` and answers ``accepted``. A must
    apply it: ``tool.resolved`` allowed by the user, and the tool runs. Before, A's
    sweep dropped the row as older than ``REQUEST_TTL`` (60 s), judged on A's clock
    against B's time of receipt, and the accepted decision never counted."""
    thread_tools.reset()
    clock_a, clock_b = Clock(), Clock()
    clock_a.ahead = 120.0
    async with two_nodes(tmp_path, pg_url, clock_a, clock_b=clock_b) as (a, b):
        fields, start = await _on_a(a, "tool_start", "c1")
        async with peer(b, **fields) as on_b:
            await on_b.expect("tool_start", call_id="c1")
            assert await _confirm(on_b, start["approval_id"], "k1") == (True, None)
            resolved = await on_b.expect("tool.resolved", call_id="c1")
            assert (resolved["resolution"], resolved["reason"]) == ("allowed", "user")
            result = await on_b.terminal("c1")
            assert (result["type"], bool(result.get("declined"))) == ("result", False), result
        assert RUNS == ["c1"]


def _adopted(gateway: Gateway) -> float:
    """Calls pending approval ``gateway`` adopted from a drained node (SPEC N6)."""
    registry = gateway.metrics.registry
    found = registry.get_sample_value("toolbus_call_handoffs_total", {"side": "adopted"})
    return found or 0.0


async def test_a3_n6_a_decision_routed_before_a_handoff_wins_over_a_later_one(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC A3, N6, N3: the call waits for approval on A; the session resumed on B. A
    drains and hands the approval off (its call's row keeps it); B receives ``deny``
    for it then and routes it (``accepted``: it waits in ``node_requests`` for the
    node that adopts the call). B adopts the call; an ``allow`` sent on B right after
    is not accepted (``already_decided``): the first decision wins, the call ends
    declined and its tool never runs. The lease interval is 2 s, so B's next sweep of
    routed requests is far off when the ``allow`` arrives. Before, B's ``allow`` won:
    the routed ``deny`` waited for that sweep, and the tool ran."""
    thread_tools.reset()
    clock = Clock()
    async with two_nodes(tmp_path, pg_url, clock, lease_interval=2.0) as (a, b):
        fields, start = await _on_a(a, "tool_start", "c1")
        approval_id = start["approval_id"]
        async with peer(b, **fields) as on_b:
            await on_b.expect("tool_start", call_id="c1")
            drained = asyncio.ensure_future(a.drain())
            try:
                await until(lambda: approval_id not in a.approvals.pending, "A's hand-off")
                assert await _confirm(on_b, approval_id, "k1", "deny") == (True, None)
                await until(lambda: _adopted(b) == 1.0, "B's adoption")
                second = await _confirm(on_b, approval_id, "k2", "allow")
                async with asyncio.timeout(WAIT):  # c1's end, maybe received already
                    while not [m for m in on_b.seen if m.get("call_id") == "c1" and "seq" in m][2:]:
                        await on_b.recv()
            finally:
                await drained
            of_c1 = [msg for msg in on_b.seen if msg.get("call_id") == "c1"]
            assert second == (False, "already_decided")
            assert [(msg["type"], msg.get("resolution"), msg.get("reason")) for msg in of_c1] == [
                ("tool_start", None, None),
                ("tool.resolved", "denied", "user"),
                ("result", None, None),
            ]
            assert of_c1[-1]["declined"] is True, of_c1
        assert RUNS == []
