"""``toolbus serve --workers N`` (SPEC N6, N1, S4, O5): N real worker processes on one
port (``SO_REUSEPORT``) and one PostgreSQL store, supervised by the parent, which passes
SIGTERM on (every worker drains), starts again a worker killed with ``kill -9``, and whose
own death makes the workers drain."""

from __future__ import annotations

import asyncio
import os
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

from gateway.config import DEMO_DIR
from tests.gateway.node_tools import START, until
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import (
    CONVERT,
    WAIT,
    Peer,
    clean_env,
    closed,
    run_toolbus,
    spawn_serve,
    toolbus_argv,
    write_token_file,
)

SUB: Any = ["toolbus.v1"]
DRAIN_HINT = {"type": "reconnect", "reason": "server restart", "retry_after": 1.0}
NODES = {"lease_interval": 0.2, "lease_ttl": 1.0}
"""Short leases, ids generated (``host-pid-random``: the test reads each worker's pid)."""


def _live_pids(url: str) -> set[int]:
    """The pids of the nodes registered in the store whose process is alive."""
    with psycopg.connect(url, autocommit=True) as db:
        ids = [row[0] for row in db.execute("SELECT node_id FROM nodes").fetchall()]
    host = socket.gethostname()
    pids = {int(node.removeprefix(host + "-").split("-")[0]) for node in ids}
    return {pid for pid in pids if _alive(pid)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _owners(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as db:
        rows = db.execute("SELECT DISTINCT owner_node FROM sessions").fetchall()
    return {row[0] for row in rows}


def _config(folder: Path, url: str) -> Path:
    """Port 0, the demo catalog, the test tokens, the store ``url``, short leases."""
    config = {
        "data_dir": str(folder / "data"),
        "server": {"port": 0, "heartbeat_interval": 0},
        "auth": {"token_file": str(write_token_file(folder))},
        "catalog": {
            "tools": [str(DEMO_DIR / "tools.yaml")],
            "profiles": [str(DEMO_DIR / "profiles.yaml")],
            "hot_reload": False,
        },
        "store": {"url": url},
        "nodes": NODES,
    }
    path = folder / "toolbus.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@asynccontextmanager
async def _workers(
    folder: Path, url: str, count: int
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``toolbus serve --workers count`` on the store ``url``: the parent and its URL."""
    proc = await spawn_serve("--config", str(_config(folder, url)), "--workers", str(count))
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(count * START):
            banner = (await proc.stdout.readline()).decode()
        assert banner.endswith(f"(subprotocol toolbus.v1, {count} workers)\n"), banner
        yield proc, banner.split()[3]
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT):
            await proc.wait()


def test_n6_workers_refused_on_sqlite(tmp_path: Path) -> None:
    """SPEC N6, O5: ``--workers`` on the embedded SQLite store is one line and exit 1."""
    done = run_toolbus(
        "serve",
        "--workers",
        "2",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "data"),
        cwd=tmp_path,
        env=clean_env(),
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        "toolbus: cannot start: --workers 2: the workers need a shared store (store.url: "
        "postgresql://...); the embedded SQLite store serves one process\n"
    )


def test_n6_workers_zero_is_a_usage_error(tmp_path: Path) -> None:
    done = run_toolbus("serve", "--workers", "0", cwd=tmp_path, env=clean_env())
    assert done.returncode == 2
    assert done.stderr.endswith("argument --workers: must be 1 or more, not 0\n")


async def test_n6_workers_share_the_port_and_drain_on_sigterm(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6, S4: two workers listen on one port; 16 sockets reach both (sessions owned
    by two nodes); SIGTERM to the parent drains every socket (the hint, then 1012) and the
    parent exits 0 once both workers ended."""
    async with _workers(tmp_path, pg_url, 2) as (proc, url):
        pids = _live_pids(pg_url)
        assert len(pids) == 2
        peers: list[Peer] = []
        async with asyncio.timeout(WAIT):
            for _ in range(16):
                peer = Peer(await connect(url, subprotocols=SUB))
                await peer.hello()
                peers.append(peer)
        assert len(_owners(pg_url)) == 2
        out = await _call(peers[0])
        assert out["result"]["result"] == 100.0
        proc.send_signal(signal.SIGTERM)
        for peer in peers:
            assert await peer.expect("reconnect") == DRAIN_HINT
            gone = await closed(peer)
            assert gone.rcvd is not None
            assert (gone.rcvd.code, gone.rcvd.reason) == (1012, "server restart")
        async with asyncio.timeout(WAIT):
            assert await proc.wait() == 0
        assert not any(_alive(pid) for pid in pids)


async def _call(peer: Peer) -> dict[str, Any]:
    await peer.invoke("c-probe", "convert_units", CONVERT)
    return await peer.terminal("c-probe")


async def test_n6_a_killed_worker_is_started_again(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6, N4: ``kill -9`` of a worker: the parent starts a new one (a new node),
    the port keeps serving meanwhile, and SIGTERM still ends everything with exit 0."""
    async with _workers(tmp_path, pg_url, 2) as (proc, url):
        before = _live_pids(pg_url)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        await until(lambda: not _alive(victim), "the killed worker reaped")
        await until(lambda: len(_live_pids(pg_url) - before) == 1, "a new worker registered")
        assert proc.returncode is None
        async with connect(url, subprotocols=SUB) as ws:
            peer = Peer(ws)
            await peer.hello()
            assert (await _call(peer))["result"]["result"] == 100.0
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT):
            assert await proc.wait() == 0


async def test_n6_workers_drain_when_their_parent_dies(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6, S4: ``kill -9`` of the parent: each worker gets SIGTERM from the kernel
    (``PR_SET_PDEATHSIG``) and drains its sockets, then ends."""
    async with _workers(tmp_path, pg_url, 2) as (proc, url):
        pids = _live_pids(pg_url)
        peer = Peer(await connect(url, subprotocols=SUB))
        await peer.hello()
        proc.kill()
        assert await peer.expect("reconnect") == DRAIN_HINT
        gone = await closed(peer)
        assert gone.rcvd is not None
        assert gone.rcvd.code == 1012
        await until(lambda: not any(_alive(pid) for pid in pids), "both workers ended")


def test_n6_workers_port_in_use_is_one_line(tmp_path: Path) -> None:
    """SPEC O5: a port another process holds refuses ``--workers`` like a plain serve."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = clean_env() | {"TOOLBUS_STORE__URL": "postgresql://127.0.0.1/test"}
        done = subprocess.run(
            [
                *toolbus_argv("serve"),
                "--workers",
                "2",
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
        )
    assert done.returncode == 1
    assert done.stderr.endswith(
        f"toolbus: cannot start: server.port {port}: cannot listen on 127.0.0.1:{port}: "
        "address already in use\n"
    )


def test_n6_a_worker_that_cannot_start_ends_serve_with_its_one_line(tmp_path: Path) -> None:
    """SPEC O5, N6: the first worker cannot reach the store: its one ``cannot start``
    line is all stderr holds, no other worker is started, and the exit status is 1."""
    env = clean_env() | {"TOOLBUS_STORE__URL": "postgresql://127.0.0.1:1/test"}
    done = run_toolbus(
        "serve",
        "--workers",
        "2",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "data"),
        cwd=tmp_path,
        env=env,
    )
    assert (done.returncode, done.stdout) == (1, "")
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "toolbus: cannot start: store dbname=test host=127.0.0.1 port=1: cannot connect: "
    )
