"""SPEC S1/E1: the per-connection state machine, driven synchronously."""

from __future__ import annotations

import pytest
from golden_messages import CLIENT_GOLDEN

from protocol import codec
from protocol.connection_state import LEGAL, Connection, Ignored, State
from protocol.errors import CloseCode, DecodeError, ErrorCode, StateError, UsageError
from protocol.messages import CLIENT_TYPES, type_name

#: One encoded example per client type, from the golden table.
EXAMPLE = {type_name(type(message)): raw for message, raw in reversed(CLIENT_GOLDEN)}
ALL_TYPES = sorted(type_name(model) for model in CLIENT_TYPES)


def _in_state(state: State) -> Connection:
    conn = Connection(now=0.0)
    if state is not State.AWAITING_HELLO:
        conn.accept_hello()
    if state in (State.CLOSING, State.CLOSED):
        conn.start_closing()
    if state is State.CLOSED:
        conn.closed()
    assert conn.state is state
    return conn


def test_examples_cover_every_client_type() -> None:
    """SPEC S1: the table-driven tests below see every client message type."""
    assert sorted(EXAMPLE) == ALL_TYPES
    assert set().union(*LEGAL.values()) == set(ALL_TYPES)


def test_hello_deadline_before_at_after() -> None:
    """SPEC S1: the hello deadline is now + timeout; expired() from the deadline on."""
    conn = Connection(now=100.0, hello_timeout=10.0)
    assert conn.hello_deadline == 110.0
    assert conn.expired(109.999) is None
    for now in (110.0, 500.0):
        error = conn.expired(now)
        assert error == StateError(ErrorCode.HELLO_TIMEOUT, "no hello before the deadline")
        assert error is not None
        assert error.close is CloseCode.POLICY_VIOLATION


def test_hello_deadline_default_is_ten_seconds() -> None:
    """SPEC S1: the default hello timeout is 10 s."""
    assert Connection(now=5.0).hello_deadline == 15.0


def test_hello_timeout_zero_disables() -> None:
    """SPEC S1: hello_timeout=0 means no deadline at all."""
    conn = Connection(now=0.0, hello_timeout=0)
    assert conn.hello_deadline is None
    assert conn.expired(1e12) is None


def test_deadline_gone_once_hello_accepted() -> None:
    """SPEC S1: after hello the deadline no longer applies."""
    conn = Connection(now=0.0, hello_timeout=1.0)
    assert conn.receive(EXAMPLE["hello"]) == codec.decode_client(EXAMPLE["hello"])
    conn.accept_hello()
    assert conn.hello_deadline is None
    assert conn.expired(2.0) is None


@pytest.mark.parametrize("kind", [t for t in ALL_TYPES if t != "hello"])
def test_non_hello_first_is_hello_required(kind: str) -> None:
    """SPEC S1: any other message before hello -> hello_required, close 1008, id echoed."""
    result = Connection(now=0.0).receive(EXAMPLE[kind])
    assert isinstance(result, StateError)
    assert result.code is ErrorCode.HELLO_REQUIRED
    assert result.close is CloseCode.POLICY_VIOLATION
    assert result.request_id == getattr(codec.decode_client(EXAMPLE[kind]), "id", None)


def test_second_hello_when_open_is_unexpected() -> None:
    """SPEC S1: a second hello once open -> unexpected_message with its id, no close."""
    conn = _in_state(State.OPEN)
    result = conn.receive(b'{"type":"hello","id":"h2"}')
    assert result == StateError(
        ErrorCode.UNEXPECTED_MESSAGE, "'hello' is not allowed in state open", "h2"
    )
    assert isinstance(result, StateError)
    assert result.close is None
    assert conn.state is State.OPEN


@pytest.mark.parametrize("state", [State.AWAITING_HELLO, State.OPEN])
@pytest.mark.parametrize("kind", ALL_TYPES)
def test_legal_table_awaiting_and_open(state: State, kind: str) -> None:
    """SPEC S1: a type in LEGAL[state] is delivered; any other is a StateError."""
    result = _in_state(state).receive(EXAMPLE[kind])
    if kind in LEGAL[state]:
        assert result == codec.decode_client(EXAMPLE[kind])
    else:
        assert isinstance(result, StateError)


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_closing_delivers_ack_and_ignores_the_rest(kind: str) -> None:
    """SPEC S1/S4: while closing, ack still counts; every other message is dropped silently."""
    result = _in_state(State.CLOSING).receive(EXAMPLE[kind])
    if kind == "ack":
        assert result == codec.decode_client(EXAMPLE[kind])
    else:
        assert result == Ignored(kind)


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_closed_ignores_everything(kind: str) -> None:
    """SPEC S1: once closed, nothing is legal and nothing is answered."""
    assert _in_state(State.CLOSED).receive(EXAMPLE[kind]) == Ignored(kind)


@pytest.mark.parametrize("state", list(State))
def test_bad_bytes_are_decode_errors_in_every_state(state: State) -> None:
    """SPEC E1: undecodable input is a DecodeError whatever the state."""
    result = _in_state(state).receive(b"\xff")
    assert result == DecodeError(ErrorCode.INVALID_UTF8, "payload is not valid UTF-8")


def test_text_frames_as_str() -> None:
    """SPEC E1: receive() takes already-decoded text as well as bytes."""
    assert _in_state(State.OPEN).receive('{"type":"ack","seq":3}') == codec.decode_client(
        b'{"type":"ack","seq":3}'
    )


def test_max_depth_is_passed_to_the_codec() -> None:
    """SPEC E1: the connection's max_depth bounds nesting."""
    conn = Connection(now=0.0, max_depth=2)
    conn.accept_hello()
    result = conn.receive(b'{"type":"invoke","call_id":"c","tool":"t","params":{"a":{}}}')
    assert isinstance(result, DecodeError)
    assert result.code is ErrorCode.TOO_DEEP


def test_binary_frame_before_hello() -> None:
    """SPEC S1/E1: a binary first frame is not hello -> hello_required, close 1008."""
    result = Connection(now=0.0).receive_binary()
    assert result.code is ErrorCode.HELLO_REQUIRED
    assert result.close is CloseCode.POLICY_VIOLATION


@pytest.mark.parametrize("state", [State.OPEN, State.CLOSING, State.CLOSED])
def test_binary_frame_after_hello(state: State) -> None:
    """SPEC E1: a binary frame after hello -> binary_frame error, connection kept."""
    result = _in_state(state).receive_binary()
    assert result == DecodeError(ErrorCode.BINARY_FRAME, "binary frames are not part of toolbus.v1")
    assert result.close is None


@pytest.mark.parametrize("state", [State.OPEN, State.CLOSING, State.CLOSED])
def test_accept_hello_twice_is_a_usage_error(state: State) -> None:
    """SPEC S1: accept_hello() outside AWAITING_HELLO is a bug in the caller."""
    conn = _in_state(state)
    with pytest.raises(UsageError, match=rf"accept_hello\(\) in state {state.value}"):
        conn.accept_hello()
    assert conn.state is state


def test_transitions() -> None:
    """SPEC S1: AWAITING_HELLO -> OPEN -> CLOSING -> CLOSED; closing never reopens CLOSED."""
    conn = Connection(now=0.0)
    assert conn.state is State.AWAITING_HELLO
    conn.accept_hello()
    assert conn.state is State.OPEN
    conn.start_closing()
    assert conn.state is State.CLOSING
    conn.start_closing()
    assert conn.state is State.CLOSING
    conn.closed()
    assert conn.state is State.CLOSED
    conn.start_closing()
    assert conn.state is State.CLOSED


def test_close_straight_from_awaiting_hello() -> None:
    """SPEC S1: a hello timeout or refusal closes without ever opening."""
    conn = Connection(now=0.0)
    conn.start_closing()
    assert conn.state is State.CLOSING
    assert conn.hello_deadline is None
    conn.closed()
    assert conn.state is State.CLOSED
