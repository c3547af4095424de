"""The connection of the toolbus client: handshake, read loop, reconnect and resume
(SPEC K1).

:class:`Link` is one part of :class:`toolbus.client.Client`. It opens the socket with
subprotocol ``toolbus.v1`` and says ``hello`` (SPEC S1), hands each frame to the
inbound part and acks cumulatively (SPEC D2), and when the socket drops or the server
drains (SPEC S4) reconnects with backoff, resumes with ``session_id``,
``resume_token`` and ``last_seq``, has the calls part re-send what still waits for an
answer (SPEC I12) and, after ``resumed: false``, the jobs part resync unfinished jobs
through ``job.get`` (SPEC D3). When the session cannot go on, it calls the client's
``end``, which fails everything waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.frames import Frame, Opcode
from websockets.protocol import Event
from websockets.typing import Subprotocol

from protocol import messages as m
from protocol.codec import decode_server, encode
from protocol.errors import CloseCode, DecodeError, ErrorCode
from toolbus.client_approvals import Approvals
from toolbus.client_calls import Calls
from toolbus.client_inbound import Inbound
from toolbus.client_jobs import Jobs
from toolbus.errors import ConnectFailed, SessionClosed
from toolbus.handles import Backoff

logger = logging.getLogger(__name__)

SUBPROTOCOL: Final = Subprotocol("toolbus.v1")

TERMINAL_CLOSES: Final = frozenset(
    {
        CloseCode.NORMAL_CLOSURE,
        CloseCode.PROTOCOL_ERROR,
        CloseCode.UNSUPPORTED_DATA,
        CloseCode.INVALID_FRAME_PAYLOAD_DATA,
        CloseCode.POLICY_VIOLATION,
        CloseCode.MESSAGE_TOO_BIG,
        CloseCode.SESSION_REPLACED,
        CloseCode.SESSION_ENDED,
        CloseCode.AUTH_FAILED,
        CloseCode.CREDENTIAL_EXPIRED,
        CloseCode.CREDENTIAL_REVOKED,
    }
)
"""Close codes after which reconnecting cannot help; others (1001, 1006, 1011, 1012,
1013) are retried with backoff."""

REFUSED_HELLO: Final = frozenset({ErrorCode.AUTH_FAILED, ErrorCode.PROFILE_DENIED})


WS_SCHEMES: Final = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}
"""URL scheme -> the WebSocket scheme to use (SPEC K1: http(s) is a common slip)."""


def require_ws_url(url: str) -> None:
    """Refuse a URL that is not ``ws://`` or ``wss://`` before websockets sees it.

    Raises:
        ConnectFailed: naming the URL and, for ``http(s)://``, the ``ws(s)://`` to use.
    """
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("ws", "wss"):
        return
    fixed = WS_SCHEMES.get(scheme.lower()) if sep else None
    example = f"{fixed}://{rest}" if fixed else "ws://127.0.0.1:8765/"
    raise ConnectFailed(
        f"{url!r} is not a WebSocket URL: toolbus needs a ws:// or wss:// URL, e.g. {example}"
    )


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """How a :class:`Link` connects; the arguments of :class:`toolbus.client.Client`."""

    url: str
    reconnect: bool
    backoff: Backoff
    connect_timeout: float
    ack_every: int
    ack_idle: float
    ws_options: Mapping[str, Any]


class Connection(ClientConnection):
    """websockets' client connection, handing whole messages to :attr:`on_message` as
    they are read (overrides websockets' ``process_event``).

    websockets queues each message in its assembler, sets a future and wakes the task
    awaiting ``recv``; the client's read loop then wakes the task awaiting the call:
    two task wake-ups, two loop turns, per frame (issue 13, P11). With
    :attr:`on_message` set, a text frame that is a whole message goes to it from the
    read callback instead, in arrival order: only while the assembler holds no frame,
    so it never overtakes a message ``recv`` will return (the read loop handles what
    ``recv`` returned before it awaits anything). Everything else (the handshake,
    fragments, binary and control frames) is websockets' own path. Below websockets'
    public API: ``process_event`` and ``recv_messages.frames``, as the gateway's
    ``gateway/wslib.py`` uses them; ``tests/gateway/test_wslib_seam.py`` pins both.
    """

    on_message: Callable[[bytes], None] | None = None

    def process_event(self, event: Event) -> None:
        on_message = self.on_message
        if (
            on_message is not None
            and type(event) is Frame
            and event.opcode is Opcode.TEXT
            and event.fin
            and not len(self.recv_messages.frames)
        ):
            on_message(bytes(event.data))
            return
        super().process_event(event)


HelloBuilder = Callable[[str | None, str | None, int | None], m.Hello]
"""Builds ``hello`` from ``session_id``, ``resume_token`` and ``last_seq`` (all ``None``
for a new session); the rest (token, profile, context, options) is the client's."""


class Link:
    """One session's socket: connect, read, ack, reconnect and resume (SPEC S1, D1-D3).

    Args:
        settings: where and how to connect.
        hello: builds the ``hello`` frame.
        inbound: the part each frame goes to; it keeps ``last_seq``.
        calls: what waits for an answer, re-sent after a reconnect (SPEC I12).
        jobs: resyncs unfinished jobs after ``resumed: false`` (SPEC D3).
        approvals: dropped when the session is not resumed (SPEC A4).
        spawn: runs a coroutine as a task the client cancels when it closes.
        stop: set when the client closes; the link then stops reconnecting.
        end: called once the session cannot go on (a final close, given up).
        ack: sends the cumulative ack on a socket (the client's, so it can be observed).
    """

    def __init__(
        self,
        settings: LinkSettings,
        hello: HelloBuilder,
        inbound: Inbound,
        calls: Calls,
        jobs: Jobs,
        approvals: Approvals,
        spawn: Callable[[Awaitable[Any]], None],
        stop: asyncio.Event,
        end: Callable[[SessionClosed], None],
        ack: Callable[[ClientConnection], Awaitable[None]],
    ) -> None:
        self._settings = settings
        self._make_hello = hello
        self._inbound = inbound
        self._calls = calls
        self._jobs = jobs
        self._approvals = approvals
        self._spawn = spawn
        self._stop = stop
        self._end = end
        self._send_ack = ack
        self.ws: ClientConnection | None = None
        """The live socket; ``None`` between connections and after the end."""
        self.gen = 0
        """How many sockets were attached (1 for the first)."""
        self.welcome: m.Welcome | None = None
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.reconnects = 0
        """How many times a new socket took over after the first."""
        self.acked = 0
        """The last ``seq`` acked."""
        self.last_frame = 0.0
        """Loop time the last frame arrived, in seconds."""
        self._ack_timer: asyncio.TimerHandle | None = None
        self._acking = False
        """An ack asked for by the read callback is being sent (:meth:`_message`)."""

    def _hello(self) -> m.Hello:
        if self.session_id is not None and self.resume_token is not None:
            return self._make_hello(self.session_id, self.resume_token, self._inbound.last_seq)
        return self._make_hello(None, None, None)

    async def handshake(self) -> tuple[ClientConnection, m.Welcome]:
        """Open a socket, send ``hello``, read ``welcome`` (SPEC S1, D3).

        Raises:
            ConnectFailed: not a ws:// or wss:// URL, refused upgrade, refused hello, or a
                close before welcome.
            OSError: the network failed.
        """
        options: dict[str, Any] = {
            "max_size": None,
            "compression": None,
            "create_connection": Connection,
            **self._settings.ws_options,
        }
        require_ws_url(self._settings.url)
        try:
            ws = await ws_connect(self._settings.url, subprotocols=[SUBPROTOCOL], **options)
        except InvalidURI as exc:
            raise ConnectFailed(f"not a valid WebSocket URL: {exc}") from exc
        except InvalidHandshake as exc:
            raise ConnectFailed(f"upgrade refused: {exc}") from exc
        try:
            await ws.send(encode(self._hello()), text=True)
            raw = await ws.recv(decode=False)
        except ConnectionClosed as exc:
            raise ConnectFailed(f"closed before welcome ({_close_text(exc)})") from exc
        message = decode_server(raw)
        if isinstance(message, m.Welcome):
            return ws, message
        await ws.close()
        if isinstance(message, m.Error):
            raise ConnectFailed(f"hello refused: {message.code}: {message.message}", message.code)
        raise ConnectFailed(f"expected welcome, got {message!r}")

    def attach(self, ws: ClientConnection, welcome: m.Welcome) -> None:
        """Make ``ws`` the live socket; on a fresh session, start the seq count over."""
        if self.gen:
            self.reconnects += 1
        if not welcome.resumed:
            if self.session_id is not None:
                logger.info(
                    "session %s not resumed; new session %s", self.session_id, welcome.session_id
                )
            self._inbound.last_seq = self.acked = 0
            self._approvals.drop()
        self.ws, self.gen, self.welcome = ws, self.gen + 1, welcome
        self.session_id, self.resume_token = welcome.session_id, welcome.resume_token

    async def run(self, ws: ClientConnection) -> None:
        """Read the socket; reconnect and resume while the session can go on."""
        while True:
            code, reason = await self._read(ws)
            self.ws = None
            if self._stop.is_set():
                return
            if not self._settings.reconnect or code in TERMINAL_CLOSES:
                text = f"closed by the server: {code} {reason}".strip()
                self._end(SessionClosed(text, code, reason))
                return
            logger.info("socket closed (%s %s); reconnecting", code, reason)
            resumed = await self._reconnect()
            if resumed is None:
                return
            ws = resumed

    async def _read(self, ws: ClientConnection) -> tuple[int | None, str]:
        """Process frames until the socket closes; returns its close code and reason.

        An ack is sent every ``ack_every`` durable events, and once the socket has been
        quiet for ``ack_idle`` seconds with an ack pending (SPEC D2). The quiet check is
        one timer per quiet period (:meth:`_idle_ack`), not a timeout around every
        ``recv``: that cost about 5 % of the client's time per frame (issue 13).
        """
        loop = asyncio.get_running_loop()
        if isinstance(ws, Connection):
            # Whole messages are handled as they are read (Connection); recv returns
            # only what took websockets' own path (fragments).
            ws.on_message = functools.partial(self._message, ws, loop)
        try:
            while True:
                raw = await ws.recv(decode=False)
                # A socket already closing refuses the ack; the frames it delivered
                # before its close (a drain's reconnect hint) are still read.
                if self._frame(ws, raw, loop):
                    await self._ack_quietly(ws)
        except ConnectionClosed as exc:
            frame = exc.rcvd
            return (None, "") if frame is None else (frame.code, frame.reason)
        finally:
            if isinstance(ws, Connection):
                ws.on_message = None
            if self._ack_timer is not None:
                self._ack_timer.cancel()
                self._ack_timer = None

    def _frame(self, ws: ClientConnection, raw: bytes, loop: asyncio.AbstractEventLoop) -> bool:
        """Handle one server frame: decode it, hand it to the inbound part, and arm the
        quiet-socket ack (SPEC D2). Returns whether ``ack_every`` durable events wait
        for their ack: the read loop sends it before it reads on; from the read
        callback (:class:`Connection`) it is sent by a task of its own."""
        self.last_frame = loop.time()
        message = decode_server(raw)
        if isinstance(message, DecodeError):
            logger.warning("undecodable server frame: %s", message)
            return False
        inbound = self._inbound
        inbound.process(message)
        if inbound.last_seq - self.acked >= self._settings.ack_every:
            return True
        self._arm_idle(ws, loop)
        return False

    def _arm_idle(self, ws: ClientConnection, loop: asyncio.AbstractEventLoop) -> None:
        """Arm the quiet-socket ack (SPEC D2) if an ack is pending and no timer runs."""
        if self._ack_timer is None and self._inbound.last_seq > self.acked:
            due = self.last_frame + self._settings.ack_idle
            self._ack_timer = loop.call_at(due, self._idle_ack, ws)

    def _message(self, ws: ClientConnection, loop: asyncio.AbstractEventLoop, raw: bytes) -> None:
        """:attr:`Connection.on_message`: :meth:`_frame`, then the ack it asks for, sent
        by one task at a time (a cumulative ack covers what arrived meanwhile)."""
        if self._frame(ws, raw, loop) and not self._acking:
            self._acking = True
            self._spawn(self._ack_soon(ws))

    async def _ack_soon(self, ws: ClientConnection) -> None:
        """The ack :meth:`_message` asked for. The events the read callback handled while
        it waited for the socket (a full send buffer) asked for none (SPEC D2): as the
        read loop does for the frames it reads after its own ack, they are acked again
        at once when ``ack_every`` of them wait (while acks get through), else the
        quiet-socket timer is armed for them."""
        try:
            sent = -1
            every = self._settings.ack_every
            while (
                ws is self.ws and sent < self.acked and self._inbound.last_seq - self.acked >= every
            ):
                sent = self.acked
                await self._ack_quietly(ws)
        finally:
            self._acking = False
        if ws is self.ws:
            self._arm_idle(ws, asyncio.get_running_loop())

    def _idle_ack(self, ws: ClientConnection) -> None:
        """Timer callback: ack once no frame arrived for ``ack_idle`` seconds (SPEC D2).

        A frame that arrived since the timer was armed moves the deadline: the timer is
        armed again for the rest of the quiet period instead of acking early.
        """
        self._ack_timer = None
        if ws is not self.ws or self._inbound.last_seq <= self.acked:
            return
        loop = asyncio.get_running_loop()
        left = self.last_frame + self._settings.ack_idle - loop.time()
        if left > 0:
            # At least 1 ms: uvloop's clock has millisecond steps and can fire a timer
            # a fraction of a step early; a shorter re-arm would spin until it moved.
            self._ack_timer = loop.call_later(max(left, 0.001), self._idle_ack, ws)
            return
        self._spawn(self._ack_quietly(ws))

    async def _ack_quietly(self, ws: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self._send_ack(ws)

    async def ack(self, ws: ClientConnection) -> None:
        """Cumulative ack of everything processed (SPEC D2)."""
        seq = self._inbound.last_seq
        if seq > self.acked:
            await ws.send(encode(m.Ack(seq=seq)), text=True)
            self.acked = seq

    async def _reconnect(self) -> ClientConnection | None:
        """Reconnect with backoff and resume (SPEC D3); ``None`` when giving up."""
        backoff = self._settings.backoff
        attempt = 0
        while not self._stop.is_set():
            limit = backoff.max_attempts
            if limit is not None and attempt >= limit:
                self._end(SessionClosed(f"gave up reconnecting after {attempt} attempts"))
                return None
            hint = self._inbound.hint
            delay = hint if hint is not None else backoff.delay(attempt)
            self._inbound.hint = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
                return None
            attempt += 1
            try:
                async with asyncio.timeout(self._settings.connect_timeout):
                    ws, welcome = await self.handshake()
            except ConnectFailed as exc:
                if exc.code in REFUSED_HELLO:
                    self._end(SessionClosed(f"reconnect refused: {exc}"))
                    return None
                logger.info("reconnect attempt %d failed: %s", attempt, exc)
                continue
            except (OSError, TimeoutError) as exc:
                logger.info("reconnect attempt %d failed: %s", attempt, exc)
                continue
            self.attach(ws, welcome)
            if not welcome.resumed:
                # The old session's pushes are gone: learn how unfinished jobs ended
                # (SPEC D3), also while a re-sent invoke may still bring one (I15).
                self._spawn(self._jobs.resync(self._calls.resent_waiting, self._stop))
            await self._calls.resend(self.gen)
            return ws
        return None


def _close_text(exc: ConnectionClosed) -> str:
    frame = exc.rcvd
    return f"{frame.code} {frame.reason}".strip() if frame is not None else "no close frame"
