"""JSON Schema and AsyncAPI descriptions of protocol v1, generated from the wire models.

The checked-in files under ``schema/`` are the output of :func:`render_files`; the
``toolbus schema`` command writes them and a test fails when they drift from the models
(SPEC layout, O1). Everything here is pure: it builds dicts and bytes and never touches
the file system.

Shapes:

* :func:`message_schemas` -- one JSON Schema (Draft 2020-12) per wire ``type``, plus the
  two direction unions ``client-message`` and ``server-message``.
* :func:`asyncapi_document` -- an AsyncAPI 3.0.0 document of the one WebSocket channel,
  written from the client's point of view (it *sends* client messages and *receives*
  server messages).
* :func:`render_files` -- relative path to exact file bytes.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from protocol.codec import CLIENT_ADAPTER, SERVER_ADAPTER
from protocol.messages import CLIENT_TYPES, SERVER_TYPES, UNSEQUENCED, type_name
from protocol.version import SUBPROTOCOL_V1

JsonDict = dict[str, Any]

DRAFT_2020_12: Final = "https://json-schema.org/draft/2020-12/schema"
ID_PREFIX: Final = "urn:toolbus:schema:v1:"
"""Base of every ``$id``: URNs, since the schemas are identified, not fetched."""

ASYNCAPI_VERSION: Final = "3.0.0"
API_VERSION: Final = "1.0.0"
"""``info.version`` of the AsyncAPI document: protocol v1 (subprotocol ``toolbus.v1``)."""

CHANNEL: Final = "toolbus"
_COMPONENT_REF: Final = "#/components/schemas/{model}"

_UNIONS: Final[dict[str, tuple[str, str]]] = {
    "client-message": ("ClientMessage", "Any message a client sends (SPEC S1-E2)."),
    "server-message": ("ServerMessage", "Any message a server sends (SPEC S1-E2)."),
}


def _description(model: type[BaseModel], direction: str) -> str:
    doc = model.__doc__
    if doc and doc.strip():
        return " ".join(doc.split())
    # A few small models have no docstring; the wire type still says what they are.
    return f"The {type_name(model)!r} message of {SUBPROTOCOL_V1} ({direction})."


def _require_type(schema: JsonDict) -> JsonDict:
    """Mark ``type`` required: it has a default in the model, but never on the wire.

    So is a durable event's ``seq`` (SPEC D1): the model defaults it to
    :data:`~protocol.messages.UNSEQUENCED` for the server, whose session log assigns it
    when it emits the event; the codec refuses such an event without it.
    """
    wire = set(schema.get("required", ()))
    seq = schema.get("properties", {}).get("seq")
    if seq is not None and "default" in seq and seq["default"] == UNSEQUENCED:
        del seq["default"]
        wire.add("seq")
    names = [name for name in schema.get("properties", {}) if name in wire and name != "type"]
    schema["required"] = ["type", *names]
    return schema


def _message_schema(model: type[BaseModel], direction: str) -> JsonDict:
    schema = _require_type(model.model_json_schema())
    kind = type_name(model)
    schema["$schema"] = DRAFT_2020_12
    schema["$id"] = f"{ID_PREFIX}message:{kind}"
    schema["title"] = model.__name__
    schema["description"] = _description(model, direction)
    return schema


def _union_schema(name: str, adapter_schema: JsonDict) -> JsonDict:
    title, description = _UNIONS[name]
    message_names = {model.__name__ for model in (*CLIENT_TYPES, *SERVER_TYPES)}
    for def_name, definition in adapter_schema.get("$defs", {}).items():
        if def_name in message_names:
            _require_type(definition)
    return {
        "$schema": DRAFT_2020_12,
        "$id": f"{ID_PREFIX}{name}",
        "title": title,
        "description": description,
        **adapter_schema,
    }


def message_schemas() -> dict[str, JsonDict]:
    """Build the JSON Schema of every wire message.

    Returns:
        Wire ``type`` (``"invoke"``, ``"tool_start"``, ...) to a self-contained Draft
        2020-12 schema with ``$id``, ``title`` and ``description``; plus
        ``"client-message"`` and ``"server-message"``, the ``oneOf`` unions with a
        ``discriminator`` on ``type``. A fresh dict on every call.
    """
    schemas: dict[str, JsonDict] = {}
    for model in CLIENT_TYPES:
        schemas[type_name(model)] = _message_schema(model, "client to server")
    for model in SERVER_TYPES:
        schemas[type_name(model)] = _message_schema(model, "server to client")
    schemas["client-message"] = _union_schema("client-message", CLIENT_ADAPTER.json_schema())
    schemas["server-message"] = _union_schema("server-message", SERVER_ADAPTER.json_schema())
    return schemas


def _components() -> tuple[JsonDict, JsonDict]:
    """Return (components.schemas, components.messages) of the AsyncAPI document."""
    models = (*CLIENT_TYPES, *SERVER_TYPES)
    refs, defs = models_json_schema(
        [(model, "validation") for model in models], ref_template=_COMPONENT_REF
    )
    schemas: JsonDict = defs["$defs"]
    messages: JsonDict = {}
    for model in models:
        _require_type(schemas[model.__name__])
        direction = "client to server" if model in CLIENT_TYPES else "server to client"
        message: JsonDict = {
            "name": type_name(model),
            "title": model.__name__,
            "summary": _description(model, direction),
            "contentType": "application/json",
            "payload": refs[(model, "validation")],
        }
        if "id" in model.model_fields:
            message["correlationId"] = {
                "description": "The request id, echoed on the direct reply or error.",
                "location": "$message.payload#/id",
            }
        messages[type_name(model)] = message
    return schemas, messages


def _channel_refs(models: tuple[type[BaseModel], ...]) -> list[JsonDict]:
    return [{"$ref": f"#/channels/{CHANNEL}/messages/{type_name(model)}"} for model in models]


def asyncapi_document() -> JsonDict:
    """Build the AsyncAPI 3.0.0 document of the toolbus channel (SPEC S1, layout).

    Returns:
        A document with one channel (the WebSocket at ``/``, ``ws`` binding requiring
        subprotocol ``toolbus.v1``), operations ``send`` (client messages) and
        ``receive`` (server messages), message definitions under
        ``components.messages`` and their payload schemas under
        ``components.schemas``. Every ``$ref`` points inside the document.
    """
    schemas, messages = _components()
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "id": f"{ID_PREFIX}asyncapi",
        "info": {
            "title": "toolbus",
            "version": API_VERSION,
            "description": (
                f"Protocol v1 (WebSocket subprotocol `{SUBPROTOCOL_V1}`) between realtime "
                "agents and the tools they call. Described from the client's side: a client "
                "sends the client messages and receives the server messages. Every message "
                "is one JSON object in one text frame; the first must be `hello`."
            ),
        },
        "defaultContentType": "application/json",
        "channels": {
            CHANNEL: {
                "address": "/",
                "title": "toolbus WebSocket",
                "description": (
                    "One persistent socket per session. The upgrade must offer "
                    f"`Sec-WebSocket-Protocol: {SUBPROTOCOL_V1}`; credentials go in "
                    "`hello`, never in the query string (SPEC S2)."
                ),
                "messages": {name: {"$ref": f"#/components/messages/{name}"} for name in messages},
                "bindings": {
                    "ws": {
                        "method": "GET",
                        "headers": {
                            "type": "object",
                            "properties": {
                                "Sec-WebSocket-Protocol": {
                                    "type": "string",
                                    "description": "Must include the subprotocol.",
                                    "const": SUBPROTOCOL_V1,
                                }
                            },
                            "required": ["Sec-WebSocket-Protocol"],
                        },
                        "bindingVersion": "0.1.0",
                    }
                },
            }
        },
        "operations": {
            "send": {
                "action": "send",
                "title": "Client to server",
                "channel": {"$ref": f"#/channels/{CHANNEL}"},
                "messages": _channel_refs(CLIENT_TYPES),
            },
            "receive": {
                "action": "receive",
                "title": "Server to client",
                "channel": {"$ref": f"#/channels/{CHANNEL}"},
                "messages": _channel_refs(SERVER_TYPES),
            },
        },
        "components": {"schemas": schemas, "messages": messages},
    }


def _dump(document: JsonDict) -> bytes:
    """Pretty JSON, sorted keys, trailing newline: stable bytes for review and diffing."""
    return orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def render_files() -> dict[str, bytes]:
    """Render every generated file of ``schema/``.

    Returns:
        Path relative to the repository root (``"schema/messages/invoke.json"``,
        ``"schema/client-message.json"``, ``"schema/server-message.json"``,
        ``"schema/asyncapi.json"``) to its exact bytes. Deterministic: the same models
        always give the same bytes.
    """
    files: dict[str, bytes] = {}
    for name, schema in message_schemas().items():
        folder = "schema/" if name in _UNIONS else "schema/messages/"
        files[f"{folder}{name}.json"] = _dump(schema)
    files["schema/asyncapi.json"] = _dump(asyncapi_document())
    return files
