"""The per-connection state machine of protocol v1, as data (SPEC S1, E1).

Sans-I/O, in the manner of h11: the I/O shell feeds frames in (:meth:`Connection.receive`)
and gets back typed outcomes; time enters only as the ``now`` argument (seconds, any
monotonic clock) and leaves as deadlines. Which message is legal in which state is the
table :data:`LEGAL`, not a chain of ifs.

States::

    AWAITING_HELLO --hello accepted--> OPEN --start_closing()--> CLOSING --closed()--> CLOSED
          |                                                                   ^
          +-------- hello timeout / non-hello first message / auth refused ---+
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from protocol import messages as m
from protocol.codec import DEFAULT_MAX_DEPTH, decode_client
from protocol.errors import DecodeError, ErrorCode, ProtocolError, StateError, UsageError
from protocol.messages import ClientMessage, type_name


class State(Enum):
    """Where a connection is in its life."""

    AWAITING_HELLO = "awaiting_hello"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_AFTER_HELLO: Final = frozenset(
    type_name(cls)
    for cls in (
        m.CatalogGet,
        m.Invoke,
        m.CallCancel,
        m.ToolConfirm,
        m.ElicitAnswer,
        m.GrantsList,
        m.GrantsRevoke,
        m.JobGet,
        m.JobList,
        m.JobCancel,
        m.Ack,
        m.ContextUpdate,
        m.Bye,
        m.AuthRefresh,
    )
)

LEGAL: Final[dict[State, frozenset[str]]] = {
    State.AWAITING_HELLO: frozenset({"hello"}),
    State.OPEN: _AFTER_HELLO,
    # While closing, acks still help the server trim the log; everything else is dropped.
    State.CLOSING: frozenset({"ack"}),
    State.CLOSED: frozenset(),
}
"""Message types legal in each state (SPEC S1)."""

#: What breaking the table costs, per state: before ``hello`` the peer is not speaking
#: the protocol and the connection closes 1008 (SPEC S1); once open, a stray message is
#: answered with an error and the session goes on.
_ILLEGAL_CODE: Final[dict[State, ErrorCode]] = {
    State.AWAITING_HELLO: ErrorCode.HELLO_REQUIRED,
    State.OPEN: ErrorCode.UNEXPECTED_MESSAGE,
    State.CLOSING: ErrorCode.UNEXPECTED_MESSAGE,
    State.CLOSED: ErrorCode.UNEXPECTED_MESSAGE,
}


@dataclass(frozen=True, slots=True)
class Ignored:
    """A frame that arrived while closing and is dropped without an answer."""

    type: str


Received = ClientMessage | ProtocolError | Ignored
"""What :meth:`Connection.receive` gives: a legal message, an error to report, or nothing."""


class Connection:
    """Protocol state of one WebSocket connection on the server side.

    Args:
        now: the current time in seconds, on the same clock as every later ``now``.
        hello_timeout: seconds the client has to send ``hello`` (SPEC S1); 0 disables.
        max_depth: deepest JSON nesting accepted in a message (SPEC E1).
    """

    def __init__(
        self, now: float, hello_timeout: float = 10.0, max_depth: int = DEFAULT_MAX_DEPTH
    ) -> None:
        self.state = State.AWAITING_HELLO
        self.max_depth = max_depth
        self._hello_deadline = now + hello_timeout if hello_timeout > 0 else None

    @property
    def hello_deadline(self) -> float | None:
        """When ``hello`` must have arrived, or ``None`` once it has (or with no limit)."""
        return self._hello_deadline if self.state is State.AWAITING_HELLO else None

    def expired(self, now: float) -> ProtocolError | None:
        """Return the hello-timeout error when ``now`` is past the deadline, else ``None``."""
        deadline = self.hello_deadline
        if deadline is not None and now >= deadline:
            return StateError(ErrorCode.HELLO_TIMEOUT, "no hello before the deadline")
        return None

    def receive(self, raw: bytes | str) -> Received:
        """Decode one frame and check it against the state table (SPEC S1, E1).

        Args:
            raw: a text frame's payload, as bytes or as already-decoded text. Binary
                frames go to :meth:`receive_binary` instead.

        Returns:
            The message when legal; a :class:`ProtocolError` (whose ``close`` says
            whether the connection must close) when not; :class:`Ignored` while closing.
        """
        decoded = decode_client(raw, self.max_depth)
        if isinstance(decoded, DecodeError):
            return decoded
        kind = decoded.type
        if kind in LEGAL[self.state]:
            return decoded
        if self.state in (State.CLOSING, State.CLOSED):
            return Ignored(kind)
        request_id = getattr(decoded, "id", None)
        code = _ILLEGAL_CODE[self.state]
        return StateError(code, f"'{kind}' is not allowed in state {self.state.value}", request_id)

    def receive_binary(self) -> ProtocolError:
        """Account for a binary frame: protocol v1 is text only (SPEC E1)."""
        if self.state is State.AWAITING_HELLO:
            return StateError(ErrorCode.HELLO_REQUIRED, "the first message must be hello")
        return DecodeError(ErrorCode.BINARY_FRAME, "binary frames are not part of toolbus.v1")

    def accept_hello(self) -> None:
        """Move to OPEN after the shell accepted ``hello`` (auth, profile, resume)."""
        self._require(State.AWAITING_HELLO, "accept_hello")
        self.state = State.OPEN

    def start_closing(self) -> None:
        """Move to CLOSING: drain (SPEC S4), a limit, or a protocol error."""
        if self.state is not State.CLOSED:
            self.state = State.CLOSING

    def closed(self) -> None:
        """Move to CLOSED once the socket is gone."""
        self.state = State.CLOSED

    def _require(self, state: State, action: str) -> None:
        if self.state is not state:
            raise UsageError(f"{action}() in state {self.state.value}")
