"""A session's catalog in the shapes models and clients read (SPEC C3, C4, I1).

- :func:`tool_info` is the wire shape of one tool (``protocol.messages.ToolInfo``);
  :func:`catalog_version` hashes a list of them (SPEC C3).
- The exporters render the same filtered list as OpenAI Realtime ``session.update``
  tools, OpenAI Chat Completions tools, Anthropic tools and MCP ``tools/list`` entries
  (SPEC C4); :data:`EXPORTERS` names them for ``toolbus catalog --format``.
- :func:`suggest` gives "did you mean" names for an unknown tool (SPEC I1).

Every exporter copies ``parameters`` so a caller mutating an export never changes the
catalog.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from catalog.model import ToolDef
from catalog.params import canonical_json

Exporter = Callable[[Iterable[ToolDef]], list[dict[str, Any]]]


def tool_info(tool: ToolDef) -> dict[str, Any]:
    """The wire shape of ``tool`` in a session catalog (SPEC C3).

    Returns:
        ``{"name", "description", "parameters", "mode", "dangerous",
        "requires_approval", "category"?, "long_running", "dispatch_message"?}``;
        keys whose value is ``None`` are left out. Matches the fields of
        ``protocol.messages.ToolInfo`` exactly.
    """
    info: dict[str, Any] = {
        "name": tool.name,
        "description": tool.description,
        "parameters": copy.deepcopy(tool.parameters),
        "mode": tool.mode.value,
        "dangerous": tool.dangerous,
        "requires_approval": tool.requires_approval,
        "category": tool.category,
        "long_running": tool.long_running,
        "dispatch_message": tool.dispatch_message,
    }
    return {key: value for key, value in info.items() if value is not None}


def catalog_version(tools: Sequence[ToolDef]) -> str:
    """Content hash of a session catalog (SPEC C3 ``version``, I13 ``stale_catalog``).

    Args:
        tools: the session's visible tools, in any order.

    Returns:
        The first 16 hex digits of the SHA-256 of the canonical JSON (sorted keys, no
        whitespace) of every :func:`tool_info`, sorted by name. Independent of input
        order and of dict key order; changes when any model- or client-visible field
        of any tool changes, or a tool is added or removed.
    """
    infos = sorted((tool_info(tool) for tool in tools), key=lambda info: info["name"])
    digest = hashlib.sha256(canonical_json(infos).encode("utf-8")).hexdigest()
    return digest[:16]


def to_openai_realtime(tools: Iterable[ToolDef]) -> list[dict[str, Any]]:
    """OpenAI Realtime ``session.update`` ``session.tools`` entries (SPEC C4).

    Returns:
        ``[{"type": "function", "name", "description", "parameters"}, ...]``
        (``openai.types.realtime.RealtimeFunctionToolParam``).
    """
    return [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": copy.deepcopy(tool.parameters),
        }
        for tool in tools
    ]


def to_openai_chat(tools: Iterable[ToolDef]) -> list[dict[str, Any]]:
    """OpenAI Chat Completions ``tools`` entries (SPEC C4).

    Returns:
        ``[{"type": "function", "function": {"name", "description", "parameters"}}, ...]``
        (``openai.types.chat.ChatCompletionFunctionToolParam``).
    """
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": copy.deepcopy(tool.parameters),
            },
        }
        for tool in tools
    ]


def to_anthropic(tools: Iterable[ToolDef]) -> list[dict[str, Any]]:
    """Anthropic Messages API ``tools`` entries (SPEC C4).

    Returns:
        ``[{"name", "description", "input_schema"}, ...]`` (``anthropic.types.ToolParam``).
    """
    return [
        {
            "name": tool.name,
            "description": tool.description,
            "input_schema": copy.deepcopy(tool.parameters),
        }
        for tool in tools
    ]


def mcp_annotations(tool: ToolDef) -> dict[str, Any]:
    """MCP ``ToolAnnotations`` hints derived from the definition (SPEC C4).

    ``destructiveHint`` is ``dangerous``; ``readOnlyHint`` is ``read_only``;
    ``idempotentHint`` is ``idempotent``; ``title`` only when the tool has one.
    """
    hints: dict[str, Any] = {
        "readOnlyHint": tool.read_only,
        "destructiveHint": tool.dangerous,
        "idempotentHint": tool.idempotent,
    }
    if tool.title is not None:
        hints["title"] = tool.title
    return hints


def to_mcp(tools: Iterable[ToolDef]) -> list[dict[str, Any]]:
    """MCP ``tools/list`` result entries (SPEC C4).

    Returns:
        ``[{"name", "description", "inputSchema", "annotations": {...}}, ...]``
        (``mcp.types.Tool`` by alias); see :func:`mcp_annotations`.
    """
    return [
        {
            "name": tool.name,
            "description": tool.description,
            "inputSchema": copy.deepcopy(tool.parameters),
            "annotations": mcp_annotations(tool),
        }
        for tool in tools
    ]


EXPORTERS: dict[str, Exporter] = {
    "openai-realtime": to_openai_realtime,
    "openai-chat": to_openai_chat,
    "anthropic": to_anthropic,
    "mcp": to_mcp,
}
"""Export format name (``toolbus catalog --format``) -> exporter (SPEC C4, O1)."""


CUTOFF = 0.6
"""Least difflib similarity ratio of a suggestion."""


def _fold(name: str) -> str:
    return name.casefold().replace("-", "_")


def suggest(name: str, names: Iterable[str], limit: int = 3) -> list[str]:
    """Tool names close to ``name``, best first: "did you mean" (SPEC I1).

    Comparison ignores case and treats ``-`` like ``_`` (models mix naming styles).

    Args:
        name: the unknown name the model used.
        names: the names the session may call (its visible tools only, so a
            suggestion never reveals a hidden tool, SPEC C3).
        limit: at most this many suggestions.

    Returns:
        Up to ``limit`` names from ``names`` with difflib ratio >= :data:`CUTOFF`,
        most similar first, ties by name; ``[]`` when none is close.
    """
    by_fold: dict[str, str] = {}
    for candidate in sorted(names):
        by_fold.setdefault(_fold(candidate), candidate)
    wanted = _fold(name)
    scored = []
    for folded, candidate in by_fold.items():
        matcher = difflib.SequenceMatcher(None, folded, wanted)
        if matcher.real_quick_ratio() >= CUTOFF and matcher.ratio() >= CUTOFF:
            scored.append((-matcher.ratio(), candidate))
    return [candidate for _, candidate in sorted(scored)[:limit]]
