"""toolbus as an MCP server: each profile's catalog over Streamable HTTP at ``/mcp`` (SPEC M4).

:class:`McpEndpoint` is an ASGI app (served by :mod:`gateway.mcp.route` on the gateway's
own port) in front of the official SDK's low-level :class:`mcp.server.lowlevel.Server`
and its :class:`~mcp.server.streamable_http_manager.StreamableHTTPSessionManager`; no
MCP protocol code is written here.

- Every request carries ``Authorization: Bearer <credential>``, checked by the gateway's
  authenticator (SPEC S2; missing or refused: HTTP 401). The profile comes from the
  ``X-Toolbus-Profile`` header or the ``profile`` query parameter, or is the only one
  granted (not granted: HTTP 403). Credentials in the URL are refused (HTTP 400).
  These checks are :class:`gateway.mcp.admit.HttpAdmission`'s.
- Each (tenant, user, profile) gets one internal toolbus :class:`~gateway.session.Session`
  whose outbound frames are read here instead of written to a socket (:class:`_Frames`).
- ``tools/list`` is that session's visible catalog in the MCP export format (SPEC C3, C4),
  without ``mode: client`` tools (they run in a toolbus client; called anyway: I3).
- ``tools/call`` is an ``invoke`` through the same pipeline as a WebSocket's (SPEC I1-I16:
  gates, hooks, audit, the I15 ledger with call id ``mcp:<mcp-session>:<request-id>``).
  An approval is asked with MCP elicitation when the client declared it, else the call
  is denied and ends with the A5 declined result; a mounted MCP server's question during
  the call (``elicit.request``, SPEC M3) is asked the same way, else answered
  ``decline`` (:class:`gateway.mcp.approve.HostAsker`). An async tool's job is awaited,
  its ``job.progress`` forwarded as ``notifications/progress``; no MCP task is offered
  (the SDK serves no ``tasks/*`` method), and a ``task`` in the request is ignored.
  Cancelling the request (``notifications/cancelled``) cancels the call and its job.
- A catalog pushed to an internal session (SPEC C3) sends ``tools/list_changed`` to
  every MCP client, whatever version it negotiated (:class:`gateway.mcp.notify.ListChanged`).
- Internal sessions are not the user's sockets: they do not count against
  ``limits.max_sessions_per_user`` (SPEC E2).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.subscriptions import ListenHandler
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import Message, Receive, Scope, Send

from catalog.compat import Finding
from catalog.exports import to_mcp_carried
from catalog.model import Mode
from catalog.visibility import Scope as Visibility
from catalog.visibility import visible_tools
from gateway.auth import Authenticator, Identity
from gateway.authority import Authority
from gateway.catalog_state import CatalogState
from gateway.jobs import JobRunner
from gateway.mcp.admit import HttpAdmission
from gateway.mcp.approve import HostAsker, Parked
from gateway.mcp.notify import ListChanged, ListChangedServer
from gateway.pipeline import Pipeline
from gateway.session import Session, SessionTable, TokenBucket
from protocol import messages as m
from protocol.codec import decode_json, params_problem
from protocol.errors import ErrorCode

logger = logging.getLogger("gateway.mcp.serve")


_Principal = tuple[Identity, str, str]
"""(identity, profile name, credential) of one authenticated request."""

_TERMINAL = frozenset({"result", "call.error", "error", "job.done", "job.failed", "job.cancelled"})
"""Frame types that end a ``tools/call`` (SPEC I12, J4)."""


class _Frames:
    """A session's link that hands each outbound frame to the call waiting for it.

    Frames name their call by ``call_id`` (an admission ``error`` by ``id``, which is the
    call id here); frames of no waiting call (``catalog``) are dropped. Every frame is
    acknowledged at once: it has reached its reader (SPEC D2).
    """

    backlogged = False
    closed = False

    def __init__(self, session: Session, on_change: Callable[[], None]) -> None:
        self.session = session
        self._on_change = on_change
        self.credential = ""
        """The credential the session is bound to now (SPEC S6)."""
        self.waiters: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.parked: Parked = {}
        """``request_state`` -> the approval or mounted server's question asked by an
        ``InputRequiredResult`` and not answered yet (SPEC A3, M3)."""

    def push(self, data: bytes) -> None:
        self.push_many([data])

    def push_many(self, frames: list[bytes]) -> None:
        for data in frames:
            frame = decode_json(data)
            if not isinstance(frame, dict):
                continue
            seq = frame.get("seq")
            if isinstance(seq, int):
                self.session.ack(seq)
            call_id = str(frame.get("call_id") or frame.get("id") or "")
            queue = self.waiters.get(call_id)
            if queue is not None:
                queue.put_nowait(frame)
            kind = frame.get("type")
            if kind == "catalog" and frame.get("reason") != "initial":
                self._on_change()  # SPEC C3 -> MCP list_changed
            elif kind == "tool.resolved" or kind in _TERMINAL:
                # An approval timed out or cancelled, or a call ended (its question
                # answered ``cancel`` at its deadline), before the retry came: no one
                # reads this call any more, and a retry for it is refused (SPEC A4, M3).
                self._unpark(call_id)

    def _unpark(self, call_id: str) -> None:
        """Forget the parked questions of ``call_id`` and, if it had any, its reader."""
        for state, asked in list(self.parked.items()):
            if asked.call_id == call_id:
                del self.parked[state]
                self.waiters.pop(call_id, None)

    def slow_consumer(self, why: str) -> None:
        """Never slow: frames are read as they are pushed."""

    def close(self, code: object, reason: str) -> None:
        """An internal session has no socket to close."""


class McpEndpoint:
    """The ``/mcp`` ASGI app and the calls it runs (SPEC M4); one per gateway.

    Args:
        authenticator: checks ``Authorization: Bearer`` (SPEC S2).
        sessions: where the internal sessions live.
        catalog: the catalog (SPEC C3).
        pipeline: runs calls (SPEC I1-I16).
        jobs: runs the jobs of async tools, cancelled with their request (SPEC J3, M4).
        asker: asks approvals and mounted servers' questions through MCP elicitation
            (SPEC A3, A5, M3).
        authority: binds each internal session's credential (SPEC S6).
        bucket: a new session's invoke token bucket (SPEC E2).
        clock: Unix time in seconds.
        credentials_in: ``(path, query) -> bool``: the URL names a credential (SPEC S2).
        origin_allowed: ``origin -> bool`` for requests that carry ``Origin``.
    """

    def __init__(
        self,
        authenticator: Authenticator,
        sessions: SessionTable,
        catalog: CatalogState,
        pipeline: Pipeline,
        jobs: JobRunner,
        asker: HostAsker,
        authority: Authority,
        bucket: Callable[[], TokenBucket],
        clock: Callable[[], float],
        credentials_in: Callable[[str, str], bool],
        origin_allowed: Callable[[str], bool],
    ) -> None:
        self.admission = HttpAdmission(authenticator, credentials_in, origin_allowed)
        """The HTTP checks before the SDK sees a request (SPEC S2)."""
        self.sessions = sessions
        self.catalog = catalog
        self.pipeline = pipeline
        self.jobs = jobs
        self.asker = asker
        """Approvals and mounted servers' questions asked through MCP elicitation
        (SPEC A3, A5, M3)."""
        self.authority = authority
        self.bucket = bucket
        self.clock = clock
        self.side_routes: Callable[[str, str], Any] | None = None
        """:meth:`gateway.http_front.SideRoutes.answer`, for a request off ``/mcp`` on a
        connection that began with one (a pooling client's, SPEC O2, M4)."""
        self._links: dict[tuple[str | None, str, str], _Frames] = {}
        self._left_out: set[str] = set()
        """Export findings of tools left out of ``tools/list``, logged once each (M4)."""
        self.changes = ListChanged()
        """``tools/list_changed`` to every MCP client on a catalog change (SPEC C3)."""
        self.server: Server[Any] = ListChangedServer(
            "toolbus",
            version="1",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self.changes.bus),
        )
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            # Origin is checked here against the gateway's allowlist (SPEC S2).
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's session manager, running while this context is open."""
        async with self.manager.run():
            yield

    # -- HTTP -----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if self.side_routes is not None and scope["path"].rstrip("/") != "/mcp":
            await _side_route(self.side_routes(scope["method"], scope["path"]), send)
            return
        refusal = self.admission.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if scope["method"] != "DELETE":
            await self.manager.handle_request(scope, receive, send)
            return
        # The client ends its MCP session; forgotten here only once the SDK ended it (a
        # DELETE naming another principal's session is refused 404: SPEC M4, A7).
        status = 0

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.manager.handle_request(scope, receive, watched)
        if status < 300:
            for key, value in scope["headers"]:
                if key.lower() == b"mcp-session-id":
                    self.changes.forget(value.decode("latin-1"))

    # -- sessions -------------------------------------------------------------------------

    def _link(self, principal: _Principal) -> _Frames:
        """The internal session of a (tenant, user, profile), made on first use; it runs
        on the credential of the latest request (SPEC S6: a fresh token renews it)."""
        identity, profile, credential = principal
        key = (identity.tenant, identity.user, profile)
        link = self._links.get(key)
        if link is not None and not link.session.ended:
            if link.credential != credential:
                link.credential = credential
                self.authority.bind(link.session, credential, identity)
            return link
        session, _ = self.sessions.new(
            identity.user,
            identity.tenant,
            self.catalog.current.profile(profile),
            {},
            {},
            self.bucket(),
            self.clock(),
            internal=True,  # not one of the user's sockets: not counted (SPEC E2)
        )
        link = _Frames(session, self.changes.changed)
        link.credential = credential
        self.sessions.attach(session, link)  # type: ignore[arg-type]
        self.catalog.push(session, m.CatalogReason.INITIAL, force=True)
        self.authority.bind(session, credential, identity)
        self._links[key] = link
        return link

    @staticmethod
    def _principal(ctx: ServerRequestContext[Any]) -> _Principal:
        request = ctx.request
        principal: _Principal = request.scope["state"]["toolbus"]  # type: ignore[union-attr]
        return principal

    # -- MCP handlers ---------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        session = self._link(self._principal(ctx)).session
        self.changes.remember(ctx)
        scope = Visibility(session.context, session.origin)
        # A `mode: client` tool runs in a toolbus client; an MCP host has none (I3).
        tools = [
            tool
            for tool in visible_tools(self.catalog.current, session.profile, scope)
            if tool.mode is not Mode.CLIENT
        ]
        entries, left_out = to_mcp_carried(tools)
        _log_left_out(left_out, self._left_out)
        return types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in entries])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        """SPEC M4: ``tools/call`` as an ``invoke``; a retry that carries ``request_state``
        answers the approval it was asked for and goes on waiting for the same call."""
        link = self._link(self._principal(ctx))
        session = link.session
        self.changes.remember(ctx)
        if params.request_state is not None:
            call_id = self.asker.answered(session, link.parked, params)
            if call_id is None:
                return _error("expired: this approval is no longer pending")
        else:
            request = ctx.request
            mcp_session = request.headers.get("mcp-session-id") if request is not None else None
            call_id = _call_id(mcp_session or uuid.uuid4().hex, ctx.request_id)
            if not 0 < len(params.name) <= m.NAME_MAX:
                # SPEC M4, I1: MCP bounds no name, toolbus does: no tool has this one, and
                # nothing is registered for the call (F33).
                shown = params.name[:40] + ("…" if len(params.name) > 40 else "")
                return _error(f"unknown_tool: no tool named {shown!r}")
            arguments = params.arguments or {}
            problem = params_problem(arguments)
            if problem is not None:
                # SPEC M4, E1, I4: the SDK reads any integer and 1e400 (as infinity); a
                # WebSocket invoke with them is refused by the codec, this one here,
                # with the same text. Nothing is registered for the call (F33).
                return _error(f"{ErrorCode.INVALID_PARAMS}: {problem}")
            if call_id in link.waiters:
                # SPEC I12: a second in-flight use of a call id is refused; the first
                # request keeps its queue and gets its one answer.
                return _error(
                    f"{ErrorCode.DUPLICATE_CALL}: request id {ctx.request_id} is still "
                    f"running in this MCP session"
                )
            invoke = m.Invoke(id=call_id, call_id=call_id, tool=params.name, params=arguments)
            link.waiters[call_id] = asyncio.Queue()
            try:
                self.pipeline.accept(session, invoke)
            except BaseException:
                link.waiters.pop(call_id, None)  # no frame will ever come for it (I12)
                raise
        queue = link.waiters[call_id]
        parked = False
        try:
            while True:
                done = await self._on_frame(ctx, link, call_id, await queue.get())
                if done is not None:
                    parked = isinstance(done, types.InputRequiredResult)
                    return done
        except BaseException:
            # Cancelled (``notifications/cancelled``) or failed: nobody reads this call
            # any more (SPEC M4, I8; A4: its slots are freed).
            self._cancel(session, call_id)
            raise
        finally:
            if not parked:
                link.waiters.pop(call_id, None)

    def _cancel(self, session: Session, call_id: str) -> None:
        """SPEC M3, M4, I8, J3: a cancelled ``tools/call`` cancels its toolbus call and
        the job it started (an async tool's, or a promoted call's: its request waits
        for that job, and has no job id to cancel it by)."""
        self.pipeline.cancel(session, call_id)
        # A scan of the active jobs, for a cancelled request only (not a hot path).
        for job_id, job in list(self.jobs.active.items()):
            if job.row.call_id == call_id and job.row.session_id == session.id:
                self.jobs.cancel(job_id)

    async def _on_frame(
        self, ctx: ServerRequestContext[Any], link: _Frames, call_id: str, frame: dict[str, Any]
    ) -> types.CallToolResult | types.InputRequiredResult | None:
        """One frame of a running call; the MCP result once the call is over."""
        kind = frame["type"]
        if kind == "tool_start" and frame.get("approval_id"):
            return await self.asker.ask(ctx, link.session, link.parked, call_id, frame)
        if kind == "elicit.request":  # SPEC M3: a mounted server asks the call's user
            return await self.asker.forward(ctx, link.session, link.parked, call_id, frame)
        if kind == "result":
            return _result(frame["result"])
        if kind == "job.done":
            return _job_result(frame)
        if kind in ("call.error", "error"):
            return _error(f"{frame['code']}: {frame['message']}")
        if kind in ("job.failed", "job.cancelled"):
            return _error(f"{kind}: {frame['summary']}")
        if kind == "dispatched":
            await ctx.session.report_progress(0.0, 1.0, frame["message"])
        elif kind == "job.progress":
            await ctx.session.report_progress(
                frame.get("progress") or 0.0, 1.0, frame.get("message")
            )
        return None


def _log_left_out(findings: list[Finding], logged: set[str]) -> None:
    """SPEC M4, C4: a tool MCP cannot carry is left out of ``tools/list``; each finding
    (tool, rule, message) is logged once, however often hosts list, so the operator
    learns which tool and why without a line per request."""
    for finding in findings:
        text = str(finding)
        if text not in logged:
            logged.add(text)
            logger.warning("tool %s left out of /mcp tools/list: %s", finding.tool, text)


def _result(value: dict[str, Any]) -> types.CallToolResult:
    text = json.dumps(value, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(text=text)], structured_content=value, is_error=False
    )


def _job_result(frame: dict[str, Any]) -> types.CallToolResult:
    """A finished job (SPEC J4): its summary as text; summary, result and artifacts
    (``[{"name", "mime_type", ...}]``) as structured content."""
    value = {
        "summary": frame["summary"],
        "result": frame["result"],
        "artifacts": frame["artifacts"],
    }
    return types.CallToolResult(
        content=[types.TextContent(text=frame["summary"])], structured_content=value
    )


def _call_id(mcp_session: str, request_id: Any) -> str:
    """The toolbus call id of one ``tools/call``: unique per MCP session and JSON-RPC id,
    hashed when it would be longer than a call id may be (``NAME_MAX``; SPEC M4, E1)."""
    call_id = f"mcp:{mcp_session}:{request_id}"
    if len(call_id) <= m.NAME_MAX:
        return call_id
    return "mcp:" + hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


async def _side_route(response: Any, send: Send) -> None:
    """A side route's answer (a websockets ``Response``: ``status_code``, ``headers``,
    ``body``) as an ASGI response (SPEC O2)."""
    headers = [
        (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.raw_items()
    ]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.body or b""})
