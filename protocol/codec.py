"""The one codec of protocol v1: bytes to typed messages and back (SPEC E1).

Decoding is strict JSON (RFC 8259 plus the rules SPEC E1 adds): the payload must be
valid UTF-8, one object, without ``NaN``/``Infinity``, without duplicate keys, nested no
deeper than a limit, and then one valid message of the expected direction. Each refusal
is a distinct :class:`~protocol.errors.ErrorCode`; :func:`decode_client` and
:func:`decode_server` *return* a :class:`~protocol.errors.DecodeError` instead of raising,
so no exception escapes to the caller whatever the bytes.

An ``invoke`` whose params hold a number toolbus cannot carry (an integer wider than 64
bits, which orjson would read as a float; ``1e400``) is refused ``invalid_params`` with
its JSON pointer (:func:`params_problem`, SPEC E1, I4).

Only this module calls orjson. Encoding never emits ``NaN`` or ``Infinity`` (orjson
writes ``null`` for them, which keeps the output valid JSON); a handler's value that
holds one is refused before it is sent (:func:`non_finite`, SPEC I16), so no number
turns into ``null`` on the way.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, Final

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from protocol.errors import DecodeError, ErrorCode
from protocol.messages import (
    DURABLE_TYPES,
    ClientMessage,
    DurableEvent,
    Invoke,
    ServerMessage,
    type_name,
)

DEFAULT_MAX_DEPTH: Final = 32
"""Default nesting limit of a decoded message: objects and arrays, the top object is 1."""

MAX_REQUEST_ID_CHARS: Final = 128
"""Longest request ``id`` (:data:`protocol.messages.RequestId`); longer ones are not echoed."""

CLIENT_ADAPTER: Final[TypeAdapter[ClientMessage]] = TypeAdapter(ClientMessage)
SERVER_ADAPTER: Final[TypeAdapter[ServerMessage]] = TypeAdapter(ServerMessage)

# A JSON string, matched whole so scanning never starts inside one, and whether a colon
# follows it (then it is an object key). Counting keys this way and comparing with the
# keys orjson kept reveals duplicates, which orjson silently collapses. The string is
# written as an unrolled loop (runs of plain characters, then one escape): the same
# strings as "(?:[^"\\]|\\.)*" without one alternation per character, about 3x faster.
_STRING_OR_KEY = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"(\s*:)?', re.DOTALL)
_STRING_OR_KEY_STR = re.compile(_STRING_OR_KEY.pattern.decode(), re.DOTALL)
_NAN_TOKEN = re.compile(rb"(?<![\w.])-?(?:NaN|Infinity)\b")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)

_PYDANTIC_CODES: Final[dict[str, ErrorCode]] = {
    "missing": ErrorCode.MISSING_FIELD,
    "extra_forbidden": ErrorCode.EXTRA_FIELD,
    "union_tag_invalid": ErrorCode.UNKNOWN_TYPE,
    "union_tag_not_found": ErrorCode.MISSING_TYPE,
}

_DURABLE_NAMES: Final = frozenset(type_name(model) for model in DURABLE_TYPES)
"""Wire types whose ``seq`` is required on the wire though the model defaults it (SPEC D1)."""


def encode(message: BaseModel) -> bytes:
    """Serialize a wire message to the UTF-8 JSON bytes of one text frame.

    Args:
        message: any model of :mod:`protocol.messages`.

    Returns:
        Compact JSON; fields whose value is ``None`` are omitted.
    """
    return orjson.dumps(message.model_dump(exclude_none=True))


def encode_event(event: DurableEvent, seq: int) -> bytes:
    """Serialize a durable event under ``seq`` (SPEC D1), the session log's next number.

    Args:
        event: a :data:`protocol.messages.DurableEvent`, usually built without ``seq``
            (:data:`protocol.messages.UNSEQUENCED`); any ``seq`` it holds is replaced.
        seq: the event's number in its session's log, >= 1.

    Returns:
        The same bytes as :func:`encode` of the event built with that ``seq``.

    Raises:
        TypeError: a value JSON cannot carry (orjson's ``JSONEncodeError``), as
            :func:`encode`.
    """
    fields = event.model_dump(exclude_none=True)
    fields["seq"] = seq  # the key exists (the default is not None): its place is kept
    return orjson.dumps(fields)


def encode_dumped(fields: dict[str, Any], seq: int) -> bytes:
    """:func:`encode_event` of an event dumped already: ``fields`` is its
    ``model_dump(exclude_none=True)`` (any ``seq``), checked and sized by the caller
    before anything was staged (SPEC I16, E2). ``fields["seq"]`` is set to ``seq``.

    Returns:
        The same bytes as :func:`encode_event` of that event under ``seq`` (SPEC D1).
    """
    fields["seq"] = seq  # the key exists (the dump's default is not None): its place is kept
    return orjson.dumps(fields)


def encode_result(
    seq: int,
    call_id: str,
    tool: str,
    result: bytes,
    declined: bool = False,
    replaced: bool = False,
) -> bytes:
    """The bytes of a ``result`` event (SPEC I8, D1) from its value's JSON already made.

    Args:
        seq: the event's number in its session's log, >= 1.
        call_id, tool: the call's.
        result: :func:`encode_plain_json` of the result object (a ``dict`` with ``str``
            keys),
            spliced in as it is: the gateway encodes a handler's value once, to check its
            size, depth and numbers (SPEC E2, I16), and sends those very bytes.
        declined, replaced: the event's flags.

    Returns:
        The same bytes as :func:`encode_event` of
        ``Result(call_id=..., tool=..., result=..., declined=..., replaced=...)``
        under ``seq`` (same keys, same order; ``tests/protocol`` pins it).
    """
    return orjson.dumps(
        {
            "type": "result",
            "seq": seq,
            "call_id": call_id,
            "tool": tool,
            "result": orjson.Fragment(result),
            "declined": declined,
            "replaced": replaced,
        }
    )


def encode_plain_json(value: Any) -> bytes:
    """:func:`encode_json`, refusing a dataclass anywhere in ``value``.

    pydantic dumps a dataclass by its declared fields; orjson by its instance attributes,
    leaving out names that start with ``_``. Bytes meant to equal a model's (SPEC D1:
    :func:`encode_result`) must not depend on which one ran.

    Raises:
        TypeError: a dataclass, or any value orjson cannot encode.
    """
    return orjson.dumps(value, option=orjson.OPT_PASSTHROUGH_DATACLASS)


def encode_json(value: Any) -> bytes:
    """Serialize a plain JSON value (used for stored payloads and HTTP bodies)."""
    return orjson.dumps(value)


def canonical_json(value: Any) -> bytes:
    """Serialize a plain JSON value with sorted keys: equal values give equal bytes (the
    call ledger hashes an ``invoke``'s parameters with it, SPEC I15)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


_INT_MIN: Final = -(1 << 63)
_INT_MAX: Final = (1 << 64) - 1
"""orjson writes integers in [-2**63, 2**64 - 1]; wider ones cannot be sent."""


def json_problem(value: Any, where: str = "result") -> str | None:
    """The first part of ``value`` a wire message cannot carry, named by its path, or
    ``None`` when it is plain JSON (SPEC I16).

    Plain JSON here is ``dict`` with ``str`` keys, ``list``/``tuple``, ``str``, ``int``
    within 64 bits, ``float``, ``bool`` and ``None``; sets, bytes, ``Decimal`` and other
    objects are named as problems. The gateway asks only once :func:`encode` refused a
    value, to say where the problem is (orjson's own message names no path).
    Iterative, so a deeply nested value cannot exhaust the stack.

    Args:
        value: a handler's return value (or any value bound for a message).
        where: the name of ``value`` in the returned text, e.g. ``"result"``.

    Returns:
        e.g. ``"result.n: integer 1180591620717411303424 is wider than 64 bits"``.
    """
    found = _first_problem(value, where, _dotted_key, _dotted_index, _not_json_text)
    return None if found is None else f"{found[0]}: {found[1]}"


def params_problem(params: Any) -> str | None:
    """The first number of an ``invoke``'s parameters toolbus cannot carry, named by its
    RFC 6901 pointer into the parameters (as I4's violations are), or ``None`` (SPEC E1,
    I4, M4).

    JSON's grammar bounds no number, but toolbus hashes, stores, audits and echoes
    parameters as JSON of 64-bit numbers: an integer wider than 64 bits or a number past
    a double's range (``1e400``, read as infinity) would fail there or change silently.
    Either way of calling refuses them ``invalid_params`` with this text before the call
    starts: :func:`decode_client` for a WebSocket ``invoke`` (orjson reads such an
    integer as a float, such a number not at all), the ``/mcp`` endpoint for a
    ``tools/call`` (the SDK reads both). One orjson pass when nothing is wrong.

    Returns:
        e.g. ``"/value: integer 1180591620717411303424 is wider than 64 bits"``.
    """
    try:
        encoded = orjson.dumps(params)
    except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits, or not JSON
        pass
    else:
        if not non_finite_in(params, encoded):
            return None
    found = _first_problem(params, "", _pointer_key, _pointer_index, _out_of_range_text)
    return None if found is None else f"{found[0] or '/'}: {found[1]}"


def _not_json_text(value: float) -> str:
    return f"{_float_name(value)} is not a JSON number"


def _out_of_range_text(value: float) -> str:
    # Parameters come from JSON text: an infinity was a number too large (1e400).
    if math.isnan(value):
        return _not_json_text(value)
    return f"number {_float_name(value)} is past the range of a 64-bit float"


def _dotted_key(path: str, key: str) -> str:
    return f"{path}.{key}"


def _dotted_index(path: str, index: int) -> str:
    return f"{path}[{index}]"


def _pointer_key(path: str, key: str) -> str:
    return path + "/" + key.replace("~", "~0").replace("/", "~1")  # RFC 6901 section 3


def _pointer_index(path: str, index: int) -> str:
    return f"{path}/{index}"


def _first_problem(
    value: Any,
    where: str,
    key_step: Callable[[str, str], str],
    index_step: Callable[[str, int], str],
    float_text: Callable[[float], str],
) -> tuple[str, str] | None:
    """(path, what) of the first part of ``value`` that is not plain JSON (see
    :func:`json_problem`); paths are built from ``where`` by the two step functions,
    ``float_text`` says what is wrong with a NaN or an infinity."""
    stack: list[tuple[str, Any]] = [(where, value)]
    seen: set[int] = set()  # a value that contains itself is walked once, not forever
    while stack:
        path, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path, float_text(item)
        if item is None or isinstance(item, bool | str | float):
            continue
        if isinstance(item, int):
            if not _INT_MIN <= item <= _INT_MAX:
                return path, f"integer {_int_text(item)} is wider than 64 bits"
            continue
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    kind = type(key).__name__
                    return path, f"key {_safe_repr(key)} is not a string (type {kind})"
                stack.append((key_step(path, key), child))
            continue
        if isinstance(item, list | tuple):
            stack.extend((index_step(path, i), child) for i, child in enumerate(item))
            continue
        return path, f"a value of type {type(item).__qualname__} is not JSON"
    return None


def non_finite(value: Any) -> bool:
    """Whether ``value`` holds a float ``NaN``, ``Infinity`` or ``-Infinity`` anywhere
    (SPEC I16). orjson writes ``null`` for them, which would change the data silently;
    the gateway asks before it sends a handler's value and, on ``True``, ends the call
    naming the place with :func:`json_problem`. Cheap: a value whose JSON holds no
    ``null`` has none (one orjson pass, about 3x faster than walking it); only other
    values are walked, iteratively, building no paths. A value orjson refuses for
    another reason is left to the encoder, which names that problem (``False``).
    """
    try:
        return non_finite_in(value, orjson.dumps(value))
    except TypeError:  # orjson.JSONEncodeError
        return False


def non_finite_in(value: Any, encoded: bytes) -> bool:
    """:func:`non_finite` for a value whose JSON (:func:`encode_json`) is at hand: only
    a value whose JSON holds ``null`` is walked (SPEC I16)."""
    if b"null" not in encoded:
        return False
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
            stack.extend(item.values() if isinstance(item, dict) else item)
    return False


def _float_name(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _int_text(value: int) -> str:
    # str() of an integer past 4300 digits raises (CPython's int_max_str_digits).
    if value.bit_length() <= 256:
        return str(value)
    return f"of {value.bit_length()} bits"


def _safe_repr(value: Any) -> str:
    """``repr(value)`` cut to 80 characters; a ``repr`` that raises is not the caller's
    problem (SPEC I16: naming a bad value must not fail in turn)."""
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__qualname__} object>"
    return text if len(text) <= 80 else text[:79] + "…"


def decode_json(raw: bytes | str) -> Any:
    """Parse plain JSON without the message checks; raises ``orjson.JSONDecodeError``."""
    return orjson.loads(raw)


def decode_client(
    raw: bytes | str, max_depth: int = DEFAULT_MAX_DEPTH
) -> ClientMessage | DecodeError:
    """Decode one client frame (SPEC E1).

    Args:
        raw: the frame payload: ``bytes`` as read, or ``str`` when the transport already
            decoded a text frame's UTF-8.
        max_depth: deepest nesting of objects and arrays accepted; the message itself is 1.

    Returns:
        The typed message, or a :class:`DecodeError` naming the first rule broken. Never
        raises.
    """
    decoded: ClientMessage | DecodeError = _decode(raw, CLIENT_ADAPTER, max_depth)
    return decoded


SERVER_MAX_DEPTH: Final = 64
"""Nesting limit of a decoded server message (the clients' default): the server keeps a
handler's value within it (SPEC I16), or the client would drop the call's one reply."""


def decode_server(
    raw: bytes | str, max_depth: int = SERVER_MAX_DEPTH
) -> ServerMessage | DecodeError:
    """Decode one server frame; the client-side twin of :func:`decode_client`."""
    decoded: ServerMessage | DecodeError = _decode(raw, SERVER_ADAPTER, max_depth, _DURABLE_NAMES)
    return decoded


def _decode(
    raw: bytes | str,
    adapter: TypeAdapter[Any],
    max_depth: int,
    sequenced: frozenset[str] = frozenset(),
) -> Any:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return _json_error(raw, str(exc))
    if not isinstance(obj, dict):
        return DecodeError(ErrorCode.NOT_AN_OBJECT, "a message must be a JSON object")
    request_id = _readable_id(obj.get("id"))
    shape = _count_shape(obj, max_depth)
    if shape is None:
        return DecodeError(
            ErrorCode.TOO_DEEP, f"nesting deeper than {max_depth} levels", request_id
        )
    keys, wide = shape
    if _repeats_a_key(raw, keys):
        return DecodeError(ErrorCode.DUPLICATE_KEY, "an object repeats a key", request_id)
    kind = obj.get("type")
    if sequenced and "seq" not in obj and isinstance(kind, str) and kind in sequenced:
        # SPEC D1: the model defaults seq for the server's own use; the wire requires it.
        # Checked first, as pydantic reports fields in order and seq follows type.
        return DecodeError(ErrorCode.MISSING_FIELD, "seq: Field required", request_id)
    try:
        message = adapter.validate_python(obj)
    except ValidationError as exc:
        return _validation_error(exc, request_id)
    if wide and type(message) is Invoke:
        # SPEC E1, I4: orjson read an integer past 64 bits as a float; the exact text
        # says whether one is in the params (a float this large may be just that).
        try:
            problem = params_problem(json.loads(raw).get("params"))
        except ValueError:  # an integer past int_max_str_digits: no float reads it
            problem = "an integer far wider than 64 bits"
        if problem is not None:
            return DecodeError(ErrorCode.INVALID_PARAMS, problem, request_id)
    return message


def _readable_id(value: Any) -> str | None:
    """Return ``value`` when it is a valid request id, the only kind an ``error`` may echo."""
    if isinstance(value, str) and 1 <= len(value) <= MAX_REQUEST_ID_CHARS:
        return value
    return None


def _json_error(raw: bytes | str, detail: str) -> DecodeError:
    # Only bytes that are not UTF-8 (or text holding a lone surrogate, which no UTF-8
    # could produce) close 1007 (RFC 6455 section 8.1). A BOM or an escaped lone surrogate
    # ("\ud800") is valid UTF-8 that is bad JSON: an error, not a close.
    if detail.startswith("str is not valid UTF-8"):
        return DecodeError(ErrorCode.INVALID_UTF8, "payload is not valid UTF-8")
    if "depth" in detail or "recursion" in detail:
        return DecodeError(ErrorCode.TOO_DEEP, "nesting too deep")
    data = raw.encode(errors="replace") if isinstance(raw, str) else raw
    if _NAN_TOKEN.search(_STRING.sub(b'""', data)):
        return DecodeError(ErrorCode.NAN_NOT_ALLOWED, "NaN and Infinity are not JSON")
    if detail.startswith("number is infinity"):
        # SPEC E1, I4: a number past a double's range (1e400) is JSON; in an invoke's
        # params it is refused as the /mcp endpoint refuses it (params_problem).
        refused = _out_of_range(raw)
        if refused is not None:
            return refused
    return DecodeError(ErrorCode.MALFORMED_JSON, f"malformed JSON: {detail}")


def _out_of_range(raw: bytes | str) -> DecodeError | None:
    """``invalid_params`` for an ``invoke`` whose params hold a number past a double's
    range (read leniently by ``json``, as infinity), else ``None``."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("type") != "invoke":
        return None
    problem = params_problem(obj.get("params"))
    if problem is None:
        return None
    return DecodeError(ErrorCode.INVALID_PARAMS, problem, _readable_id(obj.get("id")))


_WIDE_LOW: Final = -9223372036854775808.0
_WIDE_HIGH: Final = 18446744073709551616.0
"""orjson reads an integer outside [-2**63, 2**64 - 1] as a float outside this range."""


def _count_shape(root: dict[str, Any], max_depth: int) -> tuple[int, bool] | None:
    """Count the object keys of a parsed message and say whether it holds a float outside
    [-2**63, 2**64] (maybe an integer too wide for 64 bits, which orjson reads as a
    float), or ``None`` once nesting passes ``max_depth`` (the message itself is level 1).

    Iterative, and it stops at the first container past the limit: orjson accepts about
    a thousand levels, more than Python's recursion limit allows a walk to follow.
    orjson gives exact ``dict`` and ``list`` objects, so ``type(...) is`` tells them
    apart (cheaper than ``isinstance`` on every value of every message; issue 13).
    """
    keys = 0
    wide = False
    stack: list[tuple[Any, int]] = [(root, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        value, depth = pop()
        if depth > max_depth:
            return None
        if type(value) is dict:
            keys += len(value)
            value = value.values()
        depth += 1
        for item in value:
            kind = type(item)
            if kind is dict or kind is list:
                push((item, depth))
            elif kind is float and not _WIDE_LOW < item < _WIDE_HIGH:
                wide = True
    return keys, wide


def _repeats_a_key(raw: bytes | str, keys: int) -> bool:
    """Whether the text holds more object keys than the ``keys`` orjson kept.

    Every key is followed by a colon outside any string, and every colon outside a
    string follows a key, so the text's key count lies between ``keys`` (orjson keeps
    at least one of each name) and its count of colons. When the two bounds meet, as
    they do for every frame whose strings hold no colon, no key repeats, and one
    ``count`` in C decides it; otherwise the scan counts the keys exactly.
    """
    colons = raw.count(b":") if isinstance(raw, bytes) else raw.count(":")
    return colons != keys and _count_keys(raw) != keys


def _count_keys(raw: bytes | str) -> int:
    # findall gives the optional group of every string: empty for a value, the colon
    # (with any whitespace before it) for a key. Counting in C beats a match-object loop.
    if isinstance(raw, str):
        found_str: list[str] = _STRING_OR_KEY_STR.findall(raw)
        return len(found_str) - found_str.count("")
    found: list[bytes] = _STRING_OR_KEY.findall(raw)
    return len(found) - found.count(b"")


def _validation_error(exc: ValidationError, request_id: str | None) -> DecodeError:
    first = exc.errors(include_url=False, include_input=False)[0]
    kind = first["type"]
    code = _PYDANTIC_CODES.get(kind)
    if code is None:
        code = ErrorCode.WRONG_TYPE if kind.endswith("_type") else ErrorCode.INVALID_VALUE
    where = ".".join(str(part) for part in first["loc"][1:]) or "message"
    if code is ErrorCode.UNKNOWN_TYPE:
        return DecodeError(code, "unknown message type", request_id)
    if code is ErrorCode.MISSING_TYPE:
        return DecodeError(code, "the message has no 'type'", request_id)
    return DecodeError(code, f"{where}: {first['msg']}", request_id)
