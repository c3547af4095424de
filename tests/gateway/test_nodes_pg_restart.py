"""Drill (c) of issue 10 (SPEC N7, N4, D6): PostgreSQL restarts under two live nodes.

The test starts a throwaway PostgreSQL cluster of its own (``initdb`` on a free port),
two real ``toolbus serve`` nodes on it (node b gets the database back last), and raw
websockets and :class:`toolbus.Client` clients making calls and running jobs. It stops
the cluster for longer than ``nodes.lease_ttl`` (``pg_ctl stop -m fast``; then
``-m immediate``, a crash: no shutdown checkpoint, nodes with ``synchronous_commit`` on),
while the held jobs' handlers return, and starts it again.
It checks: new calls are refused the typed ``unavailable`` while it is down and nothing of
what could not be stored reaches a client; both node processes live through it (same
PIDs, their lease rows kept: nobody claimed anybody); every frame each client received
is, byte for byte, the stored event of that ``seq``; each session's events arrive once,
gap-free, across a resume on the other node.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.context import ToolContext
from tests.gateway.node_tools import START, TOOLS_YAML, Node, completed, node_config, runs, until
from tests.support import WAIT, spawn_serve
from toolbus import Client
from toolbus.errors import RequestRefused
from toolbus.handles import JobHandle

TTL = 3.0
"""``nodes.lease_ttl`` of the drill's nodes (``lease_interval`` 0.2 s): room for node b
to come back after node a within one TTL on a loaded machine."""

OUTAGE = TTL + 1.0
"""Seconds the database stays down: longer than a lease, so every lease expires."""

UNAVAILABLE = {
    "type": "error",
    "code": "unavailable",
    "message": "the store cannot be read right now; try again later",
}

NO_COMMIT = "the store cannot commit right now; try again later"
"""The message while the store's commits still fail (``store.unavailable_after``)."""

TOOLS = (
    TOOLS_YAML
    + """
  - name: echo
    description: Answers at once.
    capability: t.nodes
    handler: tests.gateway.test_nodes_pg_restart:echo
    parameters: {type: object, additionalProperties: false}
"""
)


def echo(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """A sync tool: ``{"summary": "<call_id> echoed"}``."""
    return {"summary": f"{ctx.call_id} echoed"}


def _bin(tool: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{tool}")) or [shutil.which(tool) or ""]
    assert found[-1], f"PostgreSQL's {tool} is not installed: this drill needs its own cluster"
    return found[-1]


class Cluster:
    """A throwaway PostgreSQL cluster on a free port, run as ``postgres`` when the test
    runs as root (``initdb`` refuses root)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tb-pg-"))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.dir, "postgres")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._pg("initdb", "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres")

    def _pg(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            [*self._as, _bin(tool), *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{tool} {args}: {done.stdout}{done.stderr}"

    def start(self) -> None:
        """``pg_ctl start``, waiting until it accepts connections."""
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        data, log = str(self.dir / "data"), str(self.dir / "log")
        self._pg("pg_ctl", "-D", data, "-l", log, "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str) -> None:
        """``pg_ctl stop -m MODE`` (``fast``: connections ended, a clean shutdown;
        ``immediate``: no checkpoint, recovery at the next start, as after a crash)."""
        self._pg("pg_ctl", "-D", str(self.dir / "data"), "-m", mode, "-w", "-t", "60", "stop")

    def remove(self) -> None:
        subprocess.run(
            [*self._as, _bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


class Raw:
    """A raw websockets client that reads every frame as it comes (into :attr:`frames`)."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.welcome: dict[str, Any] = {}
        self._arrived = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None

    async def open(self, url: str, **hello: Any) -> dict[str, Any]:
        self._ws = await connect(url, subprotocols=["toolbus.v1"])  # type: ignore[list-item]
        self._reader = asyncio.create_task(self._read(self._ws))
        await self.send({"type": "hello", "token": "alice-token", "profile": "demo", **hello})
        first = await self.wait(lambda m: m["type"] in ("welcome", "error"), "welcome")
        if first["type"] == "welcome":
            self.welcome = first
        return first

    async def _read(self, ws: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):  # its code stays in ws.close_code
            async for raw in ws:
                self.frames.append(orjson.loads(raw))
                self._arrived.set()

    async def send(self, message: dict[str, Any]) -> None:
        assert self._ws is not None
        await self._ws.send(orjson.dumps(message).decode())

    async def wait(self, match: Any, what: str) -> dict[str, Any]:
        """The first frame ``match`` accepts, waiting for it up to :data:`WAIT` s."""
        try:
            async with asyncio.timeout(WAIT):
                while True:
                    for frame in self.frames:
                        if match(frame):
                            return frame
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            raise AssertionError(f"not within {WAIT} s: {what}") from None

    async def closed(self, code: int) -> None:
        """Wait until the server closed the socket with ``code``."""
        assert self._ws is not None
        assert self._reader is not None
        async with asyncio.timeout(WAIT):
            await self._reader
        assert self._ws.close_code == code

    async def drop(self) -> None:
        """Cut the socket (no close handshake) and stop reading."""
        assert self._ws is not None
        assert self._reader is not None
        self._ws.transport.abort()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


def _answered(call_id: str) -> Any:
    return lambda m: m.get("call_id") == call_id and m["type"] in ("result", "dispatched")


def _stored(url: str, session_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True) as db:
        rows = db.execute(
            "SELECT body FROM events WHERE session_id=%s ORDER BY seq", (session_id,)
        ).fetchall()
    return [orjson.loads(body) for (body,) in rows]


def _nodes(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as db:
        return [row[0] for row in db.execute("SELECT node_id FROM nodes ORDER BY node_id")]


async def _renewals(url: str, node: str, count: int) -> None:
    """Wait until ``node`` renewed its lease ``count`` more times."""

    def lease() -> float:
        with psycopg.connect(url, autocommit=True) as db:
            row = db.execute("SELECT lease_until FROM nodes WHERE node_id=%s", (node,)).fetchone()
        return float(row[0]) if row else 0.0

    seen = {lease()}

    def renewed() -> bool:
        seen.add(lease())
        return len(seen) > count

    await until(renewed, f"{node} renews")


async def _echo(client: Client, call_id: str) -> None:
    """Call ``echo`` through ``client``; it answers ``{"summary": "<call_id> echoed"}``."""
    answer = await client.invoke("echo", call_id=call_id)
    assert not isinstance(answer, JobHandle)
    assert answer.result == {"summary": f"{call_id} echoed"}


def _sequenced(frames: list[Any]) -> list[Any]:
    return [f for f in frames if (f.get("seq") if isinstance(f, dict) else getattr(f, "seq", 0))]


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_n7_drill_postgres_restart_mid_load_keeps_nodes_and_sends_nothing_unstored(
    tmp_path: Path, mode: str
) -> None:
    """SPEC N7, N4, D6, D3, N2: PostgreSQL stops (``pg_ctl stop -m MODE``) under two nodes
    with four sessions (two raw, two :class:`toolbus.Client`), each with calls done and a
    job running; it stays down longer than ``lease_ttl``, while the jobs' handlers return.
    New calls are refused ``unavailable``; no ``job.done`` is sent while down. Node b is
    held (SIGSTOP) while the database starts, until node a served a resume and ticked
    twice: a sees b's lease expired and its lock free, the case where a live node was
    claimed. Then: the same two node processes serve, both lease rows kept past
    ``lease_ttl`` after the restart (nobody claimed anybody); each job's ``job.done``
    arrives once (one raw client's after a resume on the other node, through the inbox);
    a refused call sent again completes; every received frame is its stored event."""
    cluster = Cluster()
    # An immediate stop is a crash of the database server: what it had not flushed is
    # gone. Only with synchronous_commit on is every sent frame still stored after it
    # (the default, off, loses the last fraction of a second of commits: docs/deploy.md).
    url = cluster.url + ("?options=-csynchronous_commit%3Don" if mode == "immediate" else "")
    try:
        cluster.start()
        started: list[Node] = []
        try:
            for name in ("a", "b"):
                started.append(await _banner(await _spawn(tmp_path, url, name, TTL)))
            await _drill(tmp_path, cluster, mode, *started)
        finally:
            await _stop(started)
    finally:
        cluster.remove()


async def _spawn(
    folder: Path, url: str, name: str, ttl: float, log: Path | None = None
) -> asyncio.subprocess.Process:
    """Start node ``name`` (``lease_interval`` 0.2 s, ``lease_ttl`` ``ttl``; its log to
    ``log``); read its banner with :func:`_banner`."""
    (folder / "catalog.yaml").write_text(TOOLS)
    (folder / "profiles.yaml").write_text("profiles:\n  demo:\n    capabilities: [t.nodes]\n")
    catalog = {
        "tools": [str(folder / "catalog.yaml")],
        "profiles": [str(folder / "profiles.yaml")],
        "hot_reload": False,
    }
    lease = {"node_id": name, "lease_interval": 0.2, "lease_ttl": ttl}
    config = node_config(folder, url, name, catalog=catalog, nodes=lease)
    if log is None:
        return await spawn_serve("--config", str(config))
    with log.open("wb") as sink:
        return await spawn_serve("--config", str(config), stderr=sink.fileno())


async def _banner(proc: asyncio.subprocess.Process) -> Node:
    assert proc.stdout is not None
    async with asyncio.timeout(START):
        banner = (await proc.stdout.readline()).decode()
    return Node(proc, banner.split()[3])


async def _stop(started: list[Node]) -> None:
    for node in started:
        if node.proc.returncode is None:
            node.proc.send_signal(signal.SIGCONT)
        await node.stop()


async def test_n7_drill_node_starting_right_after_a_database_restart_waits_to_judge(
    tmp_path: Path,
) -> None:
    """SPEC N7, N4: node a runs; PostgreSQL restarts while a is held (SIGSTOP), so a's
    lease lock is free when node c starts right after the restart. c does not take a for
    dead: it waits until the database has been up ``lease_ttl`` (its log says so), a
    renews meanwhile, and c joins as a second node. Both serve; both rows are kept."""
    ttl = 10.0  # longer than a node's start-up on a loaded machine
    cluster = Cluster()
    started: list[Node] = []
    try:
        cluster.start()
        started.append(await _banner(await _spawn(tmp_path, cluster.url, "a", ttl)))
        a = started[0]
        a.proc.send_signal(signal.SIGSTOP)
        await asyncio.to_thread(cluster.stop, "fast")
        await asyncio.to_thread(cluster.start)
        log = tmp_path / "c.log"
        proc = await _spawn(tmp_path, cluster.url, "c", ttl, log)
        waiting = "the database started less than nodes.lease_ttl ago; waiting"
        await until(lambda: waiting in log.read_text(), "c waits before judging a")
        a.proc.send_signal(signal.SIGCONT)
        await _renewals(cluster.url, "a", 1)
        started.append(await _banner(proc))
        assert "node c registered (alone=False)" in log.read_text()
        for node in started:
            async with connect(node.url, subprotocols=["toolbus.v1"]) as ws:  # type: ignore[list-item]
                await ws.send(orjson.dumps({"type": "hello", "token": "alice-token",
                                            "profile": "demo"}).decode())  # fmt: skip
                assert orjson.loads(await ws.recv())["type"] == "welcome"
        assert _nodes(cluster.url) == ["a", "c"]
        assert a.proc.returncode is None
    finally:
        await _stop(started)
        cluster.remove()


async def _drill(tmp_path: Path, cluster: Cluster, mode: str, a: Any, b: Any) -> None:
    pids = (a.proc.pid, b.proc.pid)
    folder = {"dir": str(tmp_path)}
    raws = [Raw(), Raw()]
    await raws[0].open(b.url)  # dropped in the outage, resumed on node a
    await raws[1].open(a.url)
    got: list[list[Any]] = [[], []]
    clients = [
        Client(node.url, token="alice-token", profile="demo", on_message=seen.append,
               ack_every=1_000_000, ack_idle=3600.0, request_timeout=WAIT)
        for node, seen in ((a, got[0]), (b, got[1]))
    ]  # fmt: skip  # never acks: nothing is trimmed, every received frame stays comparable
    for client in clients:
        await client.open()
    moved, job_ids = Raw(), []
    try:
        # Load before the outage: two calls and one held job per session.
        for i, raw in enumerate(raws):
            for n in (1, 2):
                await raw.send({"type": "invoke", "call_id": f"r{i}c{n}", "tool": "echo"})
                await raw.wait(_answered(f"r{i}c{n}"), f"r{i}c{n} answered")
            await raw.send({"type": "invoke", "call_id": f"r{i}j", "tool": "gated_job",
                            "params": folder})  # fmt: skip
            job_ids.append((await raw.wait(_answered(f"r{i}j"), f"r{i}j dispatched"))["job_id"])
        handles: list[JobHandle] = []
        for i, client in enumerate(clients):
            for n in (1, 2):
                await _echo(client, f"p{i}c{n}")
            handle = await client.invoke("gated_job", folder, call_id=f"p{i}j")
            assert isinstance(handle, JobHandle)
            handles.append(handle)
        jobs = ["r0j", "r1j", "p0j", "p1j"]
        await until(lambda: sorted(runs(tmp_path)) == sorted(jobs), "the four jobs run")

        # The outage.
        down = time.monotonic()
        await asyncio.to_thread(cluster.stop, mode)
        for i, raw in enumerate(raws):
            await raw.send({"type": "invoke", "call_id": f"r{i}d", "tool": "echo"})
            refused = await raw.wait(lambda m, c=f"r{i}d": m.get("details") == {"call_id": c},
                                     f"r{i}d refused")  # fmt: skip
            assert refused == {**UNAVAILABLE, "details": {"call_id": f"r{i}d"}}
        for i, client in enumerate(clients):
            with pytest.raises(RequestRefused) as refusal:
                await client.invoke("echo", call_id=f"p{i}d")
            assert (refusal.value.code, refusal.value.message) == (
                "unavailable",
                UNAVAILABLE["message"],
            )
        for job in jobs:
            (tmp_path / f"go-{job}").touch()
        await until(lambda: sorted(completed(tmp_path)) == sorted(jobs), "the handlers return")
        sent_while_down = [len(_sequenced(r.frames)) for r in raws] + [
            len(_sequenced(g)) for g in got
        ]
        await raws[0].drop()  # resumes on node a once the database is back
        # The outage's length is the drill's parameter: longer than a lease.
        await asyncio.sleep(max(0.0, down + OUTAGE - time.monotonic()))
        assert [len(_sequenced(r.frames)) for r in raws[1:]] + [
            len(_sequenced(g)) for g in got
        ] == sent_while_down[1:]  # nothing stored, so nothing sent (SPEC D1, D6)
        # Node b gets the database back only after node a did and ticked: the order in
        # which a node claimed a live one (its lease had expired, its lock was free).
        b.proc.send_signal(signal.SIGSTOP)
        back = time.monotonic()
        await asyncio.to_thread(cluster.start)

        # Recovery: held frames go out, a refused call sent again completes.
        last = max(f["seq"] for f in _sequenced(raws[0].frames))
        resume = {
            "session_id": raws[0].welcome["session_id"],
            "resume_token": raws[0].welcome["resume_token"],
            "last_seq": last,
        }
        refused_resumes = 0
        async with asyncio.timeout(WAIT):
            while (first := await moved.open(a.url, **resume))["type"] != "welcome":
                # Node a has not reconnected yet: typed refusal, then close 1013 (SPEC D6).
                assert first in (UNAVAILABLE, {**UNAVAILABLE, "message": NO_COMMIT})
                await moved.closed(1013)
                moved, refused_resumes = Raw(), refused_resumes + 1
                await asyncio.sleep(0.05)  # a poll: the store reconnects on a thread
        assert first["resumed"] is True
        await _renewals(cluster.url, "a", 2)  # a tick runs after each (SPEC N4)
        b.proc.send_signal(signal.SIGCONT)
        await _renewals(cluster.url, "b", 1)  # its row was kept: nobody claimed it
        for raw, i in ((moved, 0), (raws[1], 1)):  # r0j's job.done: fenced on b, inbox, a
            await raw.wait(lambda m, j=job_ids[i]: m["type"] == "job.done" and m["job_id"] == j,
                           f"r{i}j done")  # fmt: skip
            await raw.send({"type": "invoke", "call_id": f"r{i}d", "tool": "echo"})
            assert (await raw.wait(_answered(f"r{i}d"), f"r{i}d answered"))["result"] == {
                "summary": f"r{i}d echoed"
            }
        for i, (client, handle) in enumerate(zip(clients, handles, strict=True)):
            assert (await handle.result(timeout=WAIT)).state == "done"
            await _echo(client, f"p{i}d")
        # No claims: past lease_ttl after the nodes' reconnection, plus a tick, both live.
        await asyncio.sleep(max(0.0, back + TTL + 1.0 - time.monotonic()))
        assert _nodes(cluster.url) == ["a", "b"]
        assert (a.proc.returncode, b.proc.returncode) == (None, None)
        assert (a.proc.pid, b.proc.pid) == pids
        for i, client in enumerate(clients):  # served still, by the same processes
            await _echo(client, f"p{i}e")
            await client.grants()  # a reply leaves after every event before it (D1)
        await raws[1].send({"type": "grants.list", "id": "barrier"})
        await moved.send({"type": "grants.list", "id": "barrier"})
        for raw in (raws[1], moved):
            await raw.wait(lambda m: m.get("id") == "barrier", "barrier")

        # Every received frame is the stored event of its seq; each arrived once.
        sessions = [
            (raws[0].welcome["session_id"], _sequenced(raws[0].frames) + _sequenced(moved.frames)),
            (raws[1].welcome["session_id"], _sequenced(raws[1].frames)),
        ]
        for session_id, frames in sessions:
            assert frames == _stored(cluster.url, session_id)
        for client, frames in zip(clients, got, strict=True):
            assert client.session_id is not None
            received = [(f.seq, f.type) for f in _sequenced(frames)]
            stored = [(e["seq"], e["type"]) for e in _stored(cluster.url, client.session_id)]
            assert received == stored
        for _, frames in sessions:
            kinds = [f["type"] for f in frames]
            assert (kinds.count("job.done"), kinds.count("result")) == (1, 3), kinds
        print(
            f"{mode}: down {back - down:.1f} s; nodes {pids} kept; resume refused "
            f"{refused_resumes}x before the store was back; "
            f"events per session {[len(f) for _, f in sessions]} raw, "
            f"{[len(_sequenced(g)) for g in got]} toolbus.Client"
        )
    finally:
        for client in clients:
            await client.close()
        for raw in (raws[1], moved):
            await raw.close()
