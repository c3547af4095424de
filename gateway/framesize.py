"""Server frames fit the size the server announces (SPEC E2).

``welcome.limits.max_message_bytes`` is the largest frame either side may send. The
server echoes an invoke's ``params`` in ``tool_start`` and sends a handler's value in
``result``, each inside an envelope (type, seq, call_id, tool, approval_id, …). So that
those frames never exceed the announced size, the JSON *payload* of either one (params
as the server encodes them, or the result object) may be at most
``max_message_bytes - 256 - len(JSON of call_id) - len(JSON of tool)`` bytes
(:func:`payload_budget`):

- an invoke whose params are larger ends with ``call.error`` ``invalid_params`` (one
  violation at pointer ``""``, keyword ``maxBytes``) before anything runs;
- a handler value that is larger ends the call with ``call.error`` ``handler_error``
  naming both sizes, instead of a ``result`` the client would have to refuse (1009).

A job's ``job.done`` is checked whole, where the job runner encodes it.
"""

from __future__ import annotations

from typing import Any

from protocol.codec import encode_json

ENVELOPE = 256
"""Bytes of a ``tool_start`` or ``result`` frame besides the payload, ``call_id`` and
``tool``: type, keys, ``seq`` (up to 20 digits), ``approval_id`` and ``expires_at``, or
``declined``/``replaced``. ``tests/gateway/test_small_faults.py`` builds the largest
such envelope and checks it fits."""


WIDEST_SEQ = 10**19
"""A ``seq`` of 20 digits, more than any session reaches (64-bit): a frame sized whole
before its ``seq`` is known (``job.done``) is sized with it, so the frame that leaves
under the session's real ``seq`` is never larger (SPEC E2)."""


def payload_budget(max_frame: int, call_id: str, tool: str) -> int:
    """The largest params or result, in bytes of JSON, whose ``tool_start`` or
    ``result`` frame for this call fits ``max_frame`` bytes (SPEC E2)."""
    return max_frame - ENVELOPE - len(encode_json(call_id)) - len(encode_json(tool))


def oversize(value: Any, budget: int) -> int | None:
    """The JSON size of ``value`` when it exceeds ``budget`` bytes, else ``None``.

    A value the codec cannot encode is not judged here (``None``): the caller's encoder
    reports it with its own message.
    """
    try:
        size = len(encode_json(value))
    except (TypeError, ValueError):
        return None
    return size if size > budget else None


def clip_text(text: str, budget: int) -> str:
    """``text`` cut short (ending ``…``) so that its JSON string takes at most ``budget``
    bytes, or ``text`` itself when it fits (SPEC E2: an error message a handler chose,
    e.g. a 1 MB exception text, must not make its ``call.error``/``job.failed`` frame
    larger than ``max_message_bytes``)."""
    if len(encode_json(text)) <= budget:
        return text
    keep = max(budget - 8, 0)
    while keep and len(encode_json(text[:keep] + "…")) > budget:
        keep = keep * 3 // 4
    return text[:keep] + "…" if keep else ""


def too_deep(value: Any, levels: int) -> bool:
    """Whether ``value`` nests dicts and lists (tuples too) more than ``levels`` deep,
    ``value`` itself being level 1 (SPEC I16: a ``result`` sits at level 2 of its frame,
    so a client that decodes at most :data:`protocol.codec.SERVER_MAX_DEPTH` levels
    reads a value of up to ``SERVER_MAX_DEPTH - 1``).

    Depth first and iterative; it stops at the first container past ``levels``, so a
    value that contains itself ends the walk quickly too.
    """
    containers = (dict, list, tuple)
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, containers) else []
    while stack:
        item, depth = stack.pop()
        if depth > levels:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, containers))
    return False
