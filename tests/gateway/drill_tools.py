"""Handlers, catalog and node launcher for the failure drills (SPEC N4, N6;
tests/gateway/test_nodes_drills.py, bench/nodes.py).

Every handler appends its call id to ``<dir>/runs`` (one ``write`` of one line, with
``O_APPEND``: lines from several node processes never mix), so the drill counts how
often each call really ran, on whichever node. :func:`held` then waits until the drill
creates ``<dir>/go``; :func:`counted` returns at once. :class:`Seen` is a client's
``on_message`` that counts lost events and duplicates.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from gateway.context import ToolContext
from protocol import messages as m
from tests.support import PortTaken, serve_until_banner, write_token_file

START = 60.0
"""Seconds a ``toolbus serve`` may take to start (imports take seconds on a loaded machine)."""

HOLD = 60.0
"""Seconds :func:`held` waits for the go file before it fails."""

TOOLS_YAML = """
tools:
  - name: held_job
    description: Counts its run, then waits for the drill's go file.
    capability: t.drill
    mode: async
    handler: tests.gateway.drill_tools:held
    dispatch_message: Working on it.
    parameters: &dir
      type: object
      properties:
        dir: {type: string}
      required: [dir]
      additionalProperties: false
  - name: held_idem
    description: The same, marked idempotent (SPEC J5 re-runs it after a node died).
    capability: t.drill
    mode: async
    idempotent: true
    handler: tests.gateway.drill_tools:held
    dispatch_message: Working on it.
    parameters: *dir
  - name: quick_job
    description: Counts its run and ends.
    capability: t.drill
    mode: async
    handler: tests.gateway.drill_tools:counted
    dispatch_message: Working on it.
    parameters: *dir
  - name: count_call
    description: Counts its run and answers.
    capability: t.drill
    handler: tests.gateway.drill_tools:counted
    parameters: *dir
"""

PROFILES_YAML = """
profiles:
  demo:
    capabilities: [t.drill]
"""


def _note(folder: Path, call_id: str) -> None:
    with (folder / "runs").open("a") as runs:
        runs.write(call_id + "\n")


def counted(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Append the call id to ``runs`` and return ``{"summary": call_id}``."""
    _note(Path(params["dir"]), ctx.call_id)
    return {"summary": ctx.call_id}


def held(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Append the call id to ``runs``, wait for ``go`` or ``go-<call id>`` (at most
    :data:`HOLD` s), return.

    Raises:
        TimeoutError: no go file within :data:`HOLD` seconds.
    """
    folder = Path(params["dir"])
    _note(folder, ctx.call_id)
    deadline = time.monotonic() + HOLD
    mine = folder / f"go-{ctx.call_id}"
    while not ((folder / "go").exists() or mine.exists()):
        if time.monotonic() > deadline:
            raise TimeoutError("no go file")
        time.sleep(0.02)
    return {"summary": ctx.call_id}


def runs(folder: Path) -> collections.Counter[str]:
    """How many times each call id's handler started, over every node."""
    path = folder / "runs"
    return collections.Counter(path.read_text().split() if path.exists() else [])


TERMINAL_CALL = (m.Result, m.Dispatched, m.CallError)
TERMINAL_JOB = (m.JobDone, m.JobFailed, m.JobCancelled)


@dataclass
class Seen:
    """What one client processed (after its own ``seq`` dedup), for the counts (SPEC D1,
    D3, N4): pass it as ``on_message`` of ``toolbus.connect``."""

    seqs: list[int] = field(default_factory=list)
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    jobs: collections.Counter[str] = field(default_factory=collections.Counter)
    resolved: dict[str, list[m.ToolResolved]] = field(
        default_factory=lambda: collections.defaultdict(list)
    )

    def __call__(self, msg: BaseModel) -> None:
        seq = getattr(msg, "seq", None)
        if not seq:
            return
        self.seqs.append(seq)
        if isinstance(msg, TERMINAL_CALL):
            self.calls[msg.call_id] += 1
        elif isinstance(msg, TERMINAL_JOB):
            self.jobs[msg.job_id] += 1
        elif isinstance(msg, m.ToolResolved):
            self.resolved[msg.call_id].append(msg)

    def gaps(self) -> int:
        """Seqs missing between 1 and the highest processed (events lost)."""
        return max(self.seqs, default=0) - len(set(self.seqs))

    def twice(self) -> list[str]:
        """What :meth:`duplicates` counts, named (for a drill's record)."""
        named = [f"seq {q}" for q, n in collections.Counter(self.seqs).items() if n > 1]
        named += [f"call {k}" for k, n in self.calls.items() if n > 1]
        named += [f"job {k}" for k, n in self.jobs.items() if n > 1]
        named += [f"resolved {k}" for k, v in self.resolved.items() if len(v) > 1]
        return named

    def duplicates(self) -> int:
        """Events processed twice: one seq twice, or one outcome under two seqs."""
        again = len(self.seqs) - len(set(self.seqs))
        settled = [*self.calls.values(), *self.jobs.values()]
        settled += [len(v) for v in self.resolved.values()]
        return again + sum(n - 1 for n in settled if n > 1)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def start_on_a_port(node: Any, wait: float) -> tuple[asyncio.subprocess.Process, int]:
    """Start ``node`` (its ``name``, ``folder``, ``port``, ``config`` file, ``_settings``
    and ``started``): ``(process, port)`` once its banner came. Before its first start
    a port taken meanwhile (:class:`tests.support.PortTaken`) is replaced, up to three
    times, and the config file rewritten."""
    errors = node.folder / f"{node.name}.err"
    for attempt in range(3):
        address = f"127.0.0.1:{node.port}"
        try:
            return await serve_until_banner(node.config, address, errors, wait), node.port
        except PortTaken:
            if node.started or attempt == 2:
                raise
        node.port = free_port()
        node._settings["server"]["port"] = node.port
        node.config.write_text(yaml.safe_dump(node._settings))
    raise AssertionError("unreachable")


class DrillNode:
    """One ``toolbus serve`` on a fixed port (HAProxy names it), restartable, with a
    generated node id (``host-pid-random``) so a restart is a new node. ``overrides``
    replaces keys of the configuration's sections, e.g. ``{"nodes": {"lease_ttl": 5.0}}``
    (bench/failover.py runs the defaults)."""

    def __init__(
        self,
        folder: Path,
        url: str,
        name: str,
        overrides: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        (folder / "tools.yaml").write_text(TOOLS_YAML)
        (folder / "profiles.yaml").write_text(PROFILES_YAML)
        self.name = name
        self.folder = folder
        self.port = free_port()
        self.config = folder / f"{name}.yaml"
        config = {
            "data_dir": str(folder / f"data-{name}"),
            "server": {"port": self.port, "heartbeat_interval": 0, "drain_retry_after": 0.1},
            "auth": {"token_file": str(write_token_file(folder))},
            "catalog": {
                "tools": [str(folder / "tools.yaml")],
                "profiles": [str(folder / "profiles.yaml")],
                "hot_reload": False,
            },
            "store": {"url": url},
            "nodes": {"lease_interval": 0.2, "lease_ttl": 1.0},
            # 50 sessions of one user, calling without pause, each with a job running:
            # the per-user limits are not what the drills measure.
            "limits": {
                "invoke_rate": 1e6,
                "invoke_burst": 1_000_000,
                "max_sessions_per_user": 1000,
            },
            "jobs": {"max_per_user": 200, "worker_threads": 80, "threads_per_user": 80},
            "calls": {"threads_per_user": 32},
        }
        for section, values in (overrides or {}).items():
            config[section] = {**config.get(section, {}), **values}
        self._settings = config
        self.config.write_text(yaml.safe_dump(config))
        self.proc: asyncio.subprocess.Process | None = None
        self.started = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def node_prefix(self) -> str:
        """The start of this process's generated node id (``host-pid-``)."""
        assert self.proc is not None
        return f"{socket.gethostname()}-{self.proc.pid}-"

    async def start(self) -> None:
        """Start the process and wait for its banner (at most :data:`START` s). At its
        first start, a port another process took meanwhile is replaced by a new one
        (nothing names it yet); a restart keeps its port (HAProxy names it)."""
        self.proc, self.port = await start_on_a_port(self, START)
        self.started = True

    async def stop(self, wait: float = 30.0) -> int:
        """SIGTERM (a drain, SPEC S4) unless it already ended; its exit status."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(wait):
            return await self.proc.wait()

    async def kill(self) -> None:
        """SIGKILL, and wait until the process is gone."""
        assert self.proc is not None
        self.proc.kill()
        await self.proc.wait()
