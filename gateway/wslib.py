"""The gateway's one seam to the ``websockets`` library (issue 9, STYLE "One seam per library").

Every use of websockets in ``gateway/`` is in this module. The rest of the gateway sees
:class:`Socket` (what a connection handler, a hello and an outbox link may do with a
socket), the handshake hook types and :func:`serve`; an import-linter contract
(``gateway-one-ws-seam`` in ``pyproject.toml``) refuses a ``websockets`` import in any
other gateway module.

What is used, and how public it is:

- Public API: :func:`websockets.asyncio.server.serve` with ``process_request`` and
  ``create_connection``; ``ServerConnection.recv``, ``send``, ``close``, ``respond``,
  ``request``; :class:`~websockets.http11.Request` (its ``method`` is new in 17.0),
  :class:`~websockets.http11.Response`, :class:`~websockets.datastructures.Headers`;
  :exc:`~websockets.exceptions.ConnectionClosed`.
- Below the public API, for coalesced writes and the close metric (:class:`WsConnection`):
  the sans-I/O ``protocol`` attribute (``state`` against :class:`State` ``OPEN``,
  ``send_text``, ``data_to_send``, ``close_sent``, ``close_rcvd_then_sent``), the asyncio
  ``transport``, the ``send_data`` override point and the ``send_context`` context
  manager. For messages read without a task wake-up (:attr:`WsConnection.on_text`): the
  ``process_event`` override point, which gets every :class:`~websockets.frames.Frame`
  after the handshake, and the length of ``recv_messages.frames``, the frames the
  assembler holds for ``recv``. For bounded reads and writes (:class:`ReadGate`, SPEC
  D5, E2, E3): the asyncio protocol callbacks ``connection_made``, ``data_received``,
  ``connection_lost``, ``pause_writing`` and ``resume_writing`` (each overridden and
  chained), the assembler's ``pause`` and ``resume`` attributes, ``loop``, and the
  sans-I/O ``receive_eof`` (idempotent). websockets documents these in its source, not
  as API.
- A calling convention: ``serve`` builds each connection as
  ``create_connection(protocol, server, **options)``, hands the result to the event loop
  as the asyncio protocol, and the connection's ``connection_made`` starts the handler.
  :class:`gateway.mcp.route.Sniffer` relies on it to put itself in front. And websockets
  asks its logger ``isEnabledFor(DEBUG)`` before it formats a DEBUG line (headers and
  payloads), which :class:`_QuietLogger` answers false (SPEC S2).

``tests/gateway/test_wslib_seam.py`` checks each of these and fails naming the one that
changed. ``pyproject.toml`` pins the websockets versions that test passed on; to widen the
range, install the new version and run that test first (ARCHITECTURE.md, "One seam for
the WebSocket library").
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, cast

from websockets.asyncio.server import Server, ServerConnection
from websockets.asyncio.server import serve as _serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import Event, State
from websockets.typing import Subprotocol

from protocol.errors import ToolbusError

__all__ = [
    "ConnectionClosed",
    "RepeatedHeader",
    "Request",
    "Response",
    "Server",
    "Socket",
    "WsConnection",
    "header_values",
    "plain_response",
    "response",
    "serve",
    "single_header",
    "without_body",
]


class Socket(Protocol):
    """What the gateway does with one accepted WebSocket, and nothing more.

    :class:`WsConnection` is the implementation; connection handlers, hellos and outbox
    links are typed against this, so a new use of the library shows up here first.
    """

    on_text: Callable[[str], None] | None
    """Called with the text of each whole (unfragmented) text message as it is read,
    instead of queueing it for :meth:`recv`, while nothing is queued for :meth:`recv`;
    ``None``: every message goes to :meth:`recv`."""

    async def recv(self, decode: bool | None = None) -> str | bytes:
        """The next message: ``str`` for a text frame, ``bytes`` for a binary one.

        Raises:
            ConnectionClosed: the connection closed (either side, any code).
        """
        ...

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame with ``code`` and ``reason`` and wait for the close."""
        ...

    def header(self, name: str) -> str | None:
        """A single-valued header of the upgrade request, ``None`` when absent.

        Raises:
            RepeatedHeader: the request carries it more than once.
        """
        ...

    def write_now(self, frames: Sequence[bytes]) -> bool:
        """Write encoded text frames at once, in one write, if the socket is idle."""
        ...

    async def send_texts(self, frames: Sequence[bytes]) -> None:
        """Send encoded text frames in one write, with flow control."""
        ...

    def buffered(self) -> int:
        """Bytes written to the transport and not yet taken by the kernel."""
        ...

    def sent_close_code(self) -> int | None:
        """The code of the close frame this server started, ``None`` if none."""
        ...


MESSAGES_PER_TURN = 64
"""Frames of one socket read handled in one turn of the event loop (SPEC E3); the rest
wait, in order, for the next turns. One read holds up to 256 KiB: about 12,000 small
requests, seconds of work that would stall every other socket."""


class ReadGate:
    """Why a transport is not read now: reading resumes once no reason holds.

    ``pause_reading`` and ``resume_reading`` are one flag, so two users of it (websockets'
    assembler and this module) would undo each other; each names its reason here instead.

    Args:
        transport: the connection's transport.
    """

    QUEUE = 1
    """websockets' assembler holds ``max_queue`` frames for ``recv``."""
    WRITE = 2
    """The write buffer is above its high-water mark (SPEC D5, E2)."""
    TURN = 4
    """Frames already read wait for a later turn of the loop (SPEC E3)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._holds = 0

    def hold(self, why: int) -> None:
        """Stop reading for ``why`` (one of the class constants) until :meth:`release`."""
        if not self._holds:
            self._transport.pause_reading()
        self._holds |= why

    def release(self, why: int) -> None:
        """``why`` no longer holds; read again if nothing else does."""
        if self._holds & why:
            self._holds &= ~why
            if not self._holds:
                self._transport.resume_reading()


class WsConnection(ServerConnection):
    """websockets' server connection, writing the frames of one flush at once, with
    bounded work per read and bounded writes per peer.

    websockets writes each outgoing frame with its own ``transport.write``; when a link
    sends several frames together (``tool_start`` and ``result`` of a quick call, a
    replay page), that would be one ``send`` syscall and one wake-up of the peer per
    frame. :meth:`send_data` joins them into one write. Behaviour is otherwise
    websockets' own, including the half-close on an empty chunk (RFC 6455 section 7.1.1).

    Two bounds websockets leaves to its user (SPEC D5, E2, E3):

    - Writes: websockets answers each ping with a pong (RFC 6455 section 5.5.2) and each
      close with a close as it reads them, outside any flow control; a peer that sends
      pings and never reads would grow the write buffer without end, before ``hello``.
      While the buffer is above its high-water mark (``write_limit``) the socket is not
      read (:meth:`pause_writing`), so what a peer can make the server owe is one read
      past that mark. A peer that never reads then meets the hello timeout, heartbeat
      or slow-consumer close (1013), whose close is aborted after ``close_timeout``.
    - Work: of the frames of one read, :data:`MESSAGES_PER_TURN` are handled at once;
      the rest wait, in arrival order, for the next turns of the loop
      (:meth:`process_event`), and the socket is not read until they are handled, so
      every other socket gets its turn in between. A read of a few frames (the common
      case) costs no extra turn.
    """

    on_text: Callable[[str], None] | None = None
    _budget = MESSAGES_PER_TURN
    _waiting: deque[Event] | None = None
    """Frames read and not yet handled, oldest first; ``None``: none wait."""
    _lost: tuple[Exception | None] | None = None
    """The argument of a ``connection_lost`` that came while frames waited."""
    _gate: ReadGate

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """websockets' own, with its assembler's pause of reading routed through
        :class:`ReadGate` (overrides websockets)."""
        super().connection_made(transport)
        self._gate = gate = ReadGate(cast(asyncio.Transport, transport))
        self.recv_messages.pause = lambda: gate.hold(ReadGate.QUEUE)
        self.recv_messages.resume = lambda: gate.release(ReadGate.QUEUE)

    def pause_writing(self) -> None:
        """The write buffer passed its high-water mark: stop reading (SPEC D5, E2)."""
        super().pause_writing()
        self._gate.hold(ReadGate.WRITE)

    def resume_writing(self) -> None:
        """The write buffer fell to its low-water mark: read again (SPEC D5, E2)."""
        super().resume_writing()
        self._gate.release(ReadGate.WRITE)

    def data_received(self, data: bytes) -> None:
        """websockets' own, with a fresh budget of frames for this read (SPEC E3)."""
        self._budget = MESSAGES_PER_TURN
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        """Frames read before the end are handled before it, as websockets would, still
        in their turns (SPEC E3): websockets is told of the end after the last one. The
        protocol ends now (``receive_eof`` is idempotent), so nothing is written for them."""
        if self._waiting:
            self.protocol.receive_eof()
            self._lost = (exc,)
            return
        super().connection_lost(exc)

    def process_event(self, event: Event) -> None:
        """Handle a frame now, within this read's budget, else after those before it, on a
        later turn of the loop (SPEC E3; overrides websockets)."""
        if self._waiting is None and self._budget:
            self._budget -= 1
            self._take(event)
            return
        if self._waiting is None:
            self._waiting = deque()
            self._gate.hold(ReadGate.TURN)
            self.loop.call_soon(self._next_turn)
        self._waiting.append(event)

    def _next_turn(self) -> None:
        waiting = self._waiting
        assert waiting is not None
        for _ in range(min(MESSAGES_PER_TURN, len(waiting))):
            self._take(waiting.popleft())
        if waiting:
            self.loop.call_soon(self._next_turn)
            return
        self._waiting = None
        if self._lost is not None:
            super().connection_lost(self._lost[0])
            return
        self._gate.release(ReadGate.TURN)

    def _take(self, event: Event) -> None:
        """Hand a whole text message to :attr:`on_text` at once, anything else to
        websockets' ``process_event``.

        websockets queues each message in its assembler, sets a future and wakes the
        task awaiting :meth:`recv`: a future, a queue round and a task step per message
        (issue 13). With :attr:`on_text` set, a text frame that is a whole message goes
        to it from the read callback (or its later turn) instead, in arrival order: only
        while the assembler holds no frame, so it never overtakes a message :meth:`recv`
        will return. (A
        frame stays in the assembler until the reader takes it, and the reader handles
        what :meth:`recv` returned without awaiting in between, so no other state is
        needed.) Anything else (the handshake, fragments, binary frames, control frames)
        is websockets' own path. A payload that is not UTF-8 takes websockets' path too
        (close 1007).
        """
        on_text = self.on_text
        if (
            on_text is not None
            and type(event) is Frame
            and event.opcode is Opcode.TEXT
            and event.fin
            and not len(self.recv_messages.frames)
        ):
            try:
                text = bytes(event.data).decode()
            except UnicodeDecodeError:
                # websockets' own path closes 1007 naming the position (RFC 6455 section
                # 8.1), exactly as for a message read through recv.
                pass
            else:
                on_text(text)
                return
        super().process_event(event)

    def send_data(self) -> None:
        """Write what the sans-I/O protocol has to send, coalesced (overrides websockets)."""
        pending: list[bytes] = []
        for data in self.protocol.data_to_send():
            if data:
                pending.append(data)
                continue
            # An empty chunk asks for end of stream after what came before it.
            self._write(pending)
            pending = []
            if self.transport.can_write_eof():
                # websockets does the same: a half-close is best effort.
                with contextlib.suppress(Exception):
                    self.transport.write_eof()
            else:
                self.transport.close()
        self._write(pending)

    def _write(self, chunks: list[bytes]) -> None:
        if len(chunks) == 1:
            self.transport.write(chunks[0])
        elif chunks:
            self.transport.write(b"".join(chunks))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """websockets' closing handshake, bounded by ``close_timeout`` in all.

        websockets drains the write buffer before its close deadline starts, with no
        bound of its own: a peer that stopped reading would hold the close (the lifetime
        or drain 1012, the slow-consumer 1013, an S6 close) and its session forever.
        Past ``close_timeout`` the transport is aborted; the session is parked as after
        any drop (SPEC D5, N6, S4).
        """
        try:
            async with asyncio.timeout(self.close_timeout):
                await super().close(code, reason)
        except TimeoutError:
            self.transport.abort()
            await self.wait_closed()

    def header(self, name: str) -> str | None:
        request = self.request
        return single_header(request, name) if request is not None else None

    def write_now(self, frames: Sequence[bytes]) -> bool:
        """Write ``frames`` (encoded text frames) now, in one write, without flow control.

        Only when the connection is open, its transport not closing and its write buffer
        empty, so nothing written earlier is waiting: the common quick reply then costs
        no turn of the event loop (SPEC D5 still holds, the buffer was empty).

        Returns:
            ``True`` if written; ``False`` if not idle (nothing was written).
        """
        transport = self.transport
        if self.protocol.state is not State.OPEN or transport.is_closing():
            return False
        if transport.get_write_buffer_size():
            return False
        protocol = self.protocol
        for data in frames:
            protocol.send_text(data)
        self.send_data()
        return True

    async def send_texts(self, frames: Sequence[bytes]) -> None:
        """Send ``frames`` (encoded text frames, not decoded again) in one write, then wait
        for the write buffer to drain below its limit.

        Raises:
            ConnectionClosed: the connection is closed or closing.
        """
        if len(frames) == 1:
            await self.send(frames[0], text=True)
            return
        async with self.send_context():
            protocol = self.protocol
            for data in frames:
                protocol.send_text(data)

    def buffered(self) -> int:
        transport = self.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def sent_close_code(self) -> int | None:
        """Closes the client started (we only echoed its frame) count as ``None``."""
        protocol = self.protocol
        sent = protocol.close_sent
        if sent is None or protocol.close_rcvd_then_sent:
            return None
        return int(sent.code)


_PER_CONNECTION = frozenset({"connection open", "connection closed"})
"""websockets' INFO lines for every TCP connection: a session's own lines
(``gateway.connection``: opened, parked, closed) say the same with its id, and a
``/healthz`` probe (a load balancer's, every two seconds) would log two lines."""


class _QuietLogger(logging.LoggerAdapter[logging.Logger]):
    """websockets' server logger without its DEBUG lines (SPEC S2), nor its INFO lines
    per connection (SPEC O2).

    websockets logs every request header and frame payload at DEBUG, which would put
    ``Authorization`` headers and ``hello.token`` in the log. It only formats those
    lines when ``isEnabledFor(DEBUG)`` is true, so answering false drops them at the
    source. Of its INFO lines, ``connection open``, ``connection closed`` and an HTTP
    answer below 400 (``HTTP response sent (200 OK)``: ``/healthz``, ``/metrics``, the
    console) are dropped; a refused request (``HTTP response sent (401 ...)``), the
    server's own lines, and WARNING and above pass through unchanged.
    """

    def isEnabledFor(self, level: int) -> bool:
        return level > logging.DEBUG and self.logger.isEnabledFor(level)

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level == logging.INFO and (
            msg in _PER_CONNECTION
            or (msg == "HTTP response sent (%d %s)" and args and _below_400(args[0]))
        ):
            return
        super().log(level, msg, *args, **kwargs)


def _below_400(status: object) -> bool:
    return isinstance(status, int) and status < 400


ProcessRequest = Callable[[WsConnection, Request], Response | None]
"""A ``process_request`` hook: a :class:`Response` refuses the upgrade (or answers a plain
HTTP request); ``None`` lets the WebSocket handshake go on."""


async def serve(
    handler: Callable[[Socket], Awaitable[None]],
    host: str,
    port: int,
    *,
    subprotocols: Iterable[str],
    process_request: ProcessRequest,
    max_size: int,
    ping_interval: float | None,
    ping_timeout: float | None,
    close_timeout: float,
    front: Callable[[Callable[[], asyncio.Protocol]], asyncio.Protocol] | None = None,
    reuse_port: bool = False,
) -> Server:
    """Bind ``host:port`` and serve WebSockets with :class:`WsConnection` (SPEC S1).

    Args:
        handler: runs once per accepted, upgraded socket.
        host: the address to bind.
        port: the port to bind; ``0`` picks a free one (``Server.sockets`` says which).
        subprotocols: the subprotocols offered, preferred first.
        process_request: vets each request before the upgrade.
        max_size: largest message accepted, in bytes (larger closes 1009).
        ping_interval: seconds between pings; ``None``: no pings.
        ping_timeout: seconds a pong may take; ``None``: no limit.
        close_timeout: seconds the closing handshake may take.
        front: given a factory of this socket's websockets connection, returns the
            asyncio protocol that gets the socket first (the ``/mcp`` sniffer, SPEC M4).
        reuse_port: bind with ``SO_REUSEPORT``: processes sharing the port each get a
            share of the connections (``serve --workers``, SPEC N6).

    Returns:
        The running server; ``close()`` then ``wait_closed()`` stops it.

    Raises:
        OSError: the address cannot be bound.
    """

    def accepted(*args: Any, **kwargs: Any) -> ServerConnection:
        if front is None:
            return WsConnection(*args, **kwargs)
        # The object returned goes to the event loop as the socket's protocol; only the
        # WsConnection it hands the socket to is ever passed to the handler.
        return cast(ServerConnection, front(lambda: WsConnection(*args, **kwargs)))

    # serve builds every connection through ``accepted``, so each one is a WsConnection.
    async def handle(connection: ServerConnection) -> None:
        await handler(cast(WsConnection, connection))

    def vet(connection: ServerConnection, request: Request) -> Response | None:
        return process_request(cast(WsConnection, connection), request)

    return await _serve(
        handle,
        host,
        port,
        subprotocols=[Subprotocol(name) for name in subprotocols],
        process_request=vet,
        max_size=max_size,
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        close_timeout=close_timeout,
        compression=None,
        server_header="toolbus",
        create_connection=cast(Any, accepted),
        logger=_QuietLogger(logging.getLogger("websockets.server"), {}),
        reuse_port=reuse_port,
    )


def response(status: http.HTTPStatus, body: bytes, headers: Iterable[tuple[str, str]]) -> Response:
    """An HTTP response to a request that is not upgraded, with exactly ``headers``."""
    return Response(status.value, status.phrase, Headers(list(headers)), body)


def plain_response(connection: WsConnection, status: http.HTTPStatus, text: str) -> Response:
    """A plain-text refusal of an upgrade, as websockets writes them (``respond``)."""
    return connection.respond(status, text)


def without_body(answer: Response) -> Response:
    """The same status and headers without the body (a HEAD, RFC 9110 section 9.3.2)."""
    return Response(answer.status_code, answer.reason_phrase, answer.headers, b"")


class RepeatedHeader(ToolbusError):
    """The peer sent a single-valued header more than once (SPEC S2, E1).

    RFC 9110 section 5.3 allows repeated field lines only for a list-valued field;
    ``Origin`` (RFC 6454 section 7.3) and ``Authorization`` (RFC 9110 section 11.6.2) carry
    one value. Two of them are ambiguous (which one did a proxy check?), so the request is
    refused, never read as either: HTTP 400 at the upgrade, ``auth_failed`` and close
    4003 for a credential.

    Attributes:
        name: the header's name, as the server asked for it.
    """

    def __init__(self, name: str) -> None:
        super().__init__(f"repeated {name} header")
        self.name = name


def single_header(request: Request, name: str) -> str | None:
    """The one value of a single-valued request header, ``None`` when absent (SPEC S2).

    Raises:
        RepeatedHeader: the request carries ``name`` more than once.
    """
    values = request.headers.get_all(name)
    if len(values) > 1:
        raise RepeatedHeader(name)
    return values[0] if values else None


def header_values(request: Request, name: str) -> list[str]:
    """Every value of a (repeatable) request header, comma lists split and stripped."""
    return [p.strip() for h in request.headers.get_all(name) for p in h.split(",")]
