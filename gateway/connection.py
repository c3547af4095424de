"""One WebSocket connection: hello, the session it opens or resumes, and its messages.

The sans-I/O :class:`protocol.connection_state.Connection` says what is legal; this module does
the I/O around it. ``hello`` is opened by :class:`gateway.hello.SessionOpener`; the
client messages after it are dispatched through the table
:data:`ConnectionHandler.BY_CLASS` (message class -> method), not an if-chain or method
names, and answered by :class:`gateway.session_requests.SessionRequests`. Every error
becomes either an ``error`` reply or a close, in
:meth:`ConnectionHandler._protocol_error`; an unexpected exception closes 1011 with no
reason text and is logged with its traceback. The handler takes its parts as one
:class:`ConnectionParts`, built once before serving (:mod:`gateway.wiring`), never the
server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel

from gateway.config import ServerConfig
from gateway.hello import Refused, SessionOpener
from gateway.metrics import Metrics
from gateway.outbox import Link, Outbox
from gateway.session import Session, SessionTable, TokenBucket
from gateway.session_requests import SessionRequests
from gateway.store import StoreUnavailable
from gateway.wslib import ConnectionClosed, Socket
from protocol import messages as m
from protocol.codec import encode
from protocol.connection_state import Connection, Ignored, State
from protocol.errors import CloseCode, ErrorCode, ProtocolError, StateError, close_reason
from protocol.messages import type_name

__all__ = [
    "ConnectionHandler",
    "ConnectionParts",
    "Refused",
    "bucket_factory",
    "count_close",
    "drop_replaced",
    "held",
    "refuse_unavailable",
]

logger = logging.getLogger("gateway.connection")


@dataclass(frozen=True, slots=True)
class ConnectionParts:
    """What every connection uses, built once before serving (:mod:`gateway.wiring`).

    Attributes:
        server: the server settings (hello timeout, depth, outbound bound, drain hint).
        opener: opens or resumes the session of a ``hello`` (SPEC S1, S2, D3, D4).
        requests: answers an open session's requests (SPEC C3, I, A3, J3, S5, S6).
        sessions: the session table (a closed socket parks its session, SPEC D2).
        outbox: flushed before a lapsed credential's close (SPEC S6).
        metrics: the server's metrics.
        clock: Unix time in seconds.
        draining: ``True`` once the server drains: a hello starts nothing (SPEC S4).
    """

    server: ServerConfig
    opener: SessionOpener
    requests: SessionRequests
    sessions: SessionTable
    outbox: Outbox
    metrics: Metrics
    clock: Callable[[], float]
    draining: Callable[[], bool]


class ConnectionHandler:
    """Serves one socket from the upgrade to the close (SPEC S1-S5, D3-D5, E1).

    Args:
        parts: what every connection uses, built once (:func:`gateway.wiring`).
        ws: the accepted WebSocket connection.
    """

    BY_CLASS: ClassVar[dict[type[BaseModel], Callable[[ConnectionHandler, Any], None]]]
    """The dispatch table (SPEC S1): client message class -> handler method, filled in
    below the class. A class the protocol accepts once open but this table lacks is a
    lookup miss that ``tests/gateway/test_dispatch_table.py`` finds before a client."""
    TABLE: ClassVar[dict[str, str]]
    """The same table by wire type name -> method name, for docs and tests."""

    def __init__(self, parts: ConnectionParts, ws: Socket) -> None:
        self.parts = parts
        self.requests = parts.requests
        self.ws = ws
        cfg = parts.server
        self.state = Connection(time.monotonic(), cfg.hello_timeout, cfg.max_depth)
        self.link = Link(ws, cfg.max_outbound_bytes)
        self.session: Session | None = None
        self._reading = True  # False once a message stopped the reading (either path)
        self.log: logging.LoggerAdapter[logging.Logger] = logging.LoggerAdapter(logger, {})
        self._closing: asyncio.Task[None] | None = None
        self._debug = logger.isEnabledFor(logging.DEBUG)
        """Cached once per connection: the receive loop is the hot path."""

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
            count_close(self.ws, self.parts.metrics)
            self.state.closed()
            self.link.detach()
            session = self.session
            if session is not None:
                self.parts.sessions.park(session, self.link, self.parts.clock())
                self.log.info("socket closed; session parked")

    async def _handshake(self) -> bool:
        timeout = self.parts.server.hello_timeout or None
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
        if self.parts.draining():
            # SPEC S4: a hello that arrives during a drain starts nothing here.
            hint = m.Reconnect(
                reason="server restart", retry_after=self.parts.server.drain_retry_after
            )
            self.link.push(encode(hint))
            self._flush_and_close(CloseCode.SERVICE_RESTART, "server restart")
            return False
        try:
            self.parts.opener.open(received, self.ws, self.link, self.state, self._adopt)
        except Refused as refusal:
            self.parts.metrics.errors.labels(refusal.code.value).inc()
            self.link.push(
                encode(m.Error(id=received.id, code=refusal.code, message=refusal.message))
            )
            await self.link.flush_and_close(refusal.close, close_reason(refusal.message))
            return False
        return True

    def _adopt(self, session: Session) -> None:
        """The hello's session is known: this socket parks it when it closes."""
        self.session = session
        self.log = logging.LoggerAdapter(logger, {"session": session.id})

    async def _loop(self) -> None:
        """Read until the connection closes or stops taking requests. A whole text message
        goes to :meth:`_on_text` from the read callback (``Socket.on_text``, no task
        wake-up, issue 13); binary frames, fragments and what arrives while a message
        read here is handled come through ``recv``, in order."""
        ws, state = self.ws, self.state
        ws.on_text = self._on_text
        try:
            while self._reading:
                raw = await ws.recv()
                received = state.receive_binary() if isinstance(raw, bytes) else state.receive(raw)
                if not (self._reading and self._handle(received)):
                    return  # nothing after the message that stopped it is handled
        finally:
            self._reading = False
            ws.on_text = None

    def _on_text(self, raw: str) -> None:
        """A whole text message from the read callback; errors end as in :meth:`serve`
        (1011, logged). Once a message stopped the reading, nothing more is handled."""
        if not self._reading:
            return
        try:
            if self._handle(self.state.receive(raw)):
                return
        except ConnectionClosed:
            pass  # as in serve: the reader ends on the same close
        except Exception:
            self.log.exception("internal error; closing 1011")
            self._close(CloseCode.INTERNAL_ERROR, "")
        self._reading = False  # the reader, in recv, ends at its next message or the close
        self.ws.on_text = None

    def _handle(self, received: m.ClientMessage | ProtocolError | Ignored) -> bool:
        """Answer one received message; ``False`` when the connection takes no more."""
        if (session := self.session) is None or session.link is not self.link:
            return drop_replaced(received, self.state, self.log)  # SPEC D4, N2
        if isinstance(received, Ignored):
            return True
        if isinstance(received, ProtocolError):
            return self._protocol_error(received, session)
        if self._debug:
            self.log.debug("received %s", received.type)  # the type only, never payloads
        try:
            self.BY_CLASS[type(received)](self, received)
        except StoreUnavailable as exc:
            refuse_unavailable(session, received, exc, self.parts.metrics, self.log)
        # A closed link (slow consumer, writer failure) takes no more requests: their
        # events would pile up in a log nobody reads (SPEC D5).
        return not (self.state.state is State.CLOSING or self.link.closed)

    def _protocol_error(self, error: ProtocolError, session: Session) -> bool:
        """Answer or close for one protocol error (SPEC E1); ``False`` when closing."""
        if error.close is not None:
            self._fail(error)
            return False
        self.parts.metrics.errors.labels(error.code.value).inc()
        session.emit_raw(
            encode(m.Error(id=error.request_id, code=error.code, message=error.message))
        )
        return True

    def _fail(self, error: ProtocolError, close: CloseCode | None = None) -> None:
        """Send ``error``, then close with ``close`` (default: the error's own close code)."""
        code = close or error.close
        assert code is not None
        self.parts.metrics.errors.labels(error.code.value).inc()
        # What is queued goes first: a link takes nothing once its close began.
        self.parts.outbox.flush()
        self.link.push(encode(m.Error(id=error.request_id, code=error.code, message=error.message)))
        self._flush_and_close(code, close_reason(error.message))
        self.state.start_closing()

    def _flush_and_close(self, code: CloseCode, reason: str) -> None:
        """Send what is queued, then close; :meth:`serve` awaits it before returning.
        Nothing pushed from now on is sent (SPEC S4: a ``reconnect`` hint stays last)."""
        closing = self.link.flush_and_close(code, reason)
        self._closing = asyncio.get_running_loop().create_task(closing)

    def _close(self, code: CloseCode, reason: str) -> None:
        self.link.close(code, reason)
        self.state.start_closing()

    def close_lapsed(self, code: CloseCode, reason: str, hint: bytes | None = None) -> None:
        """SPEC S6: the credential expired or was revoked; close with its typed code.
        SPEC N6: the socket's lifetime ended; ``hint`` (a ``reconnect``) then 1012.
        The session is parked as after any drop; its resume authenticates afresh."""
        if self.state.state is not State.OPEN:
            return
        self.log.info("closing %d: %s", int(code), reason)
        # What is queued for this socket (an auth.expiring due in the same loop turn,
        # events) goes out before the close, not dropped by it.
        self.parts.outbox.flush()
        if hint is not None:
            self.link.push(hint)
        self._flush_and_close(code, close_reason(reason))
        self.state.start_closing()

    # -- messages (state OPEN): each a line into SessionRequests ------------------------

    @property
    def s(self) -> Session:
        assert self.session is not None
        return self.session

    def _current(self) -> Session | None:
        return held(self.session, self.link)

    def on_catalog_get(self, msg: m.CatalogGet) -> None:
        self.requests.catalog_get(self.s, msg)

    def on_invoke(self, msg: m.Invoke) -> None:
        self.requests.invoke(self.s, msg)

    def on_call_cancel(self, msg: m.CallCancel) -> None:
        self.requests.call_cancel(self.s, msg)

    def on_tool_confirm(self, msg: m.ToolConfirm) -> None:
        self.requests.tool_confirm(self.s, msg)

    def on_elicit_answer(self, msg: m.ElicitAnswer) -> None:
        self.requests.elicit_answer(self.s, msg)

    def on_grants_list(self, msg: m.GrantsList) -> None:
        self.requests.grants_list(self.s, msg)

    def on_grants_revoke(self, msg: m.GrantsRevoke) -> None:
        self.requests.grants_revoke(self.s, msg)

    def on_job_get(self, msg: m.JobGet) -> None:
        self.requests.job_requests.job_get(self.s, msg)

    def on_job_list(self, msg: m.JobList) -> None:
        self.requests.job_requests.job_list(self.s, msg)

    def on_job_cancel(self, msg: m.JobCancel) -> None:
        self.requests.job_requests.job_cancel(self.s, msg, self._current)

    def on_ack(self, msg: m.Ack) -> None:
        self.s.ack(msg.seq)

    def on_context_update(self, msg: m.ContextUpdate) -> None:
        self.requests.context_update(self.s, msg)

    def on_bye(self, msg: m.Bye) -> None:
        """End the session for good, close 4001 (SPEC A4, D6: ``SessionRequests.bye``)."""
        if not self.requests.bye(self.s, msg, self.parts.sessions):
            return
        self.session = None
        self._flush_and_close(CloseCode.SESSION_ENDED, "bye")
        self.state.start_closing()

    def on_auth_refresh(self, msg: m.AuthRefresh) -> None:
        self.requests.auth_refresh(self.s, msg)


ConnectionHandler.BY_CLASS = {
    m.CatalogGet: ConnectionHandler.on_catalog_get,
    m.Invoke: ConnectionHandler.on_invoke,
    m.CallCancel: ConnectionHandler.on_call_cancel,
    m.ToolConfirm: ConnectionHandler.on_tool_confirm,
    m.ElicitAnswer: ConnectionHandler.on_elicit_answer,
    m.GrantsList: ConnectionHandler.on_grants_list,
    m.GrantsRevoke: ConnectionHandler.on_grants_revoke,
    m.JobGet: ConnectionHandler.on_job_get,
    m.JobList: ConnectionHandler.on_job_list,
    m.JobCancel: ConnectionHandler.on_job_cancel,
    m.Ack: ConnectionHandler.on_ack,
    m.ContextUpdate: ConnectionHandler.on_context_update,
    m.Bye: ConnectionHandler.on_bye,
    m.AuthRefresh: ConnectionHandler.on_auth_refresh,
}
ConnectionHandler.TABLE = {
    type_name(cls): func.__name__ for cls, func in ConnectionHandler.BY_CLASS.items()
}


def held(session: Session | None, link: Link) -> Session | None:
    """``session`` while the socket of ``link`` holds it, else ``None`` (SPEC D4, N2): a
    resume on another socket took it over, or ``bye`` ended it. A late reply to this
    socket's request (``job.cancel``) never goes to the socket that took it over."""
    return session if session is not None and session.link is link else None


def drop_replaced(
    received: m.ClientMessage | ProtocolError | Ignored,
    state: Connection,
    log: logging.LoggerAdapter[logging.Logger],
) -> bool:
    """SPEC D4, N2: a frame from a socket whose session a resume took over (its link is
    no longer the session's and is being closed 4000). Nothing such a socket sends acts
    on the session any more, whatever it is (``invoke``, ``tool.confirm``, ``ack``,
    ``context.update``, ``bye``...): the frame is dropped unanswered, because the 4000
    close already tells the client, a reply through the session could only reach its
    new socket, and the closing link takes no more frames. Returns ``False``: the
    socket reads nothing more."""
    log.info("%s from a replaced socket dropped (SPEC D4)", getattr(received, "type", "frame"))
    state.start_closing()
    return False


def count_close(ws: Socket, metrics: Metrics) -> None:
    """Count the close this server started, by the code it sent (SPEC O2).

    The one place closes are counted: whichever path closed the socket (ours, a writer
    failure, or websockets itself for 1002, 1007 and 1009), the code is the one in the
    close frame sent. Closes the client started are not counted.
    """
    sent = ws.sent_close_code()
    if sent is not None:
        metrics.closes.labels(str(sent)).inc()


def refuse_unavailable(
    session: Session,
    msg: m.ClientMessage,
    exc: StoreUnavailable,
    metrics: Metrics,
    log: logging.LoggerAdapter[logging.Logger],
) -> None:
    """SPEC D6, N7: a store read this request needed failed (a networked store lost
    its connection). Nothing was started; the client gets a typed ``unavailable``
    and may send the same request again."""
    log.warning("request %s refused, store unavailable: %s", msg.type, exc)
    metrics.errors.labels(ErrorCode.UNAVAILABLE.value).inc()
    call_id = getattr(msg, "call_id", None)
    session.reply(
        m.Error(
            id=getattr(msg, "id", None),
            code=ErrorCode.UNAVAILABLE,
            message="the store cannot be read right now; try again later",
            details={"call_id": call_id} if isinstance(call_id, str) else None,
        )
    )


def bucket_factory(rate: float, burst: int) -> Callable[[], TokenBucket]:
    """Token buckets for new sessions (SPEC E2)."""

    def make() -> TokenBucket:
        return TokenBucket(rate, float(burst), float(burst), time.monotonic())

    return make
