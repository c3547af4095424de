"""Generated schemas: no drift from the models, models and schemas agree, AsyncAPI shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from golden_messages import CLIENT_GOLDEN, SERVER_GOLDEN
from pydantic import BaseModel

from protocol import jsonschema as generated
from protocol.codec import decode_client
from protocol.errors import DecodeError
from protocol.messages import CLIENT_TYPES, SERVER_TYPES, type_name

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "schema"
SCHEMAS = generated.message_schemas()
HINT = "schema/ is out of date: run `toolbus schema` and commit the result"


def _checked_in() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in SCHEMA_DIR.rglob("*")
        if path.is_file() and path.name != "README.md"
    }


def test_checked_in_files_match_render_files() -> None:
    """SPEC layout: every file in schema/ equals render_files() byte for byte."""
    rendered = generated.render_files()
    stale = [
        name
        for name, data in rendered.items()
        if (ROOT / name).is_file() and (ROOT / name).read_bytes() != data
    ]
    assert not stale, f"{HINT}; differs: {stale}"


def test_no_missing_or_extra_files() -> None:
    """SPEC layout: schema/ holds exactly the rendered files (README.md aside)."""
    rendered = set(generated.render_files())
    on_disk = _checked_in()
    assert rendered - on_disk == set(), f"{HINT}; missing: {sorted(rendered - on_disk)}"
    assert on_disk - rendered == set(), f"{HINT}; extra: {sorted(on_disk - rendered)}"


def test_render_files_is_deterministic_and_well_formed() -> None:
    """SPEC layout: two renders give the same bytes: sorted, indented JSON ending in a newline."""
    first, second = generated.render_files(), generated.render_files()
    assert first == second
    for name, data in first.items():
        assert data.endswith(b"}\n"), name
        assert (
            data
            == (
                json.dumps(json.loads(data), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            ).encode()
        ), name


def test_one_schema_per_wire_type_plus_unions() -> None:
    """SPEC layout: message_schemas() is keyed by every wire type and the two unions."""
    expected = {type_name(model) for model in (*CLIENT_TYPES, *SERVER_TYPES)}
    assert set(generated.message_schemas()) == expected | {"client-message", "server-message"}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_schema_is_valid_draft_2020_12(name: str) -> None:
    """SPEC layout: each schema is a valid Draft 2020-12 schema with $id, title, description."""
    schema = SCHEMAS[name]
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].startswith("urn:toolbus:schema:v1:")
    assert schema["title"]
    assert schema["description"]


def test_union_schemas_are_discriminated_one_of() -> None:
    """SPEC layout: the direction unions are oneOf with a discriminator on type."""
    schemas = generated.message_schemas()
    for name, models in (("client-message", CLIENT_TYPES), ("server-message", SERVER_TYPES)):
        union = schemas[name]
        assert len(union["oneOf"]) == len(models)
        assert union["discriminator"]["propertyName"] == "type"
        assert set(union["discriminator"]["mapping"]) == {type_name(m) for m in models}


def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(SCHEMAS[name])


@pytest.mark.parametrize(("message", "raw"), CLIENT_GOLDEN + SERVER_GOLDEN)
def test_golden_json_validates_against_its_schema(message: BaseModel, raw: bytes) -> None:
    """SPEC E1: each golden message validates against its own schema and its union's."""
    instance = json.loads(raw)
    _validator(type_name(type(message))).validate(instance)
    union = "client-message" if type(message) in CLIENT_TYPES else "server-message"
    _validator(union).validate(instance)


@pytest.mark.parametrize(
    "instance",
    [
        {"call_id": "c", "tool": "t"},  # no type: required on the wire
        {"type": "invoke", "call_id": "c", "tool": "t", "extra": 1},
        {"type": "invoke", "call_id": "c"},
        {"type": "invoke", "call_id": "", "tool": "t"},
        {"type": "invoke", "call_id": "c", "tool": "t", "params": []},
        {"type": "ack", "seq": -1},
        {"type": "nope"},
    ],
)
def test_schema_refuses_what_the_codec_refuses(instance: dict[str, Any]) -> None:
    """SPEC E1: instances the decoder refuses are also invalid for the client union schema."""
    assert isinstance(decode_client(json.dumps(instance)), DecodeError)
    assert not _validator("client-message").is_valid(instance)


# ----------------------------------------------------------------------------- AsyncAPI


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"$ref leaves the document: {ref}"
    node: Any = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict), f"$ref does not resolve: {ref}"
        assert part in node, f"$ref does not resolve: {ref}"
        node = node[part]
    return node


def test_asyncapi_top_level_shape() -> None:
    """SPEC layout: the AsyncAPI document has the required 3.0.0 top-level keys."""
    doc = generated.asyncapi_document()
    assert doc["asyncapi"] == "3.0.0"
    assert doc["info"]["title"]
    assert doc["info"]["version"]
    for key in ("channels", "operations", "components"):
        assert isinstance(doc[key], dict), key
        assert doc[key], key
    assert set(doc["components"]) == {"schemas", "messages"}


def test_asyncapi_channel_is_the_websocket() -> None:
    """SPEC S1: one channel at / with a ws binding that requires subprotocol toolbus.v1."""
    doc = generated.asyncapi_document()
    (channel,) = doc["channels"].values()
    assert channel["address"] == "/"
    ws = channel["bindings"]["ws"]
    assert ws["headers"]["properties"]["Sec-WebSocket-Protocol"]["const"] == "toolbus.v1"
    assert set(channel["messages"]) == {type_name(m) for m in (*CLIENT_TYPES, *SERVER_TYPES)}


def test_asyncapi_operations_split_by_direction() -> None:
    """SPEC layout: operation send lists the client messages, receive the server messages."""
    doc = generated.asyncapi_document()
    for op_name, models in (("send", CLIENT_TYPES), ("receive", SERVER_TYPES)):
        operation = doc["operations"][op_name]
        assert operation["action"] == op_name
        assert _resolve(doc, operation["channel"]["$ref"]) is next(iter(doc["channels"].values()))
        names = [
            _resolve(doc, ref["$ref"])["$ref"].rsplit("/", 1)[1] for ref in operation["messages"]
        ]
        assert names == [type_name(m) for m in models]


def test_asyncapi_every_ref_resolves_inside_the_document() -> None:
    """SPEC layout: every $ref of the AsyncAPI document points at a node inside it."""
    doc = generated.asyncapi_document()
    refs = list(_refs(doc))
    assert len(refs) > 60
    for ref in refs:
        _resolve(doc, ref)


def test_asyncapi_messages_have_payload_schemas() -> None:
    """SPEC layout: each component message names its wire type and has a valid payload schema."""
    doc = generated.asyncapi_document()
    for name, message in doc["components"]["messages"].items():
        assert message["name"] == name
        assert message["contentType"] == "application/json"
        payload = _resolve(doc, message["payload"]["$ref"])
        assert payload["properties"]["type"]["const"] == name
        assert payload["required"][0] == "type"
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft7Validator.check_schema(schema)
