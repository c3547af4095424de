"""Calls waiting for approval survive a drain: handed to another node, or to the next
start, under the same approval id (SPEC N6, A2-A6, I15; gateway/handoff.py).

Real ``toolbus serve`` processes on the PostgreSQL store, HAProxy in front of two of
them, the real client. ``server.drain_grace`` is 60 s: a drain that waited for an
approval instead of handing it off would not end within the tests' 30 s wait.
"""

from __future__ import annotations

import asyncio
import collections
import re
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg

import toolbus
from protocol import messages as m
from tests.gateway import test_nodes_late_decisions as ld
from tests.gateway.drill_tools import DrillNode, Seen, runs
from tests.gateway.lb_tools import haproxy
from tests.gateway.store_faults import until
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import WAIT, Clock, peer

GRACE = {"server": {"drain_grace": 60.0}}
EXIT = 30.0
"""Seconds a drained node may take to exit (well under its 60 s grace)."""


def _client(front: str, seen: Seen) -> toolbus.Client:
    return toolbus.connect(
        front,
        token="alice-token",
        profile="demo",
        request_timeout=WAIT,
        on_message=seen,
        confirm_tool_calls=True,
        backoff=toolbus.Backoff(initial=0.05, cap=0.5),
    )


def _handoffs(node: DrillNode, side: str) -> float:
    """``toolbus_call_handoffs_total{side=...}`` of the node (0 before the first)."""
    with urllib.request.urlopen(f"http://{node.address}/metrics", timeout=WAIT) as reply:
        text = reply.read().decode()
    found = re.search(rf'^toolbus_call_handoffs_total{{side="{side}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def _until(check: Any, what: str) -> None:
    """Poll ``check`` (another process changes what it reads) until it holds."""
    try:
        async with asyncio.timeout(WAIT):
            while not await check():  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT} s: {what}") from None


def _owner(url: str, session_id: str) -> str:
    with psycopg.connect(url, autocommit=True) as db:
        row = db.execute(
            "SELECT owner_node FROM sessions WHERE session_id=%s", (session_id,)
        ).fetchone()
    assert row is not None
    return str(row[0])


async def _connected(bus: toolbus.Client) -> bool:
    return bus.connected


@asynccontextmanager
async def _nodes(folder: Path, url: str, names: str) -> AsyncIterator[list[DrillNode]]:
    nodes = [DrillNode(folder, url, name, GRACE) for name in names]
    try:
        for node in nodes:
            await node.start()
        yield nodes
    finally:
        for node in nodes:
            if node.proc is not None:
                await node.stop()


async def test_n6_calls_pending_approval_move_to_another_node_when_theirs_drains(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6, A3, A5, A6, I15: four sessions through HAProxy over nodes a and b, each
    with a call waiting for approval. Node a drains (SIGTERM) and exits at once, without
    waiting out its grace; b adopts a's waiting calls (its metrics count them), under
    the same approval ids. Decided on b, the allowed call runs once there and the
    denied one completes declined; each client saw one ``tool_start``, one
    ``tool.resolved`` (reason ``user``) and one terminal event per call."""
    folder = {"dir": str(tmp_path)}
    async with (
        _nodes(tmp_path, pg_url, "ab") as (a, b),
        haproxy(tmp_path, [(a.name, a.address), (b.name, b.address)]) as front,
        AsyncExitStack() as stack,
    ):
        seen = [Seen() for _ in range(4)]
        starts: list[collections.Counter[str]] = [collections.Counter() for _ in seen]

        def watch(i: int) -> Any:
            def on_message(msg: Any) -> None:
                seen[i](msg)
                if isinstance(msg, m.ToolStart):
                    starts[i][msg.approval_id or ""] += 1

            return on_message

        buses = []
        for i in range(4):
            bus = toolbus.connect(
                front,
                token="alice-token",
                profile="demo",
                request_timeout=WAIT,
                on_message=watch(i),
                confirm_tool_calls=True,
                backoff=toolbus.Backoff(initial=0.05, cap=0.5),
            )
            buses.append(await stack.enter_async_context(bus))
        asks = [
            asyncio.create_task(bus.invoke("count_call", folder, call_id=f"ask{i}"))
            for i, bus in enumerate(buses)
        ]

        async def all_pending() -> bool:
            return all(len(bus.pending_approvals) == 1 for bus in buses)

        await _until(all_pending, "four approvals")
        approval_ids = [bus.pending_approvals[0].approval_id for bus in buses]
        assert a.proc is not None
        prefix = a.node_prefix
        on_a = [
            i
            for i, bus in enumerate(buses)
            if _owner(pg_url, str(bus.session_id)).startswith(prefix)
        ]
        assert len(on_a) == 2  # round robin
        a.proc.terminate()
        assert await asyncio.wait_for(a.proc.wait(), EXIT) == 0

        async def adopted() -> bool:
            return await asyncio.to_thread(_handoffs, b, "adopted") == len(on_a)

        await _until(adopted, "node b adopted node a's two waiting calls")
        denied = on_a[1]
        for i, bus in enumerate(buses):
            await _until(lambda bus=bus: _connected(bus), f"client {i} connected")
            assert [p.approval_id for p in bus.pending_approvals] == [approval_ids[i]]
            decision = m.Decision.DENY if i == denied else m.Decision.ALLOW
            await bus.pending_approvals[0].decide(decision)
        answers = await asyncio.wait_for(asyncio.gather(*asks), WAIT)
        for bus in buses:
            await bus.jobs(timeout=WAIT)  # a round trip: every event before it arrived
        a.proc = None  # exited; nothing to stop
    for i, answer in enumerate(answers):
        assert isinstance(answer, m.Result), answer
        assert bool(answer.declined) is (i == denied), answer
    assert runs(tmp_path) == collections.Counter(f"ask{i}" for i in range(4) if i != denied)
    for i in range(4):
        assert starts[i] == collections.Counter({approval_ids[i]: 1})
        resolved = seen[i].resolved[f"ask{i}"]
        assert [(r.approval_id, r.reason) for r in resolved] == [
            (approval_ids[i], m.ResolutionReason.USER)
        ]
        assert seen[i].gaps() == 0
        assert seen[i].duplicates() == 0


async def test_n6_a_call_pending_approval_survives_a_restart_of_the_only_node(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6, S4, A4: one node on PostgreSQL, a call waiting for approval; the node
    drains and starts again. The call is handed off at the drain and adopted by the
    next start (the same approval id, pending again), so the client, resumed, allows
    it and it runs once: nothing is cancelled by the restart."""
    folder = {"dir": str(tmp_path)}
    async with _nodes(tmp_path, pg_url, "a") as (a,), AsyncExitStack() as stack:
        seen = Seen()
        bus = await stack.enter_async_context(_client(f"ws://{a.address}/", seen))
        ask = asyncio.create_task(bus.invoke("count_call", folder, call_id="ask"))

        async def pending() -> bool:
            return len(bus.pending_approvals) == 1

        await _until(pending, "the approval")
        approval_id = bus.pending_approvals[0].approval_id
        assert a.proc is not None
        a.proc.terminate()
        assert await asyncio.wait_for(a.proc.wait(), EXIT) == 0
        await a.start()

        async def resumed() -> bool:
            return bus.connected and bus.reconnects >= 1

        await _until(resumed, "the client resumed on the restarted node")
        assert await asyncio.to_thread(_handoffs, a, "adopted") == 1
        assert [p.approval_id for p in bus.pending_approvals] == [approval_id]
        await bus.pending_approvals[0].decide(m.Decision.ALLOW)
        answer = await asyncio.wait_for(ask, WAIT)
        await bus.jobs(timeout=WAIT)
    assert isinstance(answer, m.Result)
    assert answer.result == {"summary": "ask"}
    assert runs(tmp_path) == collections.Counter({"ask": 1})
    assert [r.reason for r in seen.resolved["ask"]] == [m.ResolutionReason.USER]
    assert seen.gaps() == 0
    assert seen.duplicates() == 0


async def test_n6_a_call_pending_approval_on_a_drained_node_moves_to_its_sessions_node(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6, A4, J6: two in-process nodes on one schema. A call waits for approval
    on A; its session resumed on B. A drains: the call is handed off, and B (which
    claims A's work) adopts it, pending under the same approval id; B's client then
    allows it and the tool runs once. Before, A's hand-off note was fenced (B holds the
    session), so B ended the call ``cancelled`` "the server restarted while this call
    ran" (it never ran) with its approval ``disconnected``."""
    ld.thread_tools.reset()
    async with ld.two_nodes(tmp_path, pg_url, Clock()) as (a, b):
        fields, start = await ld._on_a(a, "tool_start", "c1")
        approval_id = start["approval_id"]
        async with peer(b, **fields) as on_b:
            await on_b.expect("tool_start", call_id="c1")
            await a.drain()
            await until(lambda: approval_id in b.approvals.pending, "B's adoption")
            assert await ld._confirm(on_b, approval_id, "k1") == (True, None)
            resolved = await on_b.expect("tool.resolved", call_id="c1")
            assert (resolved["resolution"], resolved["reason"]) == ("allowed", "user")
            assert (await on_b.terminal("c1"))["type"] == "result"
        assert ld.RUNS == ["c1"]
