"""A test catalog for fair share and truthful job states (SPEC E3, J6; cases F22, F23,
F29-F31, F33), and a real ``toolbus serve`` in a subprocess for the cases that need
signals, a kill or the log stream.

Plain handlers block on :class:`threading.Event` s the test controls and count their
starts in :data:`STATE`, so no test sleeps to order events. The handlers that run in a
server subprocess (``stall``, ``effect_job``, ``once_job``) leave their traces in the
server's log or in files under the data folder instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from gateway.context import ToolContext
from gateway.server import Gateway
from tests.support import ROOT, WAIT, Peer, running, settings_for, spawn_serve, write_token_file

TOOLS_YAML = """
tools:
  - name: stuck
    description: A plain handler that holds its thread until released; short timeout.
    capability: fair
    timeout: 0.1
    handler: tests.gateway.fair_tools:stuck
  - name: quick
    description: A plain handler that answers at once.
    capability: fair
    handler: tests.gateway.fair_tools:quick
  - name: held_job
    description: A plain job handler that holds its thread until released.
    capability: fair
    mode: async
    handler: tests.gateway.fair_tools:held_job
  - name: quick_job
    description: A plain job handler that answers at once.
    capability: fair
    mode: async
    handler: tests.gateway.fair_tools:quick
  - name: stall
    description: An async def handler that blocks the event loop with time.sleep.
    capability: fair
    timeout: 0
    handler: tests.gateway.fair_tools:stall
    parameters: {type: object, properties: {seconds: {type: number}}, required: [seconds]}
  - name: effect_job
    description: A plain job handler that sleeps, then writes a file (a side effect).
    capability: fair
    mode: async
    handler: tests.gateway.fair_tools:effect_job
    parameters: {type: object, properties: {seconds: {type: number}}, required: [seconds]}
  - name: once_job
    description: A plain job handler that must not run twice; holds when asked.
    capability: fair
    mode: async
    handler: tests.gateway.fair_tools:once_job
    parameters:
      type: object
      properties: {n: {type: integer}, hold: {type: boolean}}
      required: [n, hold]
"""
PROFILES_YAML = "profiles:\n  demo:\n    capabilities: [fair]\n"


@dataclass
class State:
    """What the in-process handlers did; reset by :func:`serve`."""

    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: dict[str, int] = field(default_factory=dict)
    returned: dict[str, int] = field(default_factory=dict)
    quick: int = 0


STATE = State()


def _count(table: dict[str, int], tool: str) -> None:
    with STATE.lock:
        table[tool] = table.get(tool, 0) + 1


def stuck(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Holds its worker thread until the test releases it, long past its timeout."""
    state = STATE
    _count(state.started, ctx.tool)
    state.release.wait(WAIT)
    _count(state.returned, ctx.tool)
    return {"late": True}


def held_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Like :func:`stuck`, as a job."""
    return stuck(params, ctx)


def quick(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    with STATE.lock:
        STATE.quick += 1
    return {"thread": threading.current_thread().name}


async def stall(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """The mistake of case F23: a blocking sleep inside ``async def``."""
    logging.getLogger("tests.stall").warning("stall begins", extra={"marker": "stall"})
    time.sleep(params["seconds"])  # noqa: ASYNC251 - the fault under test
    return {"slept": params["seconds"]}


def effect_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Case F29: reports that it runs, sleeps, then writes ``<data>/effect-<job>``."""
    ctx.progress(0.0, "started")
    time.sleep(params["seconds"])
    (ctx.data_dir / f"effect-{ctx.job_id}").write_text("written")
    return {"summary": "effect written"}


def once_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Case F31: appends its start to ``<data>/runs.log``; with ``hold`` it reports
    progress and waits (it is killed meanwhile)."""
    with (ctx.data_dir / "runs.log").open("a") as runs:
        runs.write(f"{params['n']}\n")
    if params["hold"]:
        ctx.progress(0.0, "holding")
        ctx.cancelled.wait(WAIT * 3)
    return {"summary": f"run {params['n']}"}


def write_catalog(tmp: Path) -> dict[str, Any]:
    """The ``catalog`` settings section for this catalog, written into ``tmp``."""
    tools, profiles = tmp / "fair-tools.yaml", tmp / "fair-profiles.yaml"
    tools.write_text(TOOLS_YAML)
    profiles.write_text(PROFILES_YAML)
    return {"tools": [tools], "profiles": [profiles], "hot_reload": False}


@asynccontextmanager
async def serve(tmp: Path, **sections: Any) -> AsyncIterator[Gateway]:
    """A real in-process gateway on this catalog; releases every held handler at exit."""
    global STATE
    STATE = State()
    async with running(settings_for(tmp, catalog=write_catalog(tmp), **sections)) as gw:
        try:
            yield gw
        finally:
            STATE.release.set()


async def until(check: Callable[[], bool], *changes: Callable[[], Any]) -> None:
    """Wait until ``check()`` holds, re-testing at each of ``changes`` (awaitables
    factories, e.g. ``lane.changed``); fails after WAIT."""
    async with asyncio.timeout(WAIT):
        while not check():
            waits = [asyncio.ensure_future(change()) for change in changes]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()


# -- a server subprocess ---------------------------------------------------------------


def write_config(tmp: Path, **sections: Any) -> Path:
    """A ``toolbus.yaml`` for this catalog with data in ``tmp/data``, port 0."""
    config: dict[str, Any] = {
        "data_dir": str(tmp / "data"),
        "server": {"port": 0, "heartbeat_interval": 0},
        "auth": {"token_file": str(write_token_file(tmp))},
        "catalog": {
            k: v if isinstance(v, bool) else [str(p) for p in v]
            for k, v in write_catalog(tmp).items()
        },
        "log": {"level": "INFO", "json_logs": True},
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value}
    path = tmp / "toolbus.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class ServerProcess:
    """``toolbus serve`` in a subprocess: its URL and its JSON log records (stderr)."""

    proc: asyncio.subprocess.Process
    url: str = ""
    port: int = 0
    logs: list[dict[str, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for line in self.proc.stderr:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                record = {"msg": line.decode(errors="replace").rstrip()}
            self.logs.append(record)
            self.changed.set()

    async def record(self, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first log record for which ``match`` holds, waiting for it up to WAIT."""
        async with asyncio.timeout(WAIT):
            while True:
                for found in self.logs:
                    if match(found):
                        return found
                self.changed.clear()
                await self.changed.wait()


@asynccontextmanager
async def server_process(config: Path) -> AsyncIterator[ServerProcess]:
    """Run ``python -m gateway.cli serve --config CONFIG`` until the block ends (then
    kill it if it still runs)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await spawn_serve("--config", str(config), env=env, stderr=asyncio.subprocess.PIPE)
    server = ServerProcess(proc)
    reader = asyncio.ensure_future(server._read())
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(WAIT * 3):
            while not server.url:
                line = (await proc.stdout.readline()).decode()
                assert line, f"the server exited: {server.logs}"
                for word in line.split():
                    if word.startswith("ws://"):
                        server.url = word
        server.port = int(server.url.rstrip("/").rsplit(":", 1)[1])
        yield server
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        reader.cancel()


async def seen_or_next(p: Peer, type_: str, **fields: Any) -> dict[str, Any]:
    """The first message of ``type_`` with these fields, already received or still to
    come (:meth:`Peer.expect` only looks ahead)."""
    for message in p.seen:
        if message["type"] == type_ and all(message.get(k) == v for k, v in fields.items()):
            return message
    return await p.expect(type_, **fields)


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    """One plain HTTP/1.1 GET to 127.0.0.1: (status, body)."""
    async with asyncio.timeout(WAIT):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            await writer.drain()
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            length = next(
                int(line.split(":", 1)[1])
                for line in head
                if line.lower().startswith("content-length")
            )
            body = await reader.readexactly(length)
        finally:
            writer.close()
    return int(head[0].split(" ")[1]), body
