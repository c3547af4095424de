"""The toolbus server: one process, one port, WebSocket plus HTTP side routes (SPEC S, O2).

:class:`Gateway` wires the parts: configuration, store, outbox, sessions, catalog,
approvals, job runner, pipeline, metrics. :meth:`Gateway.start` binds the port with
websockets' asyncio server; :meth:`Gateway.drain` is the graceful stop (SPEC S4).

The upgrade is vetted in :meth:`Gateway._process_request` before any session exists:
the Origin allowlist (SPEC S2, case F15: HTTP 403), the ``toolbus.v1`` subprotocol
(SPEC S1: HTTP 400 naming what is supported), and no credentials in the URL query
(SPEC S2: they end up in access logs). Plain HTTP GETs get ``/healthz``, ``/readyz``,
``/metrics`` (Prometheus text) and the demo console (SPEC O2, K2).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from catalog.model import ToolDef
from gateway import hooks
from gateway.approvals import Approvals
from gateway.auth import Authenticator, ChainAuthenticator, JwtAuthenticator, TokenFileAuthenticator
from gateway.authority import Authority
from gateway.catalog_state import CatalogState
from gateway.config import Settings
from gateway.connection import ConnectionHandler, bucket_factory
from gateway.context import ToolContext
from gateway.jobs import JobRunner, PostProcess
from gateway.ledger import CallLedger
from gateway.mcp.elicit import Elicitations
from gateway.mcp.mounts import McpMounts
from gateway.mcp.route import McpHttp, Sniffer
from gateway.mcp.serve import McpEndpoint
from gateway.metrics import Metrics
from gateway.outbox import Outbox
from gateway.session import Session, SessionTable
from gateway.store import JobRow, Store
from gateway.stores import open_store
from gateway.tasks import TaskSet, periodic
from gateway.watchdog import Watchdog
from gateway.wiring import build_connection_parts, build_pipeline
from gateway.workers import Lane, Workers
from gateway.wsconn import CoalescingConnection
from protocol import messages as m
from protocol.codec import decode_json, encode
from protocol.errors import CloseCode, ErrorCode
from protocol.version import SUPPORTED, negotiate, refusal_reason

logger = logging.getLogger("gateway.server")

STATIC_DIR = Path(__file__).resolve().parent / "static"
_STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
}
_CREDENTIAL_PARAMS = frozenset(
    {
        "token",
        "access_token",
        "jwt",
        "auth",
        "authorization",
        "resume_token",
        "api_key",
        "apikey",
        "password",
        "secret",
    }
)


class _QuietWebsocketsLogger(logging.LoggerAdapter[logging.Logger]):
    """websockets' server logger without its DEBUG lines (SPEC S2).

    websockets logs every request header and frame payload at DEBUG, which would put
    ``Authorization`` headers and ``hello.token`` in the log. It only formats those
    lines when ``isEnabledFor(DEBUG)`` is true, so answering false drops them at the
    source; INFO and above pass through unchanged.
    """

    def isEnabledFor(self, level: int) -> bool:
        return level > logging.DEBUG and self.logger.isEnabledFor(level)


def build_authenticator(settings: Settings) -> Authenticator:
    """The authenticator chain the configuration names (SPEC S2)."""
    auth = settings.auth
    chain: list[Authenticator] = []
    if auth.token_file is not None:
        chain.append(TokenFileAuthenticator(auth.token_file))
    if auth.jwt_secret or auth.jwt_public_key_file:
        key = auth.jwt_public_key_file.read_text() if auth.jwt_public_key_file else None
        chain.append(
            JwtAuthenticator(
                auth.jwt_secret, key, auth.jwt_audience, auth.jwt_issuer, auth.jwt_profiles_claim
            )
        )
    return ChainAuthenticator(chain)


def _credentials_in(path: str, query: str) -> bool:
    """Whether a request URL carries something named like a credential, in the query or
    as a ``;name=value`` path parameter (SPEC S2: URLs end up in access logs)."""
    names = {name.lower() for name in parse_qs(query)}
    for segment in path.split("/"):
        for parameter in segment.split(";")[1:]:
            names.add(parameter.partition("=")[0].lower())
    return bool(_CREDENTIAL_PARAMS & names)


def _response(status: http.HTTPStatus, body: bytes, content_type: str) -> Response:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
        ]
    )
    return Response(status.value, status.phrase, headers, body)


class Gateway:
    """A toolbus server (SPEC S1-S5).

    Args:
        settings: the configuration.
        authenticator: overrides the one built from ``settings.auth`` (tests, embedding).
        store: overrides the SQLite store at ``data_dir/toolbus.db``.
    """

    def __init__(
        self,
        settings: Settings,
        authenticator: Authenticator | None = None,
        store: Store | None = None,
    ) -> None:
        self.settings = settings
        self.clock = time.time
        self.metrics = Metrics()
        self.authenticator = authenticator or build_authenticator(settings)
        self.store: Store = store or open_store(
            settings.store.url, settings.data_dir / "toolbus.db"
        )  # SPEC N1: PostgreSQL when store.url names one
        # SPEC E2: every profile's catalog frame must fit the size welcome announces.
        self.catalog = CatalogState(
            settings.catalog.tools, settings.catalog.profiles, settings.server.max_message_bytes
        )
        self.limits = m.Limits(
            max_message_bytes=settings.server.max_message_bytes,
            heartbeat_interval=settings.server.heartbeat_interval,
            heartbeat_timeout=settings.server.heartbeat_timeout,
            max_inflight_calls=settings.limits.max_inflight_calls,
            invoke_rate=settings.limits.invoke_rate,
            invoke_burst=settings.limits.invoke_burst,
            max_pending_approvals=settings.limits.max_pending_approvals,
            max_sessions_per_user=settings.limits.max_sessions_per_user,
            resume_window=settings.sessions.resume_window,
            max_unacked_events=settings.sessions.max_unacked_events,
            max_context_bytes=settings.limits.max_context_bytes,
        )
        self.bucket = bucket_factory(settings.limits.invoke_rate, settings.limits.invoke_burst)
        calls, jobs = settings.calls, settings.jobs
        # SPEC E3: sync calls and jobs have threads of their own, each with per-session
        # and per-user caps; the watchdog notices a blocked event loop from outside it.
        self.workers = Workers(
            Lane(
                "calls",
                calls.worker_threads,
                calls.threads_per_session,
                calls.threads_per_user,
                self.metrics,
            ),
            Lane(
                "jobs",
                jobs.worker_threads,
                jobs.threads_per_session,
                jobs.threads_per_user,
                self.metrics,
            ),
        )
        self.watchdog = Watchdog(settings.server.loop_stall_threshold, self.metrics)
        self.pre_hooks = [hooks.resolve(p) for p in settings.calls.pre_hooks]
        self.post_hooks = [hooks.resolve(p) for p in settings.calls.post_hooks]
        self.server: Server | None = None
        self.port = 0
        self.ready = False
        self.draining = False
        """Set once :meth:`drain` began: no new session may start (SPEC S4)."""
        self.handlers: set[ConnectionHandler] = set()
        """Every open socket's handler, sessions or not."""
        self._files = {
            f.name: (f.read_bytes(), _STATIC_TYPES.get(f.suffix, "application/octet-stream"))
            for f in STATIC_DIR.iterdir()
            if f.is_file()
        }
        self._drained = False
        self._tasks: list[asyncio.Task[None]] = []
        self.background = TaskSet()
        """Fire-and-forget tasks (e.g. ``job.cancel`` replies), kept until they end."""
        self._wire()

    # -- the parts, built once, before serving -------------------------------------------

    def _wire(self) -> None:
        """Build every part once, each from the few parts it uses (:mod:`gateway.wiring`);
        nothing here needs a running loop, and :meth:`start` only serves them."""
        store_cfg = self.settings.store
        self.outbox = Outbox(
            self.store,
            store_cfg.unavailable_after,
            store_cfg.retry_max,
            self.metrics.store_commit_failures.inc,
        )
        self.sessions = SessionTable(
            self.store,
            self.outbox,
            self.settings.sessions.resume_window,
            self.settings.sessions.max_unacked_events,
            self._on_session_end,
            self.settings.sessions.max_call_records,
        )
        self.approvals = Approvals(self.settings.calls.approval_timeout, self.clock)
        self.elicitations = Elicitations(
            self.sessions.get, self.settings.calls.approval_timeout, self.clock
        )
        self.authority = Authority(
            self.catalog,
            self.authenticator,
            self.clock,
            self.settings.auth.expiry_warning,
            self._close_lapsed,
        )
        self.jobs = JobRunner(
            self.store,
            self.settings.jobs,
            self.metrics,
            self.workers.jobs,
            self.clock,
            self.settings.server.max_message_bytes,
        )
        self.pipeline = build_pipeline(
            catalog=self.catalog,
            approvals=self.approvals,
            jobs=self.jobs,
            calls=self.settings.calls,
            limits=self.settings.limits,
            pre_hooks=self.pre_hooks,
            post_hooks=self.post_hooks,
            metrics=self.metrics,
            pool=self.workers.calls,
            data_dir=self.settings.data_dir,
            authority=self.authority,
            ledger=CallLedger(self.store, self.settings.calls.call_id_window, self.clock),
            max_frame=self.settings.server.max_message_bytes,
        )
        self.connection_parts = build_connection_parts(
            server=self.settings.server,
            limits=self.settings.limits,
            welcome_limits=self.limits,
            authenticator=self.authenticator,
            sessions=self.sessions,
            outbox=self.outbox,
            store=self.store,
            catalog=self.catalog,
            authority=self.authority,
            pipeline=self.pipeline,
            approvals=self.approvals,
            elicitations=self.elicitations,
            jobs=self.jobs,
            metrics=self.metrics,
            background=self.background,
            bucket=self.bucket,
            clock=self.clock,
            draining=lambda: self.draining,
        )

    def _rerun_plan(self, row: JobRow) -> tuple[ToolDef, ToolContext, PostProcess] | None:
        """The pipeline's plan for a stored job (SPEC J5), gated like any other handler
        start (SPEC A7): its session's profile and context are re-checked when the job
        gets its slot after the restart."""
        plan = self.pipeline.execution.rerun_plan(row)
        session = self.sessions.get(row.session_id)
        if plan is None or session is None:
            return plan
        tool, ctx, post = plan
        return tool, replace(ctx, recheck=self.authority.gate(session, tool.name)), post

    def _close_lapsed(self, session: Session, code: CloseCode, reason: str) -> None:
        """SPEC S6: the session's credential lapsed; close its live socket, if any."""
        for handler in list(self.handlers):
            if handler.session is session:
                handler.close_lapsed(code, reason)

    def _on_session_end(self, session: Session) -> None:
        """SPEC A4, I8, I15: the end of a session denies its approvals and cancels its
        calls (an expired session's running handlers run on, see Pipeline.end_session)."""
        self.approvals.settle_session(session.id, m.ResolutionReason.DISCONNECTED)
        self.elicitations.settle_session(session.id)
        self.authority.forget(session)
        self.pipeline.end_session(session)

    def _recover(self) -> None:
        """Bring stored sessions back after a restart, parked (SPEC D3, J5)."""
        now = self.clock()
        for row in self.store.all_sessions():
            if row.expires_at is not None and row.expires_at < now:
                self.store.delete_session(row.session_id)
                continue
            profile = self.catalog.current.profile(row.profile)
            session = self.sessions.adopt(row, profile, self.bucket(), now)
            session.catalog_names = self.catalog.view(session)[2]
        for session_id, call_id, note in self.store.running_calls():
            self._interrupt_call(session_id, call_id, decode_json(note) if note else {})
        # SPEC I15: a call id cut off here never runs again, from any session.
        self.pipeline.ledger.recover()
        count = self.jobs.recover(self.sessions.sessions, self._rerun_plan)
        self.outbox.flush()  # SPEC D6: a store that cannot commit yet holds and retries
        if self.sessions.sessions or count:
            logger.info(
                "recovered %d sessions, %d interrupted jobs", len(self.sessions.sessions), count
            )

    def _interrupt_call(self, session_id: str, call_id: str, note: dict[str, str]) -> None:
        """A call a restart cut off ends ``cancelled`` (SPEC I12: one terminal reply); a
        pending approval it waited on is resolved ``disconnected`` first (SPEC A4, A6)."""
        session = self.sessions.get(session_id)
        if session is None:
            return
        tool = note.get("tool", "")
        approval_id = note.get("approval_id")
        if approval_id:
            session.emit(
                m.ToolResolved,
                call_id=call_id,
                approval_id=approval_id,
                tool=tool,
                resolution=m.Resolution.DENIED,
                reason=m.ResolutionReason.DISCONNECTED,
            )
        body = session.emit(
            m.CallError,
            call_id=call_id,
            tool=tool,
            code=ErrorCode.CANCELLED,
            message="the server restarted while this call ran",
        )
        session.call_done(call_id, body)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the port and start serving (SPEC S1)."""
        self._recover()
        cfg = self.settings.server
        self._serve_mcp()
        self.server = await serve(
            self._handle,
            cfg.host,
            cfg.port,
            subprotocols=[Subprotocol(name) for name in SUPPORTED],
            process_request=self._process_request,
            max_size=cfg.max_message_bytes,
            ping_interval=cfg.heartbeat_interval or None,
            ping_timeout=cfg.heartbeat_timeout or None,
            # SPEC S3: a peer that does not answer our close frame within the heartbeat
            # timeout is as dead as one that misses a pong; park it then, not after
            # websockets' default 10 s more (capped at that default).
            close_timeout=min(cfg.heartbeat_timeout, 10.0) if cfg.heartbeat_timeout else 10.0,
            compression=None,
            server_header="toolbus",
            create_connection=self._accepted,  # type: ignore[arg-type]
            logger=_QuietWebsocketsLogger(logging.getLogger("websockets.server"), {}),
        )
        self.port = self.server.sockets[0].getsockname()[1] if self.server.sockets else cfg.port
        loop = asyncio.get_running_loop()
        # The MCP session manager starts once the port is ours, so a start-up that fails
        # to bind (O5) has started nothing it must stop, and logs nothing of it.
        self._tasks.append(loop.create_task(self._run_mcp()))
        if self.settings.catalog.hot_reload:
            self._tasks.append(
                loop.create_task(
                    self.catalog.watch(
                        self.settings.catalog.reload_interval,
                        lambda: self.sessions.sessions.values(),
                    )
                )
            )
        self._tasks.append(loop.create_task(self._purge_loop()))
        # SPEC M1, M2: mounted MCP servers connect in the background; never awaited here.
        self.mcp = McpMounts(
            self.catalog, lambda: self.sessions.sessions.values(), self.elicitations.ask
        )
        self.mcp.start()
        self._tasks.append(
            loop.create_task(
                self.authority.watch(
                    self.settings.auth.recheck_interval, lambda: self.sessions.sessions.values()
                )
            )
        )
        self.watchdog.start()
        self.ready = True
        logger.info("listening on ws://%s:%d/", cfg.host, self.port)

    @property
    def url(self) -> str:
        return f"ws://{self.settings.server.host}:{self.port}/"

    async def _purge_loop(self) -> None:
        """SPEC D2: drop expired sessions and old jobs; a failing purge is logged and
        retried with backoff, never the end of the loop (:func:`periodic`)."""
        await periodic(
            "store purge",
            self.settings.sessions.purge_interval,
            self._purge,
        )

    def _purge(self) -> None:
        self.store.purge(self.clock(), self.settings.jobs.retention)
        self.pipeline.ledger.purge()  # SPEC I15: call ids past their window

    async def drain(self) -> None:
        """Graceful stop (SPEC S4): ``reconnect`` + 1012 to every socket, state durable.
        Calling it again, or before :meth:`start`, does nothing."""
        self.ready = False
        if self.server is None or self._drained:
            return
        self._drained = True
        self.draining = True
        self.server.close(close_connections=False)
        for task in self._tasks:
            task.cancel()
        # SPEC J6: plain handlers cannot be interrupted; jobs and sync calls whose
        # handler runs in a thread get until the deadline to end as they really end.
        deadline = asyncio.get_running_loop().time() + self.settings.server.drain_grace
        await self.jobs.shutdown(deadline)
        await self.workers.calls.wait_live(deadline)
        # Every socket, with a session or still before hello, gets the hint behind what
        # is already queued for it, then 1012. A hello arriving now is turned away the
        # same way (ConnectionHandler._handshake checks `draining`).
        self.outbox.flush()
        hint = encode(
            m.Reconnect(reason="server restart", retry_after=self.settings.server.drain_retry_after)
        )
        closing = []
        for handler in list(self.handlers):
            handler.link.push(hint)
            closing.append(
                handler.link.flush_and_close(CloseCode.SERVICE_RESTART, "server restart")
            )
        await asyncio.gather(*closing, return_exceptions=True)
        self.mcp_http.shutdown()
        await self.server.wait_closed()
        self.outbox.close()
        self.store.close()
        # Calls still in flight stay "running" in the store: the next start reports them
        # (SPEC I12, A4). Their tasks end here, with nothing left to write to.
        # (Pipeline.tasks: also calls of expired sessions whose handler runs on, I15.)
        calls = self.pipeline.tasks()
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await self.mcp.stop()
        self.workers.close()
        self.watchdog.stop()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drain()

    # -- the socket ------------------------------------------------------------------------

    def _serve_mcp(self) -> None:
        """SPEC M4: the catalog over MCP Streamable HTTP at ``/mcp`` on this port."""
        self.mcp_endpoint = McpEndpoint(
            self.authenticator,
            self.sessions,
            self.catalog,
            self.pipeline,
            self.approvals,
            self.authority,
            self.bucket,
            self.clock,
            _credentials_in,
            lambda origin: origin in self._allowed_origins(),
        )
        self.mcp_http = McpHttp(self.mcp_endpoint)

    async def _run_mcp(self) -> None:
        async with self.mcp_endpoint.running():
            await asyncio.Event().wait()

    def _accepted(self, *args: Any, **kwargs: Any) -> ServerConnection:
        """Each accepted socket: ``/mcp`` to the MCP app, the rest to websockets (M4)."""
        return cast(
            ServerConnection,
            Sniffer(
                lambda: CoalescingConnection(*args, **kwargs),
                self.mcp_http.protocol,
                self.settings.server.heartbeat_timeout or 10.0,
            ),
        )

    async def _handle(self, ws: ServerConnection) -> None:
        handler = ConnectionHandler(self.connection_parts, ws)
        self.handlers.add(handler)
        try:
            await handler.serve()
        finally:
            self.handlers.discard(handler)

    def _allowed_origins(self) -> set[str]:
        if self.settings.server.origins:
            return set(self.settings.server.origins)
        host = self.settings.server.host
        return {f"http://{h}:{self.port}" for h in {host, "127.0.0.1", "localhost"}}

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        url = urlsplit(request.path)
        is_upgrade = "websocket" in request.headers.get("Upgrade", "").lower()
        if not is_upgrade:
            return self._http_method(request.method, url.path)
        if _credentials_in(url.path, url.query):
            return connection.respond(
                http.HTTPStatus.BAD_REQUEST,
                "credentials are not accepted in the URL; "
                "send them in hello or the Authorization header\n",
            )
        origin = request.headers.get("Origin")
        if origin is not None and origin not in self._allowed_origins():
            logger.warning("refused upgrade from origin %s (SPEC S2)", origin)
            return connection.respond(http.HTTPStatus.FORBIDDEN, "origin not allowed\n")
        offered = [
            p.strip()
            for h in request.headers.get_all("Sec-WebSocket-Protocol")
            for p in h.split(",")
        ]
        if negotiate(offered) is None:
            return connection.respond(http.HTTPStatus.BAD_REQUEST, refusal_reason(offered) + "\n")
        return None

    def _http_method(self, method: str, path: str) -> Response:
        """GET serves the side routes; HEAD the same without a body (RFC 9110 section
        9.3.2); anything else is 405 with ``Allow``."""
        if method == "HEAD":
            response = self._http(path)
            return Response(response.status_code, response.reason_phrase, response.headers, b"")
        if method != "GET":
            response = _response(
                http.HTTPStatus.METHOD_NOT_ALLOWED, b"method not allowed\n", "text/plain"
            )
            response.headers["Allow"] = "GET, HEAD"
            return response
        return self._http(path)

    def _http(self, path: str) -> Response:
        """SPEC O2 side routes and the demo console (SPEC K2)."""
        if path == "/healthz":
            return _response(http.HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
        if path == "/readyz":
            # SPEC S4 (draining) and D6 (a store that cannot commit): not ready.
            if not self.ready:
                body = b"draining\n"
            elif self.outbox.unavailable:
                body = b"store unavailable\n"
            else:
                body = b"ready\n"
            ok = body == b"ready\n"
            status = http.HTTPStatus.OK if ok else http.HTTPStatus.SERVICE_UNAVAILABLE
            return _response(status, body, "text/plain; charset=utf-8")
        if path == "/metrics":
            self._update_gauges()
            return _response(
                http.HTTPStatus.OK,
                self.metrics.render(),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        return self._static(path)

    def _update_gauges(self) -> None:
        self.metrics.store_available.set(0 if self.outbox.unavailable else 1)
        live = sum(1 for s in self.sessions.sessions.values() if s.link is not None)
        self.metrics.sessions.labels("live").set(live)
        self.metrics.sessions.labels("parked").set(len(self.sessions.sessions) - live)
        for kind, count in self.tracked().items():
            self.metrics.tracked.labels(kind).set(count)

    def tracked(self) -> dict[str, int]:
        """Per-session and per-user entries held now, by kind (SPEC E3, case F33): each
        goes back to its baseline once the sessions ended and their work is done."""
        counts = {
            "sessions": len(self.sessions.sessions),
            "session_owners": self.sessions.owners(),
            "calls_tracked": self.pipeline.tracked_calls(),
            "approvals": len(self.approvals.pending),
            **self.jobs.tracked(),
        }
        for lane in (self.workers.calls, self.workers.jobs):
            stats = lane.stats()
            counts[f"{lane.name}_threads_held"] = stats.busy
            counts[f"{lane.name}_thread_sessions"] = stats.sessions
            counts[f"{lane.name}_thread_users"] = stats.users
            counts[f"{lane.name}_thread_waiters"] = stats.waiting
        return counts

    def _static(self, path: str) -> Response:
        """The console's files, looked up by name in a table built at start: a request
        path never reaches the filesystem, so no traversal or odd byte can (SPEC K2).
        ``/voice`` is the worked voice example's page (SPEC V3)."""
        pages = {"/": "index.html", "": "index.html", "/voice": "voice.html"}
        name = pages.get(path) or path.removeprefix("/")
        found = self._files.get(name.removeprefix("static/"))
        if found is None:
            return _response(http.HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
        return _response(http.HTTPStatus.OK, *found)


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
    if on_started is not None:
        on_started(gateway)
    try:
        await stop.wait()
    finally:
        await gateway.drain()
