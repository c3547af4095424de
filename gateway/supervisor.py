"""``toolbus serve --workers N``: N server processes on one port and one store (SPEC N1, N6).

Each worker is a whole ``toolbus serve`` process (its own event loop, threads, store
connection and node id, SPEC N2) bound to the same port with ``SO_REUSEPORT``: the
kernel spreads new connections over the workers' listening sockets. Together they are
nodes of one gateway, so a worker needs the shared PostgreSQL store; on the embedded
SQLite store ``--workers`` is refused at start (SPEC O5).

The parent (:class:`Supervisor`) holds the data-folder lock (SPEC O5) and the port (bound,
never listening, so a restarted worker always gets it back), starts the first worker,
waits until it listens (it alone recovers what the store holds), then the others, and
prints one banner. It forwards SIGTERM and SIGINT to every worker (each drains, SPEC S4)
and exits once all of them ended. A worker that ends on its own (a crash, ``kill -9``,
the OOM killer) is started again, after 0.5 s doubling to 30 s while restarts keep
failing: its sessions resume on the other workers meanwhile (SPEC N4), and the port
keeps its full capacity. Linux only (``SO_REUSEPORT`` balancing, ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence

logger = logging.getLogger("gateway.supervisor")

BACKOFF_FIRST = 0.5
"""Seconds before a crashed worker is started again the first time."""
BACKOFF_CAP = 30.0
"""Longest pause between two restarts of a worker that keeps dying, in seconds."""
STEADY = 30.0
"""Seconds a worker must have served for its next crash to restart it after
:data:`BACKOFF_FIRST` again."""
BANNER = b"toolbus serving on "
"""How a worker's first stdout line starts once it listens."""
_PR_SET_PDEATHSIG = 1


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """Hold ``host:port`` for the workers (SPEC N6, O5).

    The address is first bound without ``SO_REUSEPORT``, so a port any other process uses
    is refused exactly as a one-process ``serve`` refuses it; then it is bound again with
    ``SO_REUSEPORT`` and kept, never listening (it takes no connections).

    Returns:
        The held socket and the port (the one picked when ``port`` is 0).

    Raises:
        OSError: the address cannot be bound (``errno`` says why).
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)
        port = probe.getsockname()[1]
    held = socket.socket(family, kind, proto)
    try:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind((address[0], port, *address[2:]))
    except OSError:
        held.close()
        raise
    return held, port


def die_with_parent(parent: int) -> None:
    """In a worker: get SIGTERM (a drain, SPEC S4) when the supervisor ``parent`` dies,
    even by ``kill -9``; exit at once if it is already gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        sys.exit(1)


class Supervisor:
    """Runs and supervises the workers of ``toolbus serve --workers N`` (SPEC N6).

    Args:
        command: the argv and environment of worker ``index`` (0-based).
        count: how many workers.
        on_started: called once every worker listens (the CLI prints the banner).
    """

    def __init__(
        self,
        command: Callable[[int], tuple[Sequence[str], dict[str, str]]],
        count: int,
        on_started: Callable[[], None],
    ) -> None:
        self.command = command
        self.count = count
        self.on_started = on_started
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        """The running worker of each index."""
        self.restarts = 0
        """Workers started again after they ended on their own."""
        self._stop = asyncio.Event()
        self._signal = signal.SIGTERM
        self._started = asyncio.Event()
        self._relays: set[asyncio.Task[None]] = set()

    async def run(self) -> int:
        """Start the workers, supervise them until SIGTERM or SIGINT, then wait for all
        of them to drain and end.

        Returns:
            0 when every worker ended 0 after the signal; 1 when a worker could not start
            (its own ``toolbus: cannot start: ...`` line is on stderr) or ended non-zero.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping, sig)
        try:
            return await self._run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        # The first worker alone: it finds no live node and recovers the store (N4).
        first = await self._start(0)
        if first is None:
            return await self._end(1)
        rest = await asyncio.gather(*(self._start(i) for i in range(1, self.count)))
        if any(proc is None for proc in rest):
            return await self._end(1)
        if self._stop.is_set():
            return await self._end(0)
        self.on_started()
        self._started.set()
        keepers = [asyncio.create_task(self._keep(i)) for i in range(self.count)]
        results = await asyncio.gather(*keepers)
        return 0 if all(code == 0 for code in results) else 1

    def _stopping(self, sig: int) -> None:
        """SIGTERM or SIGINT: pass it on to every worker; none is started again."""
        logger.info("signal %s: draining %d worker(s)", signal.Signals(sig).name, len(self.procs))
        self._signal = signal.Signals(sig)
        self._stop.set()
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(sig)

    async def _start(self, index: int) -> asyncio.subprocess.Process | None:
        """Start worker ``index`` and wait until it listens; ``None`` if it ended first."""
        argv, env = self.command(index)
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, env=env)
        self.procs[index] = proc
        if self._stop.is_set():
            proc.send_signal(self._signal)
        assert proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                await proc.wait()
                # At start-up the worker's own `cannot start` line says it all (SPEC O5).
                level = logging.WARNING if self._started.is_set() else logging.DEBUG
                logger.log(level, "worker %d (pid %d) ended before listening", index, proc.pid)
                return None
            if line.startswith(BANNER):
                break
        relay = asyncio.create_task(self._relay(proc.stdout))
        self._relays.add(relay)
        relay.add_done_callback(self._relays.discard)
        logger.info("worker %d (pid %d) listening", index, proc.pid)
        return proc

    async def _relay(self, stream: asyncio.StreamReader) -> None:
        """A worker's later stdout (a handler's prints) goes to ours, after our banner;
        the pipe never fills up and blocks it."""
        await self._started.wait()
        while line := await stream.readline():
            sys.stdout.buffer.write(line)
            sys.stdout.flush()

    async def _keep(self, index: int) -> int:
        """Supervise worker ``index``: start it again whenever it ends on its own, until
        the stop; its exit status after the stop."""
        delay = BACKOFF_FIRST
        while True:
            proc = self.procs[index]
            began = time.monotonic()
            code = await proc.wait()
            if self._stop.is_set():
                return code
            if time.monotonic() - began >= STEADY:
                delay = BACKOFF_FIRST
            logger.error(
                "worker %d (pid %d) ended with status %d; starting it again in %.1f s",
                index,
                proc.pid,
                code,
                delay,
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
            if self._stop.is_set():
                return 0
            delay = min(delay * 2, BACKOFF_CAP)
            self.restarts += 1
            await self._start(index)

    async def _end(self, code: int) -> int:
        """A start-up that failed or was stopped: stop the workers started, wait for them."""
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(self._signal)
        for proc in self.procs.values():
            await proc.wait()
        return code
