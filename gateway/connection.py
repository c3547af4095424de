"""One WebSocket connection: hello, the session it opens or resumes, and its messages.

The sans-I/O :class:`protocol.session.Connection` says what is legal; this module does
the I/O around it. Client messages are dispatched through the table
:data:`Handler.TABLE` (type -> method), not an if-chain. Every error becomes either an
``error`` reply or a close, in :meth:`Handler._protocol_error`; an unexpected exception
closes 1011 with no reason text and is logged with its traceback (STYLE.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from gateway.auth import AuthError, Identity, bearer
from gateway.jobs import job_info
from gateway.outbox import Link, Replay
from gateway.session import Session, TokenBucket
from protocol import messages as m
from protocol.codec import encode, encode_json
from protocol.errors import CloseCode, ErrorCode, ProtocolError, StateError, close_reason
from protocol.session import Connection, Ignored, State
from protocol.version import SUBPROTOCOL_V1

if TYPE_CHECKING:
    from gateway.server import Gateway

logger = logging.getLogger("gateway.connection")

REPLAY_PAGE = 256
"""Events read from the store per page while replaying (SPEC D3)."""


class Refused(Exception):
    """``hello`` was refused: send ``error`` with ``code``, then close."""

    def __init__(self, code: ErrorCode, message: str, close: CloseCode) -> None:
        super().__init__(message)
        self.code, self.message, self.close = code, message, close


class Handler:
    """Serves one socket from the upgrade to the close (SPEC S1-S5, D3-D5, E1)."""

    TABLE: ClassVar[dict[str, str]] = {
        "catalog.get": "on_catalog_get",
        "invoke": "on_invoke",
        "call.cancel": "on_call_cancel",
        "tool.confirm": "on_tool_confirm",
        "grants.list": "on_grants_list",
        "grants.revoke": "on_grants_revoke",
        "job.get": "on_job_get",
        "job.list": "on_job_list",
        "job.cancel": "on_job_cancel",
        "ack": "on_ack",
        "context.update": "on_context_update",
        "bye": "on_bye",
    }

    def __init__(self, gateway: Gateway, ws: ServerConnection) -> None:
        self.gw = gateway
        self.ws = ws
        cfg = gateway.settings.server
        self.state = Connection(time.monotonic(), cfg.hello_timeout, cfg.max_depth)
        self.link = Link(ws, cfg.max_outbound_bytes, self._on_overflow)
        self.session: Session | None = None
        self.log: logging.LoggerAdapter[logging.Logger] = logging.LoggerAdapter(logger, {})
        self._closing: asyncio.Task[None] | None = None
        self._debug = logger.isEnabledFor(logging.DEBUG)
        """Cached once per connection: the receive loop is the hot path (STYLE.md)."""

    def _on_overflow(self) -> None:
        self.gw.metrics.closes.labels(str(int(CloseCode.TRY_AGAIN_LATER))).inc()

    # -- lifecycle -----------------------------------------------------------------------

    async def serve(self) -> None:
        """Run the connection until it closes; park the session for resume (SPEC D2)."""
        try:
            if await self._handshake():
                await self._loop()
        except ConnectionClosed:
            pass
        except Exception:
            self.log.exception("internal error; closing 1011")
            self._close(CloseCode.INTERNAL_ERROR, "")
        finally:
            # A close we started must be sent before this handler returns: websockets
            # closes the connection 1000 as soon as it does.
            closing = self._closing or self.link.closer
            if closing is not None:
                await asyncio.shield(closing)
            self.state.closed()
            self.link.detach()
            session = self.session
            if session is not None:
                self.gw.sessions.park(session, self.link, self.gw.clock())
                self.log.info("socket closed; session parked")

    async def _handshake(self) -> bool:
        timeout = self.gw.settings.server.hello_timeout or None
        try:
            async with asyncio.timeout(timeout):
                raw = await self.ws.recv()
        except TimeoutError:
            self._fail(StateError(ErrorCode.HELLO_TIMEOUT, "no hello in time"))
            return False
        received = (
            self.state.receive_binary() if isinstance(raw, bytes) else self.state.receive(raw)
        )
        if isinstance(received, ProtocolError):
            # SPEC S1: a first frame that is not a valid hello ends the connection 1008,
            # whatever was wrong with it; the error still names the exact problem.
            self._fail(received, received.close or CloseCode.POLICY_VIOLATION)
            return False
        assert isinstance(received, m.Hello)
        if self.gw.draining:
            # SPEC S4: a hello that arrives during a drain starts nothing here.
            hint = m.Reconnect(
                reason="server restart", retry_after=self.gw.settings.server.drain_retry_after
            )
            self.link.push(encode(hint))
            self._flush_and_close(CloseCode.SERVICE_RESTART, "server restart")
            return False
        try:
            self._open(received)
        except Refused as refusal:
            self.gw.metrics.errors.labels(refusal.code.value).inc()
            self.link.push(
                encode(m.Error(id=received.id, code=refusal.code, message=refusal.message))
            )
            await self.link.flush_and_close(refusal.close, close_reason(refusal.message))
            self.gw.metrics.closes.labels(str(int(refusal.close))).inc()
            return False
        return True

    async def _loop(self) -> None:
        while True:
            raw = await self.ws.recv()
            received = (
                self.state.receive_binary() if isinstance(raw, bytes) else self.state.receive(raw)
            )
            if isinstance(received, Ignored):
                continue
            if isinstance(received, ProtocolError):
                if not self._protocol_error(received):
                    return
                continue
            if self._debug:
                self.log.debug("received %s", received.type)  # the type only, never payloads
            getattr(self, self.TABLE[received.type])(received)
            if self.state.state is State.CLOSING:
                return

    def _protocol_error(self, error: ProtocolError) -> bool:
        """Answer or close for one protocol error (SPEC E1); ``False`` when closing."""
        if error.close is not None:
            self._fail(error)
            return False
        self.gw.metrics.errors.labels(error.code.value).inc()
        frame = encode(m.Error(id=error.request_id, code=error.code, message=error.message))
        if self.session is not None:
            self.session.emit_raw(frame)
        else:
            self.link.push(frame)
        return True

    def _fail(self, error: ProtocolError, close: CloseCode | None = None) -> None:
        """Send ``error``, then close with ``close`` (default: the error's own close code)."""
        code = close or error.close
        assert code is not None
        self.gw.metrics.errors.labels(error.code.value).inc()
        self.link.push(encode(m.Error(id=error.request_id, code=error.code, message=error.message)))
        self._flush_and_close(code, close_reason(error.message))
        self.gw.metrics.closes.labels(str(int(code))).inc()
        self.state.start_closing()

    def _flush_and_close(self, code: CloseCode, reason: str) -> None:
        """Send what is queued, then close; :meth:`serve` awaits it before returning."""
        closing = self.link.flush_and_close(code, reason)
        self._closing = asyncio.get_running_loop().create_task(closing)

    def _close(self, code: CloseCode, reason: str) -> None:
        self.gw.metrics.closes.labels(str(int(code))).inc()
        self.link.close(code, reason)
        self.state.start_closing()

    # -- hello (SPEC S1, S2, D3, D4) -----------------------------------------------------

    def _identity(self, hello: m.Hello) -> Identity:
        credential = hello.token or bearer(
            self.ws.request.headers.get("Authorization") if self.ws.request else None
        )
        try:
            return self.gw.authenticator.authenticate(credential)
        except AuthError as exc:
            self.log.warning("authentication failed: %s", exc)
            raise Refused(
                ErrorCode.AUTH_FAILED, "authentication failed", CloseCode.AUTH_FAILED
            ) from exc

    def _open(self, hello: m.Hello) -> None:
        identity = self._identity(hello)
        gw = self.gw
        session, resumed = self._resumable(hello, identity)
        if session is None:
            session = self._new_session(hello, identity)
        self.session = session
        self.log = logging.LoggerAdapter(logger, {"session": session.id})
        session.origin = self._origin()
        gw.outbox.flush()
        old = gw.sessions.attach(session, self.link)
        if old is not None:
            self.log.info("session taken over by a new socket (SPEC D4)")
            old.close(CloseCode.SESSION_REPLACED, "session resumed on another connection")
        self.state.accept_hello()
        gw.metrics.connections.inc()
        token = self._resume_token
        self.link.push(encode(self._welcome(hello, session, token, resumed)))
        if resumed:
            self._replay(session, hello.last_seq or 0)
            gw.catalog.push(session, m.CatalogReason.RELOAD)
        else:
            gw.catalog.push(session, m.CatalogReason.INITIAL, force=True)
        self.log.info("session %s (resumed=%s, user=%s)", session.id, resumed, session.user)

    _resume_token: str = ""

    def _resumable(self, hello: m.Hello, identity: Identity) -> tuple[Session | None, bool]:
        session = self.gw.sessions.get(hello.session_id)
        if (
            session is None
            or not hello.resume_token
            or not session.token_matches(hello.resume_token)
        ):
            return None, False
        if (session.user, session.tenant) != (identity.user, identity.tenant) or (
            hello.profile and hello.profile != session.profile.name
        ):
            return None, False
        last = hello.last_seq or 0
        if last < session.floor_seq or last > session.last_seq:
            # SPEC D3: the history no longer reaches back (or the client claims events it
            # was never sent): resumed false. The old session is left alone, parked
            # until its own window ends; a client mistake does not cancel its work.
            return None, False
        self._resume_token = hello.resume_token
        return session, True

    def _new_session(self, hello: m.Hello, identity: Identity) -> Session:
        gw = self.gw
        name = hello.profile
        if name is None and len(identity.profiles) == 1:
            name = next(iter(identity.profiles))
        if name is None or name not in identity.profiles:
            granted = ", ".join(sorted(identity.profiles)) or "none"
            asked = "hello names no profile" if name is None else f"profile {name!r} is not granted"
            raise Refused(
                ErrorCode.PROFILE_DENIED, f"{asked}; granted: {granted}", CloseCode.AUTH_FAILED
            )
        limits = gw.settings.limits
        if gw.sessions.count_for(identity.user, identity.tenant) >= limits.max_sessions_per_user:
            raise Refused(
                ErrorCode.TOO_MANY_SESSIONS,
                "too many sessions for this user",
                CloseCode.TRY_AGAIN_LATER,
            )
        if self._context_too_large(hello.context):
            raise Refused(
                ErrorCode.CONTEXT_TOO_LARGE,
                f"context over {limits.max_context_bytes} bytes",
                CloseCode.POLICY_VIOLATION,
            )
        profile = gw.catalog.current.profile(name)
        session, token = gw.sessions.new(
            identity.user,
            identity.tenant,
            profile,
            dict(hello.context),
            hello.options.model_dump(),
            gw.bucket(),
            gw.clock(),
        )
        self._resume_token = token
        return session

    def _origin(self) -> str | None:
        request = self.ws.request
        return request.headers.get("Origin") if request is not None else None

    def _welcome(self, hello: m.Hello, session: Session, token: str, resumed: bool) -> m.Welcome:
        return m.Welcome(
            id=hello.id,
            protocol=SUBPROTOCOL_V1,
            session_id=session.id,
            resume_token=token,
            resumed=resumed,
            last_seq=session.last_seq,
            user=session.user,
            profile=session.profile.name,
            limits=self.gw.limits,
        )

    def _replay(self, session: Session, after: int) -> None:
        """SPEC D3: every logged event after ``after``, in order, once, then live.

        The events are read a page at a time as the socket takes them (SPEC D5: a long
        backlog must not overflow the bounded queue); events emitted from now on queue
        behind the replay.
        """
        if after >= session.last_seq:
            return
        store, session_id = self.gw.store, session.id

        def page(cursor: int) -> list[tuple[int, bytes]]:
            return store.events_after(session_id, cursor, REPLAY_PAGE)

        self.link.push_replay(Replay(page, after, session.last_seq))
        self.gw.metrics.replayed.inc(session.last_seq - after)

    # -- messages (state OPEN) -------------------------------------------------------------

    @property
    def s(self) -> Session:
        assert self.session is not None
        return self.session

    def on_catalog_get(self, msg: m.CatalogGet) -> None:
        """SPEC C3: "not modified" when the client's version is current."""
        version, _, _ = self.gw.catalog.view(self.s)
        if msg.version is not None and msg.version == version == self.s.catalog_version:
            self.s.reply(m.CatalogNotModified(id=msg.id, version=version))
            return
        self.gw.catalog.push(self.s, m.CatalogReason.REQUESTED, force=True, request_id=msg.id)

    def on_invoke(self, msg: m.Invoke) -> None:
        self.gw.pipeline.accept(self.s, msg)

    def on_call_cancel(self, msg: m.CallCancel) -> None:
        if not self.gw.pipeline.cancel(self.s, msg.call_id):
            self._error(msg.id, ErrorCode.UNKNOWN_CALL, f"no running call {msg.call_id!r}")

    def on_tool_confirm(self, msg: m.ToolConfirm) -> None:
        """SPEC A3: first decision wins; anything else is "not accepted" with a reason."""
        reason = self.gw.approvals.confirm(self.s.id, self.s.user, msg.approval_id, msg.decision)
        self.s.reply(
            m.ConfirmResult(
                id=msg.id, approval_id=msg.approval_id, accepted=reason is None, reason=reason
            )
        )

    def on_grants_list(self, msg: m.GrantsList) -> None:
        self.s.reply(m.Grants(id=msg.id, tools=sorted(self.s.grants)))

    def on_grants_revoke(self, msg: m.GrantsRevoke) -> None:
        if msg.tool not in self.s.grants:
            self._error(
                msg.id, ErrorCode.UNKNOWN_GRANT, f"no 'always allow' grant for {msg.tool!r}"
            )
            return
        self.s.grants.discard(msg.tool)
        self.s.save()
        self.s.reply(m.Grants(id=msg.id, tools=sorted(self.s.grants)))

    def _own_job(self, request_id: str | None, job_id: str) -> Any:
        """SPEC J3: only the caller's own jobs exist for it."""
        active = self.gw.jobs.active.get(job_id)
        row = active.row if active is not None else self.gw.store.job(job_id)
        if row is None or row.user != self.s.user or row.tenant != self.s.tenant:
            self._error(request_id, ErrorCode.UNKNOWN_JOB, f"no job {job_id!r}")
            return None
        return row

    def on_job_get(self, msg: m.JobGet) -> None:
        row = self._own_job(msg.id, msg.job_id)
        if row is not None:
            self.s.reply(m.Job(id=msg.id, job=job_info(row, self.gw.jobs.progress_of(row.job_id))))

    def on_job_list(self, msg: m.JobList) -> None:
        self.gw.outbox.flush()
        status = msg.status.value if msg.status is not None else None
        rows = self.gw.store.jobs(self.s.user, self.s.tenant, status, msg.limit)
        infos = [job_info(row, self.gw.jobs.progress_of(row.job_id)) for row in rows]
        self.s.reply(m.Jobs(id=msg.id, jobs=infos))

    def on_job_cancel(self, msg: m.JobCancel) -> None:
        row = self._own_job(msg.id, msg.job_id)
        if row is None:
            return
        task = self.gw.jobs.cancel(msg.job_id)
        if task is None:
            self._error(
                msg.id, ErrorCode.JOB_FINISHED, f"job {msg.job_id!r} already ended ({row.state})"
            )
            return
        asyncio.get_running_loop().create_task(self._reply_cancelled(msg, task))

    async def _reply_cancelled(self, msg: m.JobCancel, task: asyncio.Task[None]) -> None:
        """SPEC J3: answer ``job.cancel`` with the job's final state, once it is stored."""
        await asyncio.wait({task})
        row = self.gw.store.job(msg.job_id)
        session = self.session
        if row is not None and session is not None:
            session.reply(m.Job(id=msg.id, job=job_info(row)))

    def on_ack(self, msg: m.Ack) -> None:
        self.s.ack(msg.seq)

    def on_context_update(self, msg: m.ContextUpdate) -> None:
        """SPEC S5: change the context, answer it, re-push the catalog if it changed."""
        context = dict(self.s.context)
        for key, value in msg.context.items():
            if value is None:
                context.pop(key, None)
            else:
                context[key] = value
        if self._context_too_large(context):
            limit = self.gw.settings.limits.max_context_bytes
            self._error(msg.id, ErrorCode.CONTEXT_TOO_LARGE, f"context over {limit} bytes")
            return
        self.s.context = context
        self.s.save()
        self.s.reply(m.Context(id=msg.id, context=dict(context)))
        self.gw.catalog.push(self.s, m.CatalogReason.CONTEXT)

    def _context_too_large(self, context: dict[str, str]) -> bool:
        """SPEC S5/E2: a context is stored, echoed and re-sent; keep it bounded."""
        return len(encode_json(context)) > self.gw.settings.limits.max_context_bytes

    def on_bye(self, msg: m.Bye) -> None:
        """End the session for good, close 4001 (SPEC A4: pending approvals denied, no resume)."""
        session = self.s
        self.gw.sessions.end(session)
        self.session = None
        self.gw.metrics.closes.labels(str(int(CloseCode.SESSION_ENDED))).inc()
        self._flush_and_close(CloseCode.SESSION_ENDED, "bye")
        self.state.start_closing()

    def _error(self, request_id: str | None, code: ErrorCode, message: str) -> None:
        self.gw.metrics.errors.labels(code.value).inc()
        self.s.reply(m.Error(id=request_id, code=code, message=message))


def bucket_factory(rate: float, burst: int) -> Callable[[], TokenBucket]:
    """Token buckets for new sessions (SPEC E2)."""

    def make() -> TokenBucket:
        return TokenBucket(rate, float(burst), float(burst), time.monotonic())

    return make
