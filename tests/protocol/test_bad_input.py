"""SPEC E1: every kind of bad input maps to its own error code and disposition."""

from __future__ import annotations

import pytest

from protocol import codec
from protocol.errors import (
    ERROR_DISPOSITION,
    MAX_CLOSE_REASON_BYTES,
    CloseCode,
    DecodeError,
    ErrorCode,
    ProtocolError,
    StateError,
    close_for,
    close_reason,
)
from protocol.messages import Error


def _code(raw: bytes | str, **kwargs: int) -> ErrorCode:
    result = codec.decode_client(raw, **kwargs)
    assert isinstance(result, DecodeError), result
    return result.code


def test_case_f13_invalid_utf8() -> None:
    """SPEC E1: invalid UTF-8 bytes -> invalid_utf8, which closes 1007."""
    result = codec.decode_client(b"\x7b\xff\xfe\x7d")
    assert isinstance(result, DecodeError)
    assert result.code is ErrorCode.INVALID_UTF8
    assert result.close is CloseCode.INVALID_FRAME_PAYLOAD_DATA


@pytest.mark.parametrize(
    "raw",
    [
        b'{"type":"ack","seq":1,"x":"\xff"}',
        b'{"type":"ack","seq":1,"x":"\xc0\xaf"}',  # overlong encoding of "/"
        b'{"type":"ack","seq":1,"x":"\xe2\x82"}',  # truncated sequence
        b'{"type":"ack","seq":1,"x":"\xed\xa0\x80"}',  # encoded surrogate
        '{"type":"ack","seq":1,"x":"\ud800"}',  # lone surrogate in already-decoded text
    ],
)
def test_invalid_utf8_anywhere(raw: bytes | str) -> None:
    """SPEC E1: invalid UTF-8 inside a string value, or a lone surrogate -> invalid_utf8."""
    assert _code(raw) is ErrorCode.INVALID_UTF8


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b'{"type":"ack",}', b"{'type':'ack'}", b'{"type":"ack"} x', b"\xef\xbb\xbf{}"],
)
def test_malformed_json(raw: bytes) -> None:
    """SPEC E1: text that is not JSON -> malformed_json, the connection stays open."""
    assert _code(raw) is ErrorCode.MALFORMED_JSON
    assert close_for(ErrorCode.MALFORMED_JSON) is None


def test_valid_utf8_that_is_bad_json_does_not_close() -> None:
    """SPEC E1 (RFC 6455 8.1): a BOM or an escaped lone surrogate is bad JSON, not a 1007."""
    for raw in (b"\xef\xbb\xbf{}", b'{"type":"bye","id":"\\ud800"}', b'{"a":"\\udc00x"}'):
        assert _code(raw) is ErrorCode.MALFORMED_JSON


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize(
    "where", ['{"type":"ack","seq":%s}', '{"type":"invoke","params":{"a":[1,%s]}}']
)
def test_nan_and_infinity(token: str, where: str) -> None:
    """SPEC E1: NaN, Infinity and -Infinity (top level or nested) -> nan_not_allowed."""
    assert _code((where % token).encode()) is ErrorCode.NAN_NOT_ALLOWED
    assert _code(where % token) is ErrorCode.NAN_NOT_ALLOWED


@pytest.mark.parametrize(
    "raw",
    [
        b'{"type":"ack","seq":1,"x":"NaN"}',
        b'{"type":"ack","seq":NaNo}',
        b'{"type":"ack","x":"a\\"NaN",}',  # malformed, NaN only inside a string
    ],
)
def test_nan_inside_a_string_or_word_is_not_nan(raw: bytes) -> None:
    """SPEC E1: NaN spelled inside a string or a longer word is not reported as NaN."""
    assert _code(raw) is not ErrorCode.NAN_NOT_ALLOWED


@pytest.mark.parametrize(
    "raw",
    [
        b'{"type":"ack","seq":1,"seq":2}',
        b'{"type":"invoke","call_id":"c","tool":"t","params":{"a":1,"a":2}}',
        b'{"type":"invoke","call_id":"c","tool":"t","params":{"l":[{"k":1, "k" :1}]}}',
        '{"type":"invoke","call_id":"c","tool":"t","params":{"é":1,"é":2}}',
    ],
)
def test_duplicate_keys(raw: bytes | str) -> None:
    """SPEC E1: a repeated key, top level or nested -> duplicate_key."""
    assert _code(raw) is ErrorCode.DUPLICATE_KEY


@pytest.mark.parametrize(
    "raw",
    [
        b'{"type":"invoke","call_id":"c","tool":"t","params":{"a":"x\\":y","b":"a\\":"}}',
        b'{"type":"invoke","call_id":"c","tool":"t","params":{"a":"\\\\","b":"\\"a\\":"}}',
        '{"type":"invoke","call_id":"c","tool":"t","params":{"a":"b\\":", "c": ":"}}',
    ],
)
def test_string_value_containing_quote_colon_is_not_a_key(raw: bytes | str) -> None:
    """SPEC E1: a string value containing '":' is not counted as a (duplicate) key."""
    assert not isinstance(codec.decode_client(raw), DecodeError)


def _nested(depth: int) -> bytes:
    # The message object is level 1; each params level adds one.
    inner = "{}"
    for _ in range(depth - 2):
        inner = '{"a":' + inner + "}"
    return ('{"type":"invoke","id":"r1","call_id":"c","tool":"t","params":' + inner + "}").encode()


def test_too_deep_default_limit() -> None:
    """SPEC E1: nesting past the default limit (32) -> too_deep with the id echoed."""
    assert not isinstance(codec.decode_client(_nested(codec.DEFAULT_MAX_DEPTH)), DecodeError)
    result = codec.decode_client(_nested(codec.DEFAULT_MAX_DEPTH + 1))
    assert isinstance(result, DecodeError)
    assert (result.code, result.request_id) == (ErrorCode.TOO_DEEP, "r1")


def test_too_deep_limit_is_configurable() -> None:
    """SPEC E1/E2: max_depth is configurable; arrays count as levels too."""
    assert not isinstance(codec.decode_client(_nested(4), max_depth=4), DecodeError)
    assert _code(_nested(5), max_depth=4) is ErrorCode.TOO_DEEP
    raw = b'{"type":"invoke","call_id":"c","tool":"t","params":{"a":[[1]]}}'
    assert not isinstance(codec.decode_client(raw, max_depth=4), DecodeError)
    assert _code(raw, max_depth=3) is ErrorCode.TOO_DEEP


def test_too_deep_for_the_json_parser() -> None:
    """SPEC E1: nesting past the parser's own limit -> too_deep, not malformed_json."""
    assert _code(b"[" * 2000 + b"]" * 2000) is ErrorCode.TOO_DEEP


@pytest.mark.parametrize(
    "raw", [b"[]", b'[{"type":"ack","seq":1}]', b'"ack"', b"42", b"null", b"true"]
)
def test_not_an_object(raw: bytes) -> None:
    """SPEC E1: a JSON array, string, number, null or bool -> not_an_object."""
    assert _code(raw) is ErrorCode.NOT_AN_OBJECT


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'{"seq":1}', ErrorCode.MISSING_TYPE),
        (b'{"type":"launch_missiles"}', ErrorCode.UNKNOWN_TYPE),
        (b'{"type":"welcome"}', ErrorCode.UNKNOWN_TYPE),  # a server type from a client
        (b'{"type":1}', ErrorCode.UNKNOWN_TYPE),
        (b'{"type":"ack"}', ErrorCode.MISSING_FIELD),
        (b'{"type":"invoke","call_id":"c"}', ErrorCode.MISSING_FIELD),
        (b'{"type":"ack","seq":1,"x":1}', ErrorCode.EXTRA_FIELD),
        (b'{"type":"hello","options":{"confirm_tool_calls":true,"x":1}}', ErrorCode.EXTRA_FIELD),
        (b'{"type":"ack","seq":"1"}', ErrorCode.WRONG_TYPE),
        (b'{"type":"ack","seq":1.0}', ErrorCode.WRONG_TYPE),
        (b'{"type":"ack","seq":true}', ErrorCode.WRONG_TYPE),
        (b'{"type":"call.cancel","call_id":1}', ErrorCode.WRONG_TYPE),
        (b'{"type":"hello","options":{"confirm_tool_calls":"yes"}}', ErrorCode.WRONG_TYPE),
        (b'{"type":"hello","context":{"a":1}}', ErrorCode.WRONG_TYPE),
        (b'{"type":"invoke","call_id":"c","tool":"t","params":[]}', ErrorCode.WRONG_TYPE),
        (b'{"type":"ack","seq":-1}', ErrorCode.INVALID_VALUE),
        (b'{"type":"job.list","limit":0}', ErrorCode.INVALID_VALUE),
        (b'{"type":"job.list","status":"paused"}', ErrorCode.INVALID_VALUE),
        (b'{"type":"tool.confirm","approval_id":"a","decision":"maybe"}', ErrorCode.INVALID_VALUE),
        (b'{"type":"invoke","call_id":"","tool":"t"}', ErrorCode.INVALID_VALUE),
    ],
)
def test_message_level_errors(raw: bytes, code: ErrorCode) -> None:
    """SPEC E1: missing/unknown type, missing/extra field, wrong type, invalid value."""
    assert _code(raw) is code
    assert close_for(code) is None


def test_all_decode_codes_are_distinct_and_covered() -> None:
    """SPEC E1: the bad-input kinds above map to distinct codes; each one is exercised."""
    kinds = {
        b"\xff": ErrorCode.INVALID_UTF8,
        b"{": ErrorCode.MALFORMED_JSON,
        b'{"a":NaN}': ErrorCode.NAN_NOT_ALLOWED,
        b'{"a":1,"a":1}': ErrorCode.DUPLICATE_KEY,
        b"[" * 2000: ErrorCode.TOO_DEEP,
        b"[]": ErrorCode.NOT_AN_OBJECT,
        b"{}": ErrorCode.MISSING_TYPE,
        b'{"type":"x"}': ErrorCode.UNKNOWN_TYPE,
        b'{"type":"ack"}': ErrorCode.MISSING_FIELD,
        b'{"type":"bye","x":1}': ErrorCode.EXTRA_FIELD,
        b'{"type":"ack","seq":"1"}': ErrorCode.WRONG_TYPE,
        b'{"type":"ack","seq":-1}': ErrorCode.INVALID_VALUE,
    }
    assert {raw: _code(raw) for raw in kinds} == kinds
    assert len(set(kinds.values())) == len(kinds)


@pytest.mark.parametrize(
    ("raw", "request_id"),
    [
        (b'{"type":"ack","id":"r1","seq":1}', "r1"),  # ack has no id: extra field, still echoed
        (b'{"type":"job.get","id":"r2"}', "r2"),
        (b'{"type":"nope","id":"r3"}', "r3"),
        (b'{"id":"r4"}', "r4"),
        (b'{"type":"bye","id":"r5","id":"r5"}', "r5"),
        (b'{"type":"bye","id":7,"x":1}', None),  # unreadable: not a string
        (b'{"type":"bye","id":"","x":1}', None),  # unreadable: not a valid request id
        (b'{"type":"bye","id":"' + b"x" * 129 + b'"}', None),
        (b'{"type":"bye","id":"r6"', None),  # malformed: nothing is readable
    ],
)
def test_request_id_echoed_when_readable(raw: bytes, request_id: str | None) -> None:
    """SPEC E1: the error carries the request's id when it could be read, else None."""
    result = codec.decode_client(raw)
    assert isinstance(result, DecodeError)
    assert result.request_id == request_id
    # Whatever was read, the gateway can always build the error reply from it.
    Error(id=result.request_id, code=result.code, message=result.message)


@pytest.mark.parametrize(
    ("code", "close"),
    [
        (ErrorCode.INVALID_UTF8, CloseCode.INVALID_FRAME_PAYLOAD_DATA),
        (ErrorCode.TOO_LARGE, CloseCode.MESSAGE_TOO_BIG),
        (ErrorCode.HELLO_REQUIRED, CloseCode.POLICY_VIOLATION),
        (ErrorCode.HELLO_TIMEOUT, CloseCode.POLICY_VIOLATION),
        (ErrorCode.UNSUPPORTED_VERSION, CloseCode.POLICY_VIOLATION),
        (ErrorCode.AUTH_FAILED, CloseCode.AUTH_FAILED),
        (ErrorCode.INTERNAL, CloseCode.INTERNAL_ERROR),
        (ErrorCode.BINARY_FRAME, None),
        (ErrorCode.UNEXPECTED_MESSAGE, None),
        (ErrorCode.UNKNOWN_TOOL, None),
    ],
)
def test_close_disposition(code: ErrorCode, close: CloseCode | None) -> None:
    """SPEC E1: close_for() says which errors close the stream and with which code."""
    assert close_for(code) is close
    assert ProtocolError(code, "m").close is close


def test_close_codes_are_rfc_or_private_range() -> None:
    """SPEC E1: every close a disposition forces is an RFC 6455 code or in 4000-4999."""
    for close in filter(None, ERROR_DISPOSITION.values()):
        assert 1000 <= close < 1016 or 4000 <= close < 5000


def test_protocol_error_equality_and_repr() -> None:
    """SPEC E1: errors compare by class, code, message and id (tests rely on it)."""
    a = DecodeError(ErrorCode.MISSING_FIELD, "seq: missing", "r1")
    assert a == DecodeError(ErrorCode.MISSING_FIELD, "seq: missing", "r1")
    assert a != StateError(ErrorCode.MISSING_FIELD, "seq: missing", "r1")
    assert a != DecodeError(ErrorCode.MISSING_FIELD, "seq: missing", None)
    assert a != "missing_field"
    assert hash(a) == hash(DecodeError(ErrorCode.MISSING_FIELD, "seq: missing", "r1"))
    assert repr(a) == "DecodeError('missing_field', 'seq: missing', 'r1')"


@pytest.mark.parametrize(
    "text",
    ["short", "a" * 123, "a" * 124, "é" * 100, "a" + "é" * 100, "€" * 50, "a" + "🙂" * 40],
)
def test_close_reason_fits_a_control_frame(text: str) -> None:
    """SPEC E1 (RFC 6455 5.5): close_reason() keeps <= 123 bytes, never splitting UTF-8."""
    reason = close_reason(text)
    raw = reason.encode()
    assert len(raw) <= MAX_CLOSE_REASON_BYTES
    assert text.startswith(reason)
    # Nothing was dropped that would still have fitted.
    assert reason == text or len(raw) > MAX_CLOSE_REASON_BYTES - 4


def test_nesting_far_past_the_limit_is_too_deep() -> None:
    """SPEC E1: a thousand levels (orjson parses them) are refused too_deep, never a
    RecursionError escaping the codec."""
    raw = b'{"type":"ack","seq":1,"x":' + b"[" * 1000 + b"]" * 1000 + b"}"
    assert _code(raw) is ErrorCode.TOO_DEEP


# -- SPEC E1, I4: numbers toolbus cannot carry in an invoke's params ------------------------

_INVOKE = '{"type":"invoke","id":"r1","call_id":"c","tool":"t","params":{"a":[1,{"v/w":%s}]}}'


@pytest.mark.parametrize(
    ("number", "what"),
    [
        ("1180591620717411303424", "integer 1180591620717411303424 is wider than 64 bits"),
        ("18446744073709551616", "integer 18446744073709551616 is wider than 64 bits"),
        ("-9223372036854775809", "integer -9223372036854775809 is wider than 64 bits"),
        ("1e400", "number Infinity is past the range of a 64-bit float"),
        ("-1e400", "number -Infinity is past the range of a 64-bit float"),
    ],
)
def test_unrepresentable_param_number_is_invalid_params(number: str, what: str) -> None:
    """SPEC E1, I4, M4: an integer past 64 bits (orjson would read it as a float) or a
    number past a double's range -> invalid_params with the JSON pointer and the id,
    the text the /mcp endpoint gives for the same arguments."""
    for raw in (_INVOKE % number, (_INVOKE % number).encode()):
        result = codec.decode_client(raw)
        assert result == DecodeError(ErrorCode.INVALID_PARAMS, f"/a/1/v~1w: {what}", "r1")
        assert result.close is None
    assert (
        codec.params_problem({"a": [1, {"v/w": float(number) if "e" in number else int(number)}]})
        == f"/a/1/v~1w: {what}"
    )


@pytest.mark.parametrize(
    "number", ["18446744073709551615", "-9223372036854775808", "1e300", "1.8446744073709552e19"]
)
def test_representable_param_numbers_pass(number: str) -> None:
    """SPEC E1, I4: 64-bit integers and large floats are kept as they are."""
    result = codec.decode_client(_INVOKE % number)
    assert not isinstance(result, DecodeError), result
    assert codec.params_problem({"a": 1, "b": [2.5, None, "x"]}) is None


def test_out_of_range_number_outside_invoke_params_stays_malformed() -> None:
    """SPEC E1: 1e400 outside an invoke's params is malformed JSON, as before."""
    assert _code(b'{"type":"ack","seq":1e400}') is ErrorCode.MALFORMED_JSON
