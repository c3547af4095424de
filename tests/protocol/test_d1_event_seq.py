"""A durable event is built without ``seq`` and numbered when it is encoded (SPEC D1)."""

from __future__ import annotations

import pytest
from golden_messages import SERVER_GOLDEN
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from protocol import codec
from protocol import messages as m
from protocol.errors import DecodeError, ErrorCode
from protocol.jsonschema import message_schemas

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
DURABLE_GOLDEN = [(msg, raw) for msg, raw in SERVER_GOLDEN if isinstance(msg, m.DURABLE_TYPES)]


def _ids(table: list[tuple[BaseModel, bytes]]) -> list[str]:
    return [f"{i}-{type(message).__name__}" for i, (message, _) in enumerate(table)]


def test_table_covers_every_durable_type() -> None:
    """SPEC D1: the golden table holds every durable event type."""
    assert {type(message) for message, _ in DURABLE_GOLDEN} == set(m.DURABLE_TYPES)


@pytest.mark.parametrize(("message", "raw"), DURABLE_GOLDEN, ids=_ids(DURABLE_GOLDEN))
def test_encode_event_numbers_an_unsequenced_event(message: BaseModel, raw: bytes) -> None:
    """SPEC D1: the event built without seq, encoded under the golden seq, gives the golden
    bytes: the same key order and values as the event built with it."""
    seq = message.seq  # type: ignore[attr-defined]
    unsequenced = message.model_copy(update={"seq": m.UNSEQUENCED})
    assert codec.encode_event(unsequenced, seq) == raw  # type: ignore[arg-type]
    assert unsequenced.seq == m.UNSEQUENCED  # type: ignore[attr-defined]


def test_server_builds_an_event_without_seq() -> None:
    """SPEC D1: the constructor defaults seq to UNSEQUENCED; encode_event numbers it."""
    event = m.Result(call_id="c1", tool="echo", result={"ok": True})
    assert event.seq == m.UNSEQUENCED
    assert codec.encode_event(event, 7) == (
        b'{"type":"result","seq":7,"call_id":"c1","tool":"echo","result":{"ok":true},'
        b'"declined":false,"replaced":false}'
    )


@pytest.mark.parametrize(("message", "raw"), DURABLE_GOLDEN, ids=_ids(DURABLE_GOLDEN))
def test_wire_event_without_seq_is_refused(message: BaseModel, raw: bytes) -> None:
    """SPEC D1, E1: on the wire seq stays required: a durable event without it (or with the
    UNSEQUENCED 0) is refused as the model with a required seq refused it."""
    seq = message.seq  # type: ignore[attr-defined]
    missing = raw.replace(b'"seq":%d,' % seq, b"", 1)
    assert missing != raw
    assert codec.decode_server(missing) == DecodeError(
        ErrorCode.MISSING_FIELD, "seq: Field required", getattr(message, "id", None)
    )
    zero = raw.replace(b'"seq":%d,' % seq, b'"seq":0,', 1)
    refused = codec.decode_server(zero)
    assert isinstance(refused, DecodeError)
    assert refused.code is ErrorCode.INVALID_VALUE


def test_schema_requires_seq_without_default() -> None:
    """SPEC D1: every durable event's JSON Schema requires seq (second, after type) and
    gives it no default (the schema drift test pins every other byte)."""
    schemas = message_schemas()
    for model in m.DURABLE_TYPES:
        schema = schemas[m.type_name(model)]
        assert schema["required"][:2] == ["type", "seq"]
        assert schema["properties"]["seq"] == {"minimum": 1, "title": "Seq", "type": "integer"}


@settings(max_examples=300, deadline=None)
@given(
    result=st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4),
    seq=st.integers(min_value=1, max_value=2**63 - 1),
    call_id=st.text(min_size=1, max_size=8),
    tool=st.text(min_size=1, max_size=8),
    declined=st.booleans(),
    replaced=st.booleans(),
)
def test_d1_encode_result_gives_the_bytes_of_the_result_model(
    result: dict[str, object],
    seq: int,
    call_id: str,
    tool: str,
    declined: bool,
    replaced: bool,
) -> None:
    """SPEC D1, I8: the gateway's one-encode path of a ``result`` (the value's JSON made
    once, spliced into the frame) gives exactly the bytes of the ``Result`` model."""
    event = m.Result(
        call_id=call_id, tool=tool, result=result, declined=declined, replaced=replaced
    )
    spliced = codec.encode_result(
        seq, call_id, tool, codec.encode_plain_json(result), declined, replaced
    )
    assert spliced == codec.encode_event(event, seq)


@pytest.mark.parametrize(("message", "raw"), DURABLE_GOLDEN, ids=_ids(DURABLE_GOLDEN))
def test_d1_encode_dumped_gives_the_golden_bytes(message: BaseModel, raw: bytes) -> None:
    """SPEC D1, J4: an event dumped once under any seq (the job end checks and sizes its
    ``job.done`` that way before staging anything) and numbered by ``encode_dumped``
    gives the very bytes of :func:`encode_event` under the golden seq."""
    seq = message.seq  # type: ignore[attr-defined]
    dumped = message.model_copy(update={"seq": 1}).model_dump(exclude_none=True)
    assert codec.encode_dumped(dumped, seq) == raw
    assert codec.encode_dumped(dumped, seq) == codec.encode_event(message, seq)  # type: ignore[arg-type]
