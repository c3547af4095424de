"""Tools and launchers for the tests of several nodes on one store (SPEC N2-N5).

:func:`gated` is a job handler that counts each run (a line in ``<dir>/runs``), then
waits until the test creates ``<dir>/go-<call_id>``: the test decides when a job ends,
on whichever node runs it. :class:`Nodes` starts real ``toolbus serve`` processes
sharing one PostgreSQL schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from gateway.context import ToolContext
from tests.support import MS, WAIT, spawn_serve, write_token_file

START = 60.0
"""Seconds a `toolbus serve` may take to start: imports take seconds on a loaded machine."""

HANDLER_DEADLINE = 60.0
"""Seconds :func:`gated` waits for its go file before it fails."""

TOOLS_YAML = """
tools:
  - name: gated_job
    description: Counts its run, then waits for the test's go file.
    capability: t.nodes
    mode: async
    handler: tests.gateway.node_tools:gated
    dispatch_message: Working on it.
    parameters:
      type: object
      properties:
        dir: {type: string}
      required: [dir]
      additionalProperties: false
  - name: idem_job
    description: The same, marked idempotent (SPEC J5 re-runs it after a crash).
    capability: t.nodes
    mode: async
    idempotent: true
    handler: tests.gateway.node_tools:gated
    dispatch_message: Working on it.
    parameters:
      type: object
      properties:
        dir: {type: string}
      required: [dir]
      additionalProperties: false
"""

PROFILES_YAML = """
profiles:
  demo:
    capabilities: [t.nodes]
"""


def gated(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Append the call id to ``runs``, wait for ``go-<call_id>``, note when it ended and
    append the call id to ``completed``."""
    folder = Path(params["dir"])
    with (folder / "runs").open("a") as runs:
        runs.write(ctx.call_id + "\n")
    go = folder / f"go-{ctx.call_id}"
    deadline = time.monotonic() + HANDLER_DEADLINE
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {go.name}")
        time.sleep(0.002)
    (folder / f"ended-{ctx.call_id}").write_text(repr(time.time()))
    with (folder / "completed").open("a") as completed:
        completed.write(ctx.call_id + "\n")
    return {"summary": f"{ctx.call_id} done"}


def completed(folder: Path) -> list[str]:
    """The call ids whose :func:`gated` run returned, in order."""
    path = folder / "completed"
    return path.read_text().split() if path.exists() else []


def runs(folder: Path) -> list[str]:
    """The call ids :func:`gated` started, in order (one line per run)."""
    path = folder / "runs"
    return path.read_text().split() if path.exists() else []


async def until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` every few :data:`MS` until it holds; fail after :data:`WAIT` s."""
    try:
        async with asyncio.timeout(WAIT):
            # Another process writes what is checked (a file, a row): no event to await.
            while not check():  # noqa: ASYNC110
                await asyncio.sleep(5 * MS)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT} s: {what}") from None


def node_config(folder: Path, url: str, name: str, **extra: Any) -> Path:
    """A config for node ``name``: port 0, this module's catalog, the test tokens, the
    shared store ``url``, short leases."""
    (folder / "tools.yaml").write_text(TOOLS_YAML)
    (folder / "profiles.yaml").write_text(PROFILES_YAML)
    config: dict[str, Any] = {
        "data_dir": str(folder / f"data-{name}"),
        "server": {"port": 0, "heartbeat_interval": 0},
        "auth": {"token_file": str(write_token_file(folder))},
        "catalog": {
            "tools": [str(folder / "tools.yaml")],
            "profiles": [str(folder / "profiles.yaml")],
            "hot_reload": False,
        },
        "store": {"url": url},
        "nodes": {"node_id": name, "lease_interval": 0.2, "lease_ttl": 1.0},
        **extra,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Node:
    """One running ``toolbus serve`` process and its WebSocket URL."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc = proc
        self.url = url

    async def stop(self) -> None:
        """SIGTERM (a drain) and wait for the end; a killed process is only awaited.

        Raises:
            AssertionError: it did not exit within :data:`WAIT` seconds (it is then
                killed, so that no test leaves a node behind).
        """
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(WAIT):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"node {self.url} did not drain within {WAIT} s") from None


@asynccontextmanager
async def nodes(folder: Path, url: str, *names: str, **extra: Any) -> AsyncIterator[list[Node]]:
    """Start one node per name on the shared store ``url``, one after the other (the
    first finds no live lease and recovers the store), and stop them all after."""
    started: list[Node] = []
    try:
        for name in names:
            proc = await spawn_serve("--config", str(node_config(folder, url, name, **extra)))
            assert proc.stdout is not None
            async with asyncio.timeout(START):
                banner = (await proc.stdout.readline()).decode()
            started.append(Node(proc, banner.split()[3]))
        yield started
    except BaseException:
        # The test's own failure is the one to report: stop every node, quietly.
        for node in started:
            with contextlib.suppress(AssertionError):
                await node.stop()
        raise
    stuck = []
    for node in started:
        try:
            await node.stop()
        except AssertionError as exc:
            stuck.append(str(exc))
    assert not stuck, stuck
