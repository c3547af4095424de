"""The duplicate-key scan of the codec counts exactly the keys of any JSON text (SPEC E1).

``protocol.codec._count_keys`` is on every decode, client and server. Its regular
expression is written for speed (issue 13); these tests pin that it still counts every
object key, and only keys, whatever the strings hold (escaped quotes, backslashes,
colons, non-ASCII) and however the text is spaced.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol.errors import DecodeError, ErrorCode

_TEXT = st.text(alphabet=st.sampled_from(list('ab:"\\ {}[],\n\té€\U0001f600')), max_size=8)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


def _keys(value: Any) -> int:
    if isinstance(value, dict):
        return len(value) + sum(_keys(v) for v in value.values())
    if isinstance(value, list):
        return sum(_keys(v) for v in value)
    return 0


@settings(max_examples=300)
@given(st.dictionaries(_TEXT, _JSON, max_size=5), st.booleans(), st.sampled_from([None, 1]))
def test_count_keys_counts_every_key(obj: dict[str, Any], ascii_only: bool, indent: Any) -> None:
    """SPEC E1: bytes and text alike, the scan finds as many keys as the object holds."""
    text = json.dumps(obj, ensure_ascii=ascii_only, indent=indent)
    assert codec._count_keys(text) == _keys(obj)
    assert codec._count_keys(text.encode()) == _keys(obj)


def test_count_keys_sees_a_key_repeated_behind_escapes() -> None:
    """SPEC E1: a repeated key after strings holding escaped quotes and colons is counted
    twice, so the decoder refuses it (duplicate_key)."""
    raw = b'{"type":"result","a":"x\\":y\\\\","b" : "\\":","a":1}'
    assert codec._count_keys(raw) == 4
    assert codec._count_keys(raw.decode()) == 4
    refused = codec.decode_server(raw)
    assert isinstance(refused, DecodeError)
    assert refused.code is ErrorCode.DUPLICATE_KEY


def test_colon_count_shortcut_never_hides_a_repeat() -> None:
    """SPEC E1: the colon-count shortcut decides only when it is exact. A repeat is
    found with colons in strings (the scan decides) and without (the counts differ);
    colons in strings alone are no repeat."""
    repeat_plain = b'{"type":"result","a":1,"a":2}'
    repeat_colons = b'{"type":"res:ult","a":"12:30","a":2}'
    colons_only = b'{"type":"result","a":"12:30","b":"x\\":"}'
    assert codec._repeats_a_key(repeat_plain, 2)
    assert codec._repeats_a_key(repeat_colons, 2)
    assert codec._repeats_a_key(repeat_colons.decode(), 2)
    assert not codec._repeats_a_key(colons_only, 3)
    assert not codec._repeats_a_key(colons_only.decode(), 3)
    assert not codec._repeats_a_key(b'{"type":"result","seq":3}', 2)
