"""Nodes on one PostgreSQL store behind a real nginx, round robin, no stickiness, passive
health checks only (SPEC N6, N2, S4): calls and jobs work through it, a reconnect lands on
the other node and resumes there, and a drained node's clients move to the other node
through it with nothing lost. The configuration is the one docs/deploy.md shows
(:func:`tests.gateway.lb_tools.nginx_config`); nginx must be installed
(``scripts/ensure-nginx``): without it these tests fail, naming that script."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

import toolbus
from tests.gateway.drill_tools import Seen
from tests.gateway.lb_tools import nginx, nginx_binary
from tests.gateway.test_nodes_ops_haproxy import SUB, Node, _client, _convert, _owner, _report
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import CONVERT, WAIT, Peer, resume_fields

CLIENTS = 4
"""Clients of the drain test: round robin puts two on each node."""


@asynccontextmanager
async def _gateway(folder: Path, url: str, *names: str) -> AsyncIterator[tuple[list[Node], str]]:
    """Nodes ``names`` on the store ``url`` (one after the other), nginx in front: the
    nodes and nginx's URL. Fails at once, naming scripts/ensure-nginx, without nginx."""
    nginx_binary()
    nodes = [Node(folder, url, name) for name in names]
    try:
        for node in nodes:
            await node.start()
        async with nginx(folder, [(n.name, n.address) for n in nodes]) as front:
            yield nodes, front
    finally:
        for node in nodes:
            if node.proc is not None:
                await node.stop()


def _on(nodes: list[Node], url: str, session_id: str) -> Node:
    """The node that holds ``session_id`` now."""
    owner = _owner(url, session_id)
    (on,) = [n for n in nodes if owner.startswith(n.node_prefix)]
    return on


async def test_n6_n2_nginx_two_nodes_calls_jobs_and_a_resume_on_the_other_node(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6, N2: through nginx a client of ``toolbus.connect`` calls and runs a job; a
    socket's session, resumed on the next connection (round robin: the other node), is
    taken over there, replays nothing missed and serves calls."""
    async with _gateway(tmp_path, pg_url, "a", "b") as (nodes, front):
        async with _client(front) as bus:
            await _convert(bus)
            await _report(bus)
        async with connect(front, subprotocols=SUB) as ws:
            first = Peer(ws)
            await first.hello()
            await first.invoke("c1", "convert_units", CONVERT)
            assert (await first.terminal("c1"))["result"]["result"] == 100.0
            session = first.welcome["session_id"]
            before = _on(nodes, pg_url, session)
        seen = max(msg["seq"] for msg in first.seen if "seq" in msg)
        async with connect(front, subprotocols=SUB) as ws:
            second = Peer(ws)
            welcome = await second.hello(**resume_fields(first, seen))
            assert (welcome["resumed"], welcome["last_seq"]) == (True, seen)
            assert _on(nodes, pg_url, session) is not before
            await second.invoke("c2", "convert_units", CONVERT)
            assert (await second.terminal("c2"))["result"]["result"] == 100.0


async def test_n6_n2_s4_nginx_drained_nodes_clients_resume_on_the_other_node(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6, N2, S4: 4 clients of ``toolbus.connect`` through nginx (round robin: 2 on
    each node) call a tool and start a job (``report``, 1.5 s); the node holding the
    first client's session is drained (SIGTERM, exit 0). Its 2 clients reconnect through
    nginx, which finds the drained node's port closed (its error log says so) and passes
    them to the other node (``proxy_next_upstream error``): each resumes there as the
    same session (``welcome.resumed``), every job ends ``done``, every call is answered,
    and no client lost an event or saw one twice (``seq`` gaps and duplicates: 0). The
    other 2 clients are not disturbed (0 reconnects)."""
    async with _gateway(tmp_path, pg_url, "a", "b") as (nodes, front):
        seen = [Seen() for _ in range(CLIENTS)]
        buses = [_client(front, on_message=s) for s in seen]
        try:
            for bus in buses:
                await bus.open()
                await _convert(bus)
            sessions = [str(bus.session_id) for bus in buses]
            homes = [_on(nodes, pg_url, session) for session in sessions]
            assert sorted(homes.count(n) for n in nodes) == [2, 2]
            drained = homes[0]
            moved = [i for i, home in enumerate(homes) if home is drained]
            handles: list[Any] = []
            for bus in buses:
                handle = await bus.invoke("report", {"topic": "nginx"}, timeout=WAIT)
                assert isinstance(handle, toolbus.JobHandle)
                handles.append(handle)
            assert await drained.stop() == 0
            outcomes = await asyncio.gather(*(h.result(timeout=3 * WAIT) for h in handles))
            assert [o.ok for o in outcomes] == [True] * CLIENTS
            for bus in buses:
                await _convert(bus)
                await _report(bus)
            assert [str(bus.session_id) for bus in buses] == sessions
            expected = [1 if i in moved else 0 for i in range(CLIENTS)]
            assert [bus.reconnects for bus in buses] == expected
            for i in moved:
                welcome = buses[i].welcome
                assert welcome is not None
                assert welcome.resumed is True
            (live,) = [n for n in nodes if n is not drained]
            assert [_on(nodes, pg_url, s) for s in sessions] == [live] * CLIENTS
            assert [(s.gaps(), s.duplicates()) for s in seen] == [(0, 0)] * CLIENTS
        finally:
            for bus in buses:
                await bus.close()
    log = (tmp_path / "nginx-error.log").read_text()
    assert "connect() failed (111: Connection refused) while connecting to upstream" in log
    assert f'upstream: "http://{drained.address}/"' in log
