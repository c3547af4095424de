"""Nodes on one PostgreSQL store behind a real HAProxy, round robin, no stickiness (SPEC
N6, N2, S4): calls and jobs work through it, a reconnect lands on the other node and
resumes there, a drained node's clients move to the other one, and a rolling restart
of every node, under clients calling without pause, shows them no failure."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import yaml
from websockets.asyncio.client import connect

import toolbus
from gateway.config import DEMO_DIR
from protocol import messages as m
from tests.gateway.drill_tools import start_on_a_port
from tests.gateway.lb_tools import (
    free_port,
    haproxy,
    haproxy_binary,
    haproxy_config,
    nginx_check,
    nginx_config,
)
from tests.gateway.node_tools import START, until
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import CONVERT, ROOT, WAIT, Peer, resume_fields, write_token_file

SUB: Any = ["toolbus.v1"]


class Node:
    """One ``toolbus serve`` on a fixed port (HAProxy names it), restartable."""

    def __init__(self, folder: Path, url: str, name: str, **server: Any) -> None:
        self.name = name
        self.folder = folder
        self.port = free_port()
        self.config = folder / f"{name}.yaml"
        config = {
            "data_dir": str(folder / f"data-{name}"),
            "server": {"port": self.port, "heartbeat_interval": 0, **server},
            "auth": {"token_file": str(write_token_file(folder))},
            "catalog": {
                "tools": [str(DEMO_DIR / "tools.yaml")],
                "profiles": [str(DEMO_DIR / "profiles.yaml")],
                "hot_reload": False,
            },
            "store": {"url": url},
            "nodes": {"lease_interval": 0.2, "lease_ttl": 1.0},
            # Clients here call without pause: the invoke rate limit is not under test.
            "limits": {"invoke_rate": 1e6, "invoke_burst": 1_000_000},
        }
        self._settings = config
        self.config.write_text(yaml.safe_dump(config))
        self.proc: asyncio.subprocess.Process | None = None
        self.started = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Start it and wait for its banner; at the first start a port another process
        took meanwhile is replaced (:func:`tests.gateway.drill_tools.start_on_a_port`)."""
        self.proc, self.port = await start_on_a_port(self, START)
        self.started = True

    @property
    def node_prefix(self) -> str:
        """The start of this process's generated node id (``host-pid-``)."""
        assert self.proc is not None
        return f"{socket.gethostname()}-{self.proc.pid}-"

    async def stop(self) -> int:
        """SIGTERM (a drain, SPEC S4) and wait for the exit status."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT):
            return await self.proc.wait()


@asynccontextmanager
async def _gateway(folder: Path, url: str, *names: str) -> AsyncIterator[tuple[list[Node], str]]:
    """Nodes ``names`` on the store ``url`` (one after the other), HAProxy in front: the
    nodes and HAProxy's URL."""
    nodes = [Node(folder, url, name) for name in names]
    try:
        for node in nodes:
            await node.start()
        async with haproxy(folder, [(n.name, n.address) for n in nodes]) as front:
            yield nodes, front
    finally:
        for node in nodes:
            if node.proc is not None:
                await node.stop()


def _owner(url: str, session_id: str) -> str:
    with psycopg.connect(url, autocommit=True) as db:
        row = db.execute(
            "SELECT owner_node FROM sessions WHERE session_id=%s", (session_id,)
        ).fetchone()
    assert row is not None
    return str(row[0])


def _client(url: str, **options: Any) -> toolbus.Client:
    return toolbus.connect(
        url, token="alice-token", profile="demo", request_timeout=WAIT, **options
    )


async def _convert(bus: toolbus.Client) -> None:
    out = await bus.invoke("convert_units", CONVERT, timeout=WAIT)
    assert isinstance(out, m.Result)
    assert out.result["result"] == 100.0


async def _report(bus: toolbus.Client) -> None:
    handle = await bus.invoke("report", {"topic": "lb", "sections": 1}, timeout=WAIT)
    assert isinstance(handle, toolbus.JobHandle)
    outcome = await handle.result(timeout=3 * WAIT)
    assert outcome.ok, outcome


def test_n6_docs_show_the_tested_haproxy_and_nginx_configs(tmp_path: Path) -> None:
    """SPEC N6: docs/deploy.md shows exactly the HAProxy and nginx configurations the
    tests run (test_nodes_ops_haproxy.py, test_nodes_ops_nginx.py), and HAProxy accepts
    its own (``haproxy -c``), nginx its own (``nginx -t``, inside an ``http`` block)."""
    servers = [("node1", "10.0.0.11:8765"), ("node2", "10.0.0.12:8765")]
    doc = (ROOT / "docs" / "deploy.md").read_text()
    shown = nginx_config("8080", servers)
    assert f"```nginx\n{shown}```" in doc
    nginx_checked = nginx_check(tmp_path, shown)
    assert nginx_checked.returncode == 0, nginx_checked.stderr
    assert "test is successful" in nginx_checked.stderr
    text = haproxy_config(":8080", servers)
    assert text in doc
    checked = subprocess.run(
        [haproxy_binary(), "-c", "-f", "/dev/stdin"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr
    assert "Configuration file is valid" in checked.stdout


async def test_n6_haproxy_two_nodes_calls_jobs_and_a_resume_on_the_other_node(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6, N2: through HAProxy a client calls and runs a job; a socket's session,
    resumed on the next connection (round robin: the other node), is taken over there
    (its owner changes), replays nothing missed and serves calls."""
    async with _gateway(tmp_path, pg_url, "a", "b") as (_, front):
        async with _client(front) as bus:
            await _convert(bus)
            await _report(bus)
        async with connect(front, subprotocols=SUB) as ws:
            first = Peer(ws)
            await first.hello()
            await first.invoke("c1", "convert_units", CONVERT)
            assert (await first.terminal("c1"))["result"]["result"] == 100.0
            session = first.welcome["session_id"]
            owner = _owner(pg_url, session)
        seen = max(msg["seq"] for msg in first.seen if "seq" in msg)
        async with connect(front, subprotocols=SUB) as ws:
            second = Peer(ws)
            welcome = await second.hello(**resume_fields(first, seen))
            assert (welcome["resumed"], welcome["last_seq"]) == (True, seen)
            assert _owner(pg_url, session) != owner
            await second.invoke("c2", "convert_units", CONVERT)
            assert (await second.terminal("c2"))["result"]["result"] == 100.0


async def test_n6_s4_a_drained_nodes_client_resumes_on_the_other_node(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6, S4: SIGTERM to the node a client is on: the client gets the hint,
    reconnects through HAProxy to the other node, resumes the same session and calls
    on, with no error."""
    async with _gateway(tmp_path, pg_url, "a", "b") as (nodes, front), _client(front) as bus:
        await _convert(bus)
        assert bus.session_id is not None
        session = bus.session_id
        owner = _owner(pg_url, session)
        (on,) = [n for n in nodes if owner.startswith(n.node_prefix)]
        assert await on.stop() == 0
        await _convert(bus)
        await _report(bus)
        assert (bus.session_id, bus.reconnects) == (session, 1)
        assert bus.welcome is not None
        assert bus.welcome.resumed is True
        assert not _owner(pg_url, session).startswith(on.node_prefix)


async def test_n6_rolling_restart_shows_clients_no_failure(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6: 4 clients call without pause (a job every 25th call) through HAProxy
    while each of 2 nodes in turn is drained (SIGTERM), waited for and started again,
    and taken back into the rotation; no call or job fails, every session survives."""
    async with _gateway(tmp_path, pg_url, "a", "b") as (nodes, front):
        stop = asyncio.Event()
        calls = [0] * 4

        async def caller(index: int, bus: toolbus.Client) -> None:
            while not stop.is_set():
                calls[index] += 1
                if calls[index] % 25 == 0:
                    await _report(bus)
                else:
                    await _convert(bus)

        async with (
            _client(front) as c0,
            _client(front) as c1,
            _client(front) as c2,
            _client(front) as c3,
        ):
            buses = [c0, c1, c2, c3]
            sessions = [bus.session_id for bus in buses]
            tasks = [asyncio.create_task(caller(i, bus)) for i, bus in enumerate(buses)]
            for node in nodes:
                await until(lambda: min(calls) >= 10 or any(t.done() for t in tasks), "calls")
                before = list(calls)
                assert await node.stop() == 0
                await node.start()
                await _back_in_rotation(front, pg_url, node)
                await until(lambda b=before: _progressed(calls, b, tasks), "calls after it")
            stop.set()
            await asyncio.gather(*tasks)
            assert [bus.session_id for bus in buses] == sessions
            assert sum(bus.reconnects for bus in buses) >= 4
    assert min(calls) >= 20


def _progressed(calls: list[int], before: list[int], tasks: list[asyncio.Task[None]]) -> bool:
    """Every client made 10 more calls since ``before`` (or one of them failed)."""
    ten_more = all(c >= b + 10 for c, b in zip(calls, before, strict=True))
    return ten_more or any(t.done() for t in tasks)


async def _back_in_rotation(front: str, url: str, node: Node) -> None:
    """Until a new connection through HAProxy lands on the restarted ``node`` (its
    health check passed again)."""
    async with asyncio.timeout(WAIT):
        while True:
            async with connect(front, subprotocols=SUB) as ws:
                probe = Peer(ws)
                await probe.hello()
                owner = _owner(url, probe.welcome["session_id"])
                await probe.send({"type": "bye"})
                if owner.startswith(node.node_prefix):
                    return


async def test_n6_socket_lifetime_moves_load_onto_a_node_added_later(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6: 4 clients connect while only node a runs (HAProxy knows a and b); b is
    started and taken into the rotation; with a 0.5 s socket lifetime, their sessions
    come to live on b too, and every client calls on with no error."""
    a, b = (Node(tmp_path, pg_url, name, max_socket_lifetime=0.5) for name in "ab")
    try:
        await a.start()
        async with haproxy(tmp_path, [(a.name, a.address), (b.name, b.address)]) as front:
            buses = [_client(front) for _ in range(4)]
            try:
                for bus in buses:
                    await bus.open()
                    await _convert(bus)
                await b.start()
                await _back_in_rotation(front, pg_url, b)

                def on_b() -> bool:
                    owners = [_owner(pg_url, str(bus.session_id)) for bus in buses]
                    return any(owner.startswith(b.node_prefix) for owner in owners)

                await until(on_b, "a session moved onto node b")
                for bus in buses:
                    await _convert(bus)
            finally:
                for bus in buses:
                    await bus.close()
    finally:
        for node in (a, b):
            if node.proc is not None:
                await node.stop()
