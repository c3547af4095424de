"""The toolbus server: one process, one port, WebSocket plus HTTP side routes (SPEC S, O2).

:class:`Gateway` is the composition: :func:`gateway.wiring.build_gateway` builds every
part once, before serving; :meth:`Gateway.start` settles what the store holds from a
previous run (:mod:`gateway.recovery`), binds the port with websockets' asyncio server
(:mod:`gateway.wslib`) and starts the loops (:mod:`gateway.loops`); :meth:`Gateway.drain`
is the graceful stop (SPEC S4).

Each accepted socket is sniffed first: ``/mcp`` goes to the MCP app (SPEC M4), the rest
to websockets, whose handshake :class:`gateway.http_front.UpgradeVetting` vets before any
session exists (the Origin allowlist, the ``toolbus.v1`` subprotocol, no credentials in
the URL; SPEC S1, S2). Plain HTTP GETs get ``/healthz``, ``/readyz``, ``/metrics`` and
the demo console (SPEC O2, K2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable

from gateway import wslib
from gateway.auth import Authenticator
from gateway.config import Settings
from gateway.connection import ConnectionHandler
from gateway.mcp.route import Sniffer
from gateway.store import Store
from gateway.wiring import build_gateway
from gateway.wslib import Server, Socket
from protocol import messages as m
from protocol.codec import encode
from protocol.version import SUPPORTED

logger = logging.getLogger("gateway.server")


class Gateway:
    """A toolbus server (SPEC S1-S5): the parts :func:`~gateway.wiring.build_gateway`
    built, started and stopped in order.

    Args:
        settings: the configuration.
        authenticator: overrides the one built from ``settings.auth`` (tests, embedding).
        store: overrides the store ``settings.store`` names (by default SQLite at
            ``data_dir/toolbus.db``).
        clock: Unix time in seconds, for every part (tests move it).

    Raises:
        StoreError: the store cannot be opened, or is damaged (SPEC D6, O5).
    """

    def __init__(
        self,
        settings: Settings,
        authenticator: Authenticator | None = None,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.parts = parts = build_gateway(settings, authenticator, store, clock)
        # The parts that tests and embedders reach for, under their names.
        self.clock = parts.clock
        self.metrics = parts.metrics
        self.store = parts.store
        self.catalog = parts.catalog
        self.workers = parts.workers
        self.watchdog = parts.watchdog
        self.outbox = parts.outbox
        self.sessions = parts.sessions
        self.approvals = parts.approvals
        self.authority = parts.authority
        self.jobs = parts.jobs
        self.pipeline = parts.pipeline
        self.mcp = parts.mcp
        self.mcp_endpoint = parts.mcp_endpoint
        self.handlers = parts.sockets.handlers
        """Every open socket's handler, sessions or not."""
        self.server: Server | None = None
        self.port = 0
        self._drained = False

    @property
    def ready(self) -> bool:
        """Serving and not draining: ``/readyz`` answers 200 (SPEC O2, S4)."""
        return self.parts.status.ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self.parts.status.ready = value

    @property
    def draining(self) -> bool:
        """Set once :meth:`drain` began: no new session may start (SPEC S4)."""
        return self.parts.status.draining

    def tracked(self) -> dict[str, int]:
        """Per-session and per-user entries held now, by kind (SPEC E3, case F33): each
        goes back to its baseline once the sessions ended and their work is done."""
        return self.parts.health.tracked()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Settle what the store holds, bind the port and start serving (SPEC S1, D3).

        Raises:
            OSError: the port cannot be bound (SPEC O5); no loop was started then.
        """
        parts = self.parts
        node = parts.node
        # SPEC N2, N4: with other live nodes on the store, their work is theirs; only a
        # node that finds none recovers what the store holds (gateway.nodes).
        held = parts.recovery.run() if node is None or node.register() else []
        cfg = self.settings.server
        self.server = await wslib.serve(
            self._handle,
            cfg.host,
            cfg.port,
            subprotocols=SUPPORTED,
            process_request=parts.vetting.process_request,
            max_size=cfg.max_message_bytes,
            ping_interval=cfg.heartbeat_interval or None,
            ping_timeout=cfg.heartbeat_timeout or None,
            # SPEC S3: a peer that does not answer our close frame within the heartbeat
            # timeout is as dead as one that misses a pong; park it then, not after
            # websockets' default 10 s more (capped at that default).
            close_timeout=min(cfg.heartbeat_timeout, 10.0) if cfg.heartbeat_timeout else 10.0,
            front=self._front,
            reuse_port=cfg.reuse_port,
        )
        self.port = self.server.sockets[0].getsockname()[1] if self.server.sockets else cfg.port
        parts.origins.port = self.port
        # The loops (the MCP session manager among them) start once the port is ours, so
        # a start-up that fails to bind (O5) has started nothing it must stop, and logs
        # nothing of it.
        parts.loops.start()
        if node is not None:
            node.start()
        # SPEC M1, M2: mounted MCP servers connect in the background; never awaited here.
        parts.mcp.start()
        if held:
            parts.loops.add(parts.recovery.settle_mounted(held))
        self.watchdog.start()
        self.ready = True
        logger.info("listening on ws://%s:%d/", cfg.host, self.port)
        allowed, *refused = parts.origins.notice()
        logger.info("%s", allowed)
        for line in refused:  # SPEC S2: pages from other machines are refused 403
            logger.warning("%s", line)

    @property
    def url(self) -> str:
        return f"ws://{self.settings.server.host}:{self.port}/"

    async def drain(self) -> None:
        """Graceful stop (SPEC S4, N6): ``reconnect`` + 1012 to every socket, state durable.
        Calls waiting for approval are handed off (:mod:`gateway.handoff`): the next
        start, or the node that claims this one's work, adopts them. Alone, the node
        lets handlers end (up to ``server.drain_grace``, J6), then closes the sockets;
        as one of several nodes it closes them first, so that clients resume elsewhere
        at once, and then lets its jobs and calls end (N6). A call whose handler has not
        started by then ends ``unavailable``, saying it did not run (J6,
        :meth:`Pipeline.stop_unstarted <gateway.pipeline.Pipeline.stop_unstarted>`).
        Calling it again, or before :meth:`start`, does nothing."""
        parts = self.parts
        self.ready = False
        if self.server is None or self._drained:
            return
        self._drained = True
        parts.status.draining = True
        self.server.close(close_connections=False)
        parts.loops.stop()
        deadline = asyncio.get_running_loop().time() + self.settings.server.drain_grace
        if parts.node is None:
            # SPEC A4, D3: a call waiting for approval has not run; the next start adopts
            # it (gateway.handoff), pending under the same id, as a reconnect keeps it.
            # SPEC J6: plain handlers cannot be interrupted; jobs and sync calls whose
            # handler runs in a thread get until the deadline to end as they really end.
            await parts.handoff.release()
            await self.jobs.shutdown(deadline)
            # SPEC S4, D1: and until their calls' terminal events are staged, so that
            # each result that ends within the grace goes out before the hint.
            await self.pipeline.settle_plain(deadline)
            # SPEC J6: a call whose handler has not started by now (it waits for a
            # thread) never runs here; it ends saying so, not as cut off while it ran.
            await parts.handoff.release()
            await self.pipeline.stop_unstarted()
            await self._restart_sockets()
        else:
            # SPEC N6: other nodes share the store, so the sessions move first: each client
            # resumes on another node at once. A call waiting for approval has not run:
            # it is handed to the node that claims this one's work (gateway.handoff),
            # stored before any client can move (a moved session's rows are fenced).
            # Jobs and running calls get until the deadline to end; their outcomes reach
            # the clients where they are (the inbox, N3).
            await parts.handoff.release()
            await self._restart_sockets()
            await asyncio.gather(
                self.jobs.shutdown(deadline, patient=True), parts.handoff.drain(deadline)
            )
            await self.pipeline.stop_unstarted()  # SPEC J6, as alone
            self.outbox.flush()
        parts.mcp_http.shutdown()
        await self.server.wait_closed()
        self.outbox.close()
        if parts.node is not None:
            await parts.node.stop()
        self.store.close()
        # Calls still in flight (their handlers started) stay "running" in the store: the
        # next start reports them (SPEC I12, A4). Their tasks end here, with nothing left
        # to write to.
        # (Pipeline.tasks: also calls of expired sessions whose handler runs on, I15.)
        calls = self.pipeline.tasks()
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await self.mcp.stop()
        self.workers.close()
        self.watchdog.stop()

    async def _restart_sockets(self) -> None:
        """Every socket, with a session or still before hello, gets the ``reconnect``
        hint behind what is already queued for it, then 1012 (SPEC S4). A hello arriving
        now is turned away the same way (ConnectionHandler._handshake checks
        ``draining``)."""
        self.outbox.flush()
        hint = encode(
            m.Reconnect(reason="server restart", retry_after=self.settings.server.drain_retry_after)
        )
        await self.parts.sockets.restart_all(hint)

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drain()

    # -- the socket ------------------------------------------------------------------------

    def _front(self, websocket: Callable[[], asyncio.Protocol]) -> asyncio.Protocol:
        """Each accepted socket: ``/mcp`` to the MCP app, the rest to websockets (M4)."""
        timeout = self.settings.server.heartbeat_timeout or 10.0
        return Sniffer(websocket, self.parts.mcp_http.protocol, timeout)

    async def _handle(self, ws: Socket) -> None:
        await self.parts.sockets.serve(ConnectionHandler(self.parts.connection_parts, ws))


async def run(settings: Settings, on_started: Callable[[Gateway], None] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then drain (SPEC S4).

    Args:
        settings: the configuration.
        on_started: called once the port is bound (the CLI prints the URL).
    """
    gateway = Gateway(settings)
    await gateway.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Event loops without signal support (Windows) raise NotImplementedError; there
        # the process stops on KeyboardInterrupt instead, without a drain.
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if gateway.parts.node is not None:
        # SPEC N4: a node whose work another node claimed stops (its supervisor restarts
        # it as a new node).
        gateway.parts.node.on_dead = stop.set
    if on_started is not None:
        on_started(gateway)
    try:
        await stop.wait()
    finally:
        await gateway.drain()
