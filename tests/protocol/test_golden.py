"""Golden table of protocol v1: every message type, both ways through the codec (SPEC E1)."""

from __future__ import annotations

import pytest
from golden_messages import CLIENT_GOLDEN, SERVER_GOLDEN
from pydantic import BaseModel

from protocol import codec
from protocol.errors import DecodeError
from protocol.messages import CLIENT_TYPES, SERVER_TYPES


def _ids(table: list[tuple[BaseModel, bytes]]) -> list[str]:
    return [f"{i}-{type(message).__name__}" for i, (message, _) in enumerate(table)]


def test_table_covers_every_client_type() -> None:
    """SPEC E1: the golden table holds at least one example of every client message type."""
    assert {type(message) for message, _ in CLIENT_GOLDEN} == set(CLIENT_TYPES)


def test_table_covers_every_server_type() -> None:
    """SPEC E1: the golden table holds at least one example of every server message type."""
    assert {type(message) for message, _ in SERVER_GOLDEN} == set(SERVER_TYPES)


@pytest.mark.parametrize(
    ("message", "raw"), CLIENT_GOLDEN + SERVER_GOLDEN, ids=_ids(CLIENT_GOLDEN + SERVER_GOLDEN)
)
def test_encode_gives_exact_bytes(message: BaseModel, raw: bytes) -> None:
    """SPEC E1: encode() writes the exact golden bytes (compact, field order, None omitted)."""
    assert codec.encode(message) == raw


@pytest.mark.parametrize(("message", "raw"), CLIENT_GOLDEN, ids=_ids(CLIENT_GOLDEN))
def test_decode_client_gives_message(message: BaseModel, raw: bytes) -> None:
    """SPEC E1: decode_client() turns the golden bytes (and their text) back into the message."""
    assert codec.decode_client(raw) == message
    assert codec.decode_client(raw.decode()) == message


@pytest.mark.parametrize(("message", "raw"), SERVER_GOLDEN, ids=_ids(SERVER_GOLDEN))
def test_decode_server_gives_message(message: BaseModel, raw: bytes) -> None:
    """SPEC E1: decode_server() turns the golden bytes (and their text) back into the message."""
    assert codec.decode_server(raw) == message
    assert codec.decode_server(raw.decode()) == message


@pytest.mark.parametrize(("message", "raw"), CLIENT_GOLDEN, ids=_ids(CLIENT_GOLDEN))
def test_client_message_is_not_a_server_message(message: BaseModel, raw: bytes) -> None:
    """SPEC E1: a client message fed to the server-side decoder is refused, not misread."""
    assert isinstance(codec.decode_server(raw), DecodeError)


def test_hello_repr_hides_credentials() -> None:
    """SPEC S2: credentials never appear in a repr (and so in no log line built from one)."""
    message = CLIENT_GOLDEN[0][0]
    assert "secret" not in repr(message)
    assert "token" not in repr(message)


def test_encode_json_and_decode_json_round_trip() -> None:
    """SPEC E1: the plain JSON helpers round-trip a stored payload."""
    value = {"a": [1, 2.5, None, "é"], "b": {"c": True}}
    assert codec.decode_json(codec.encode_json(value)) == value
