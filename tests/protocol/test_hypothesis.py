"""Property tests of the codec: round trips for every message type, and fuzzing (SPEC E1).

Valid messages are drawn from each model's own generated JSON Schema (protocol.jsonschema),
so a new field or message type is covered without touching this file.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from protocol import codec
from protocol.errors import DecodeError
from protocol.jsonschema import message_schemas
from protocol.messages import CLIENT_TYPES, SERVER_TYPES, Error, type_name

INT64 = (-(2**63), 2**63 - 1)
SCHEMAS = message_schemas()

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(*INT64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def _from_schema(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A strategy of JSON instances valid for the small JSON Schema subset pydantic emits."""
    if "$ref" in schema:
        return _from_schema(defs[schema["$ref"].rsplit("/", 1)[1]], defs)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([_from_schema(option, defs) for option in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "string":
        return st.text(
            min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 12), 12)
        )
    if kind == "integer":
        return st.integers(schema.get("minimum", INT64[0]), schema.get("maximum", INT64[1]))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(_from_schema(schema.get("items", {}), defs), max_size=3)
    if kind == "object":
        return _object(schema, defs)
    return json_values  # {}: any JSON value


def _object(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    properties = schema.get("properties")
    if properties is None:
        extra = schema.get("additionalProperties", True)
        values = json_values if extra is True else _from_schema(extra, defs)
        return st.dictionaries(st.text(max_size=5), values, max_size=3)
    required = set(schema.get("required", []))
    return st.fixed_dictionaries(
        {name: _from_schema(sub, defs) for name, sub in properties.items() if name in required},
        optional={
            name: _from_schema(sub, defs)
            for name, sub in properties.items()
            if name not in required
        },
    )


def _messages(models: tuple[type[BaseModel], ...]) -> st.SearchStrategy[BaseModel]:
    def one(model: type[BaseModel]) -> st.SearchStrategy[BaseModel]:
        schema = SCHEMAS[type_name(model)]
        return _from_schema(schema, schema.get("$defs", {})).map(model.model_validate)

    return st.one_of([one(model) for model in models])


@settings(max_examples=300)
@given(_messages(CLIENT_TYPES))
def test_client_messages_round_trip(message: BaseModel) -> None:
    """SPEC E1: any valid client message survives encode -> decode_client unchanged."""
    assert codec.decode_client(codec.encode(message)) == message


@settings(max_examples=300)
@given(_messages(SERVER_TYPES))
def test_server_messages_round_trip(message: BaseModel) -> None:
    """SPEC E1: any valid server message survives encode -> decode_server unchanged."""
    assert codec.decode_server(codec.encode(message)) == message


def _check_total(raw: bytes | str) -> None:
    for decode, models in (
        (codec.decode_client, CLIENT_TYPES),
        (codec.decode_server, SERVER_TYPES),
    ):
        result = decode(raw)
        if isinstance(result, DecodeError):
            # The gateway must always be able to turn it into an error reply.
            Error(id=result.request_id, code=result.code, message=result.message)
        else:
            assert isinstance(result, models)


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_raise(raw: bytes) -> None:
    """SPEC E1: any bytes give a message or a DecodeError; nothing escapes the decoders."""
    _check_total(raw)


JSONISH = st.text(alphabet='{}[]":,\\ 0123456789.eE+-truefalsnNaIify\xff\u00e9', max_size=48)


@settings(max_examples=300)
@given(JSONISH | st.text(max_size=32))
def test_jsonish_text_never_raises(raw: str) -> None:
    """SPEC E1: JSON-looking text (as str and as bytes) never makes a decoder raise."""
    _check_total(raw)
    _check_total(raw.encode("utf-8", errors="surrogatepass"))


@settings(max_examples=200)
@given(
    st.dictionaries(
        st.sampled_from(["type", "id", "seq", "call_id", "tool", "params", "x"]),
        st.sampled_from([type_name(m) for m in CLIENT_TYPES]) | json_values,
        max_size=5,
    )
)
def test_message_shaped_objects_never_raise(obj: dict[str, Any]) -> None:
    """SPEC E1: objects close to real messages (right keys, any values) never raise."""
    _check_total(orjson.dumps(obj))
