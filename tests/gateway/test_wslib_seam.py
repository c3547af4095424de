"""The websockets seam (``gateway/wslib.py``) still fits the installed websockets.

``gateway/wslib.py`` reaches below websockets' public API: it overrides
``Connection.send_data`` and ``Connection.process_event`` (reading ``recv_messages.frames``),
``connection_made`` (setting ``recv_messages.pause`` and ``resume``), ``data_received``,
``connection_lost``, ``pause_writing`` and ``resume_writing``,
drives the sans-I/O ``protocol`` (``state``, ``send_text``, ``data_to_send``,
``close_sent``, ``close_rcvd_then_sent``), writes to ``transport``, enters
``send_context``, passes a non-class ``create_connection`` to ``serve`` and reads
``Request.method``; the toolbus client's ``toolbus.client_link.Connection`` overrides
``ClientConnection.process_event`` the same way, given to ``connect`` as
``create_connection``. Each test here pins one of those and fails naming it, so a websockets
release that moves one fails here first, not as a 1011 in production. To widen the
version range in ``pyproject.toml``: install the new version, run this file, fix
``gateway/wslib.py`` if it fails (ARCHITECTURE.md, "One seam for the WebSocket library").
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import inspect
import logging
import re
import tomllib
from collections.abc import Callable
from typing import Any

import pytest
import websockets
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import Protocol, State
from websockets.server import ServerProtocol

from gateway import wslib
from tests.support import ROOT, WAIT
from toolbus import client_link

SIGNATURES: dict[str, tuple[Callable[..., Any], list[str]]] = {
    "websockets.protocol.Protocol.send_text": (Protocol.send_text, ["self", "data", "fin"]),
    "websockets.protocol.Protocol.data_to_send": (Protocol.data_to_send, ["self"]),
    "websockets.asyncio.connection.Connection.send_data": (Connection.send_data, ["self"]),
    "websockets.asyncio.connection.Connection.process_event": (
        Connection.process_event,
        ["self", "event"],
    ),
    "websockets.asyncio.connection.Connection.send_context": (
        Connection.send_context,
        ["self", "expected_state"],
    ),
    "websockets.asyncio.connection.Connection.send": (Connection.send, ["self", "message", "text"]),
    "websockets.asyncio.connection.Connection.recv": (Connection.recv, ["self", "decode"]),
    "websockets.asyncio.connection.Connection.close": (
        Connection.close,
        ["self", "code", "reason"],
    ),
    "websockets.asyncio.server.ServerConnection.__init__": (
        ServerConnection.__init__,
        [
            "self",
            "protocol",
            "server",
            "ping_interval",
            "ping_timeout",
            "close_timeout",
            "max_queue",
            "write_limit",
        ],
    ),
    "websockets.asyncio.server.ServerConnection.respond": (
        ServerConnection.respond,
        ["self", "status", "text"],
    ),
    "websockets.asyncio.server.ServerConnection.connection_made": (
        ServerConnection.connection_made,
        ["self", "transport"],
    ),
    "websockets.asyncio.connection.Connection.data_received": (
        Connection.data_received,
        ["self", "data"],
    ),
    "websockets.asyncio.connection.Connection.connection_lost": (
        Connection.connection_lost,
        ["self", "exc"],
    ),
    "websockets.asyncio.connection.Connection.pause_writing": (
        Connection.pause_writing,
        ["self"],
    ),
    "websockets.asyncio.connection.Connection.resume_writing": (
        Connection.resume_writing,
        ["self"],
    ),
}
"""Every websockets method wslib overrides, calls below the public API, or hands
``serve``'s arguments to, with the parameter names it relies on."""

SERVE_OPTIONS = {
    "process_request",
    "create_connection",
    "subprotocols",
    "max_size",
    "ping_interval",
    "ping_timeout",
    "close_timeout",
    "compression",
    "server_header",
    "logger",
}
"""The keyword arguments :func:`gateway.wslib.serve` passes to websockets' ``serve``."""


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_unchanged(name: str) -> None:
    """A method wslib overrides or calls keeps the parameters wslib passes or accepts."""
    function, expected = SIGNATURES[name]
    found = list(inspect.signature(function).parameters)
    assert found == expected, f"websockets internal changed: {name}{tuple(found)}"


def test_connect_takes_the_connection_class_the_client_gives() -> None:
    """The toolbus client (toolbus/client_link.py) opens its socket with
    ``connect(..., create_connection=Connection)``, its ``ClientConnection`` subclass
    that reads whole messages in the callback, as WsConnection does on the server."""
    assert "create_connection" in inspect.signature(connect).parameters, (
        "websockets.asyncio.client.connect lost create_connection"
    )
    assert issubclass(client_link.Connection, ClientConnection)
    assert list(inspect.signature(ClientConnection.process_event).parameters) == [
        "self",
        "event",
    ], "websockets internal changed: ClientConnection.process_event(self, event)"


def test_serve_takes_the_options_wslib_passes() -> None:
    """websockets.asyncio.server.serve still accepts every option wslib.serve gives it."""
    missing = SERVE_OPTIONS - set(inspect.signature(ws_serve).parameters)
    assert not missing, f"websockets.asyncio.server.serve lost options: {sorted(missing)}"


def test_send_context_calls_send_data() -> None:
    """Connection.send_context writes through self.send_data(), the method WsConnection
    overrides to coalesce frames; if it stopped, batches would go out unjoined or not at all."""
    source = inspect.getsource(Connection.send_context)
    assert "self.send_data()" in source, (
        "websockets internal changed: Connection.send_context no longer calls self.send_data()"
    )


async def test_frames_reach_process_event_and_the_assembler_queue() -> None:
    """websockets hands every frame read to ``self.process_event`` (from
    ``data_received``), which WsConnection overrides to read whole text messages in the
    callback; data frames otherwise go to ``recv_messages.put``, whose queue
    (``recv_messages.frames``) has a length WsConnection asks before taking one."""
    received = inspect.getsource(Connection.data_received)
    assert "self.process_event(event)" in received, (
        "websockets internal changed: data_received no longer calls self.process_event"
    )
    processed = inspect.getsource(Connection.process_event)
    assert "self.recv_messages.put(event)" in processed, (
        "websockets internal changed: process_event no longer queues data frames"
    )
    server = inspect.getsource(ServerConnection.process_event)
    assert "super().process_event(event)" in server, (
        "websockets internal changed: ServerConnection.process_event no longer defers frames"
    )
    # The toolbus client's toolbus.client_link.Connection overrides it on the client side.
    client = inspect.getsource(ClientConnection.process_event)
    assert "super().process_event(event)" in client, (
        "websockets internal changed: ClientConnection.process_event no longer defers frames"
    )
    from websockets.asyncio.messages import Assembler

    assembler = Assembler()
    assert len(assembler.frames) == 0, "websockets internal changed: Assembler.frames has no len"
    assert {Opcode.TEXT, Opcode.BINARY, Opcode.CONT} <= set(Opcode)
    assert [f.name for f in dataclasses.fields(Frame)][:3] == ["opcode", "data", "fin"]


async def test_assembler_pauses_reading_through_its_pause_attributes() -> None:
    """websockets' assembler pauses and resumes the transport's reading through its
    ``pause`` and ``resume`` attributes, set from ``connection_made``; WsConnection routes
    them through its ReadGate so the fair-share and write-bound pauses (SPEC D5, E3) do
    not undo its own, nor it theirs."""
    made = inspect.getsource(Connection.connection_made)
    assert "pause=transport.pause_reading" in made, (
        "websockets internal changed: connection_made no longer gives the assembler pause"
    )
    assert "resume=transport.resume_reading" in made, (
        "websockets internal changed: connection_made no longer gives the assembler resume"
    )
    from websockets.asyncio.messages import Assembler

    calls: list[str] = []
    assembler = Assembler(1, 0, pause=lambda: None, resume=lambda: None)
    assembler.pause = lambda: calls.append("pause")
    assembler.resume = lambda: calls.append("resume")
    for _ in range(2):
        assembler.put(Frame(Opcode.TEXT, b"x"))
    assert calls == ["pause"], "websockets internal changed: Assembler reads self.pause"


def test_receive_eof_is_idempotent_and_ends_the_protocol() -> None:
    """WsConnection ends the sans-I/O protocol with ``receive_eof`` when its socket is lost
    while frames still wait for their turn (SPEC E3), and tells websockets'
    ``connection_lost`` later, which calls it again: a second call must change nothing."""
    protocol = ServerProtocol()
    protocol.receive_eof()
    protocol.receive_eof()
    assert protocol.state is State.CLOSED
    assert "self.protocol.receive_eof()" in inspect.getsource(Connection.connection_lost), (
        "websockets internal changed: connection_lost no longer ends the protocol"
    )


def test_state_names() -> None:
    """websockets.protocol.State keeps the members wslib compares against (OPEN)."""
    names = list(State.__members__)
    assert names == ["CONNECTING", "OPEN", "CLOSING", "CLOSED"], (
        f"websockets internal changed: websockets.protocol.State is {names}"
    )


@pytest.mark.parametrize("attribute", ["state", "close_sent", "close_rcvd_then_sent"])
def test_protocol_attributes(attribute: str) -> None:
    """The sans-I/O ServerProtocol has the attributes WsConnection reads."""
    protocol = ServerProtocol(state=State.OPEN)
    assert hasattr(protocol, attribute), (
        f"websockets internal changed: ServerProtocol has no attribute {attribute!r}"
    )


def test_data_to_send_contract() -> None:
    """``data_to_send`` returns the frames as bytes chunks, then ``b""`` for end of stream
    once the closing handshake is done: WsConnection.send_data joins the chunks and
    half-closes on the empty one (RFC 6455 section 7.1.1)."""
    protocol = ServerProtocol(state=State.OPEN)
    protocol.send_text(b"ab")
    protocol.send_text(b"c")
    sent = protocol.data_to_send()
    assert sent == [b"\x81\x02ab", b"\x81\x01c"], (
        f"websockets internal changed: Protocol.data_to_send() after two send_text gave {sent}"
    )
    close = Frame(Opcode.CLOSE, Close(1000, "").serialize())
    protocol.receive_data(close.serialize(mask=True))
    sent = protocol.data_to_send()
    assert sent == [b"\x88\x02\x03\xe8", b""], (
        f"websockets internal changed: Protocol.data_to_send() after a close gave {sent}"
    )
    assert protocol.close_sent == Close(1000, ""), (
        f"websockets internal changed: close_sent after a peer's close is {protocol.close_sent}"
    )
    assert protocol.close_rcvd_then_sent is True, (
        "websockets internal changed: close_rcvd_then_sent is not True after a peer's close"
    )


@pytest.mark.parametrize("field", ["path", "method", "headers"])
def test_request_fields(field: str) -> None:
    """websockets.http11.Request has the fields the upgrade vetting reads (``method`` is
    new in websockets 17.0: HEAD and 405 answers need it)."""
    names = [f.name for f in dataclasses.fields(Request)]
    assert field in names, f"websockets internal changed: Request has no field {field!r}"


def test_response_fields() -> None:
    """websockets.http11.Response is still built from (status, reason, headers, body)."""
    names = [f.name for f in dataclasses.fields(Response)][:4]
    assert names == ["status_code", "reason_phrase", "headers", "body"], (
        f"websockets internal changed: Response fields are {names}"
    )


def _declared_range() -> SpecifierSet:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for spec in data["project"]["dependencies"]:
        match = re.fullmatch(r"websockets\s*([<>=!~].*)", spec.strip())
        if match:
            return SpecifierSet(match.group(1))
    raise AssertionError("pyproject.toml declares no websockets range")


def test_declared_range_is_the_tested_one() -> None:
    """pyproject.toml admits only websockets 17 (the releases this file passed on), and
    the installed version is inside it."""
    declared = _declared_range()
    assert declared == SpecifierSet(">=17.0,<18"), f"websockets range changed: {declared}"
    installed = Version(websockets.__version__)
    assert installed in declared, f"websockets {installed} is outside {declared}"


class _RecordingTransport:
    """The server's real transport, with its writes and half-closes recorded."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.writes: list[bytes] = []
        self.eofs = 0

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def write_eof(self) -> None:
        self.eofs += 1
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Front(asyncio.Protocol):
    """Put in front of each socket through ``serve(front=...)``, as the /mcp sniffer is:
    hands the socket to websockets' connection through a recording transport."""

    def __init__(self, websocket: Callable[[], asyncio.Protocol], made: list[Any]) -> None:
        self.connection = websocket()
        made.append(self)
        self.transport: _RecordingTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = _RecordingTransport(transport)
        transport.set_protocol(self.connection)
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]


def _text_frame(payload: bytes) -> bytes:
    """A server's (unmasked) final text frame of under 126 bytes (RFC 6455 section 5.2)."""
    return b"\x81" + bytes([len(payload)]) + payload


async def test_coalesced_writes_are_valid_frames(caplog: pytest.LogCaptureFixture) -> None:
    """Through a real wslib.serve and a real websockets client: write_now and send_texts
    each put their frames in one transport write of exact, valid frames; the client
    decodes them; the close ends with a half-close; websockets logs no DEBUG line."""
    caplog.set_level(logging.DEBUG, logger="websockets.server")
    made: list[_Front] = []
    handled: list[wslib.Socket] = []
    done = asyncio.Event()

    async def handler(ws: wslib.Socket) -> None:
        handled.append(ws)
        assert await ws.recv() == "go"
        assert ws.header("X-Seam") == "yes"
        assert ws.write_now([b"one", b"two", b"three"]), "write_now refused an idle socket"
        await ws.send_texts([b"four", b"five"])
        assert await ws.recv() == "bye"
        await ws.close(4000, "done")
        assert ws.sent_close_code() == 4000
        done.set()

    def vet(connection: wslib.WsConnection, request: wslib.Request) -> wslib.Response | None:
        if request.method != "GET":
            return wslib.response(http.HTTPStatus.METHOD_NOT_ALLOWED, b"", [])
        return None

    server = await wslib.serve(
        handler,
        "127.0.0.1",
        0,
        subprotocols=["seam.v1"],
        process_request=vet,
        max_size=2**16,
        ping_interval=None,
        ping_timeout=None,
        close_timeout=WAIT,
        front=lambda websocket: _Front(websocket, made),
    )
    try:
        port = server.sockets[0].getsockname()[1]
        async with asyncio.timeout(WAIT):
            async with connect(
                f"ws://127.0.0.1:{port}",
                subprotocols=["seam.v1"],  # type: ignore[list-item]
                additional_headers={"X-Seam": "yes"},
            ) as client:
                await client.send("go")
                got = [await client.recv() for _ in range(5)]
                await client.send("bye")
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await client.recv()
            await done.wait()
    finally:
        server.close()
        await server.wait_closed()

    assert got == ["one", "two", "three", "four", "five"]
    assert closed.value.rcvd == Close(4000, "done")
    [front] = made
    assert handled == [front.connection], (
        "websockets internal changed: the handler did not get the connection that "
        "create_connection made (serve's create_connection / connection_made convention)"
    )
    assert front.transport is not None
    writes = front.transport.writes
    one_two_three = b"".join(_text_frame(p) for p in (b"one", b"two", b"three"))
    four_five = _text_frame(b"four") + _text_frame(b"five")
    assert writes[1:3] == [one_two_three, four_five], f"frames not coalesced: {writes}"
    assert writes[3].startswith(b"\x88"), f"no close frame after the data: {writes}"
    assert front.transport.eofs == 1, "the closing handshake did not half-close the socket"
    debug = [r for r in caplog.records if r.name.startswith("websockets.server")]
    assert not [r for r in debug if r.levelno == logging.DEBUG], "websockets logged at DEBUG"
