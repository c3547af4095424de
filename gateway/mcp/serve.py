"""toolbus as an MCP server: each profile's catalog over Streamable HTTP at ``/mcp`` (SPEC M4).

:class:`McpEndpoint` is an ASGI app (served by :mod:`gateway.mcp.route` on the gateway's
own port) in front of the official SDK's low-level :class:`mcp.server.lowlevel.Server`
and its :class:`~mcp.server.streamable_http_manager.StreamableHTTPSessionManager`; no
MCP protocol code is written here.

- Every request carries ``Authorization: Bearer <credential>``, checked by the gateway's
  authenticator (SPEC S2; missing or refused: HTTP 401). The profile comes from the
  ``X-Toolbus-Profile`` header or the ``profile`` query parameter, or is the only one
  granted (not granted: HTTP 403). Credentials in the URL are refused (HTTP 400).
- Each (tenant, user, profile) gets one internal toolbus :class:`~gateway.session.Session`
  whose outbound frames are read here instead of written to a socket (:class:`_Frames`).
- ``tools/list`` is that session's visible catalog in the MCP export format (SPEC C3, C4),
  without ``mode: client`` tools (they run in a toolbus client; called anyway: I3).
- ``tools/call`` is an ``invoke`` through the same pipeline as a WebSocket's (SPEC I1-I16:
  gates, hooks, audit, the I15 ledger with call id ``mcp:<mcp-session>:<request-id>``).
  An approval is asked with MCP elicitation when the client declared it, else the call
  is denied and ends with the A5 declined result. An async tool's job is awaited,
  its ``job.progress`` forwarded as ``notifications/progress``.
- A catalog pushed to an internal session (SPEC C3) publishes ``tools/list_changed`` to
  every ``subscriptions/listen`` stream (2026-07-28 clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qs

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send

from catalog.exports import to_mcp
from catalog.model import Mode
from catalog.visibility import Scope as Visibility
from catalog.visibility import visible_tools
from gateway.approvals import Approvals
from gateway.auth import Authenticator, AuthError, Identity, bearer
from gateway.authority import Authority
from gateway.catalog_state import CatalogState
from gateway.pipeline import Pipeline
from gateway.session import Session, SessionTable, TokenBucket
from protocol import messages as m
from protocol.codec import decode_json

logger = logging.getLogger("gateway.mcp.serve")

PROFILE_HEADER = "x-toolbus-profile"
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approve": {"type": "boolean", "title": "Allow this call?"}},
    "required": ["approve"],
}
"""The form an approval asks for (SPEC A3 through MCP elicitation, M4)."""

_Principal = tuple[Identity, str, str]
"""(identity, profile name, credential) of one authenticated request."""


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
        self.parked: dict[str, tuple[str, str]] = {}
        """``request_state`` -> (call id, approval id) of approvals asked by an
        ``InputRequiredResult`` and not answered yet."""

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
            if frame.get("type") == "catalog" and frame.get("reason") != "initial":
                self._on_change()  # SPEC C3 -> MCP list_changed
            elif frame.get("type") == "tool.resolved":
                # Timed out or cancelled before the retry came: no one reads this call
                # any more, and a retry for it is refused.
                for state, (parked_call, _) in list(self.parked.items()):
                    if parked_call == call_id:
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
        approvals: answered from elicitation results (SPEC A3).
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
        approvals: Approvals,
        authority: Authority,
        bucket: Callable[[], TokenBucket],
        clock: Callable[[], float],
        credentials_in: Callable[[str, str], bool],
        origin_allowed: Callable[[str], bool],
    ) -> None:
        self.authenticator = authenticator
        self.sessions = sessions
        self.catalog = catalog
        self.pipeline = pipeline
        self.approvals = approvals
        self.authority = authority
        self.bucket = bucket
        self.clock = clock
        self.credentials_in = credentials_in
        self.origin_allowed = origin_allowed
        self._links: dict[tuple[str | None, str, str], _Frames] = {}
        self.bus = InMemorySubscriptionBus()
        """``notifications/tools/list_changed`` to ``subscriptions/listen`` streams."""
        self._publishing: set[asyncio.Task[None]] = set()
        self.server: Server[Any] = Server(
            "toolbus",
            version="1",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self.bus),
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
        path, query = scope["path"], scope.get("query_string", b"").decode("latin-1")
        refusal = self._refusal(scope, path, query)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.manager.handle_request(scope, receive, send)

    def _refusal(self, scope: Scope, path: str, query: str) -> PlainTextResponse | None:
        """HTTP refusals before the SDK sees the request (SPEC S2)."""
        if path.rstrip("/") != "/mcp":
            return PlainTextResponse("not found\n", 404)
        if self.credentials_in(path, query):
            return PlainTextResponse(
                "credentials are not accepted in the URL; send Authorization: Bearer\n", 400
            )
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin):
            return PlainTextResponse("origin not allowed\n", 403)
        credential = bearer(headers.get("authorization"))
        try:
            identity = self.authenticator.authenticate(credential)
        except AuthError:
            return PlainTextResponse(
                "authentication failed\n", 401, headers={"WWW-Authenticate": "Bearer"}
            )
        asked: str | None = headers.get(PROFILE_HEADER) or next(
            iter(parse_qs(query).get("profile", [])), None
        )
        if asked is None and len(identity.profiles) == 1:
            asked = next(iter(identity.profiles))
        if asked is None or asked not in identity.profiles:
            granted = ", ".join(sorted(identity.profiles)) or "none"
            return PlainTextResponse(f"profile not granted; granted: {granted}\n", 403)
        scope.setdefault("state", {})["toolbus"] = (identity, asked, credential or "")
        return None

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
        )
        link = _Frames(session, self._catalog_changed)
        link.credential = credential
        self.sessions.attach(session, link)  # type: ignore[arg-type]
        self.catalog.push(session, m.CatalogReason.INITIAL, force=True)
        self.authority.bind(session, credential, identity)
        self._links[key] = link
        return link

    def _catalog_changed(self) -> None:
        """A session's catalog changed (SPEC C3): tell the listening MCP clients (M4).

        One bus for all principals: a listener may hear of another profile's change and
        list again to find its own unchanged; it never misses its own."""
        task = asyncio.get_running_loop().create_task(self.bus.publish(ToolsListChanged()))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

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
        scope = Visibility(session.context, session.origin)
        # A `mode: client` tool runs in a toolbus client; an MCP host has none (I3).
        tools = [
            tool
            for tool in visible_tools(self.catalog.current, session.profile, scope)
            if tool.mode is not Mode.CLIENT
        ]
        return types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in to_mcp(tools)])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        """SPEC M4: ``tools/call`` as an ``invoke``; a retry that carries ``request_state``
        answers the approval it was asked for and goes on waiting for the same call."""
        link = self._link(self._principal(ctx))
        session = link.session
        if params.request_state is not None:
            call_id = self._answered(link, params)
            if call_id is None:
                return _error("expired: this approval is no longer pending")
        else:
            request = ctx.request
            mcp_session = request.headers.get("mcp-session-id") if request is not None else None
            call_id = f"mcp:{mcp_session or uuid.uuid4().hex}:{ctx.request_id}"
            link.waiters[call_id] = asyncio.Queue()
            invoke = m.Invoke(
                id=call_id, call_id=call_id, tool=params.name, params=params.arguments or {}
            )
            self.pipeline.accept(session, invoke)
        queue = link.waiters[call_id]
        parked = False
        try:
            while True:
                done = await self._on_frame(ctx, link, call_id, await queue.get())
                if done is not None:
                    parked = isinstance(done, types.InputRequiredResult)
                    return done
        except asyncio.CancelledError:
            self.pipeline.cancel(session, call_id)
            raise
        finally:
            if not parked:
                link.waiters.pop(call_id, None)

    def _answered(self, link: _Frames, params: types.CallToolRequestParams) -> str | None:
        """The call a retry belongs to, after applying its approval answer (SPEC A3)."""
        asked = link.parked.pop(str(params.request_state), None)
        if asked is None:
            return None
        call_id, approval_id = asked
        answer = (params.input_responses or {}).get("approval")
        self.approvals.confirm(link.session.id, link.session.user, approval_id, _decision(answer))
        return call_id

    async def _on_frame(
        self, ctx: ServerRequestContext[Any], link: _Frames, call_id: str, frame: dict[str, Any]
    ) -> types.CallToolResult | types.InputRequiredResult | None:
        """One frame of a running call; the MCP result once the call is over."""
        kind = frame["type"]
        if kind == "tool_start" and frame.get("approval_id"):
            return await self._approve(ctx, link, call_id, frame)
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

    async def _approve(
        self, ctx: ServerRequestContext[Any], link: _Frames, call_id: str, frame: dict[str, Any]
    ) -> types.InputRequiredResult | None:
        """SPEC A3 via MCP elicitation; SPEC A5 (declined) when the client cannot be asked.

        A 2026-07-28 client is asked with an ``InputRequiredResult`` (the call waits for
        its retry, the state a random key held here); an older one with
        ``elicitation/create`` on the request's stream.
        """
        session = link.session
        capabilities = ctx.session.client_capabilities
        if capabilities is None or capabilities.elicitation is None:
            self.approvals.confirm(session.id, session.user, frame["approval_id"], m.Decision.DENY)
            return None
        form = types.ElicitRequestFormParams(
            message=f"Allow {frame['tool']} with {json.dumps(frame['params'])}?",
            requested_schema=APPROVAL_SCHEMA,
        )
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            state = secrets.token_urlsafe(24)
            link.parked[state] = (call_id, frame["approval_id"])
            return types.InputRequiredResult(
                input_requests={"approval": types.ElicitRequest(params=form)},
                request_state=state,
            )
        answer = await ctx.session.elicit_form(form.message, form.requested_schema, ctx.request_id)
        self.approvals.confirm(session.id, session.user, frame["approval_id"], _decision(answer))
        return None


def _decision(answer: object) -> m.Decision:
    """``allow`` only for an accepted form whose ``approve`` is true (SPEC A3)."""
    if (
        isinstance(answer, types.ElicitResult)
        and answer.action == "accept"
        and (answer.content or {}).get("approve") is True
    ):
        return m.Decision.ALLOW
    return m.Decision.DENY


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


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
