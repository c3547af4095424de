"""A session's catalog in the shapes models and clients read (SPEC C3, C4, I1).

- :func:`tool_info` is the wire shape of one tool (``protocol.messages.ToolInfo``);
  :func:`catalog_version` hashes a list of them (SPEC C3).
- The exporters render the same filtered list as OpenAI Realtime ``session.update``
  tools, OpenAI Chat Completions tools, Anthropic tools and MCP ``tools/list`` entries
  (SPEC C4); :data:`EXPORTERS` names them for ``toolbus catalog --format``.
- :func:`suggest` gives "did you mean" names for an unknown tool (SPEC I1).

Every exporter copies ``parameters`` so a caller mutating an export never changes the
catalog. Each adapts the schema to its provider's documented rules
(:mod:`catalog.compat`, case F18) or raises :class:`ExportError` naming the tool, the
provider and the rule; :func:`export_findings` lists every finding for ``toolbus check``.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from catalog.compat import (
    ANTHROPIC,
    FORMATS,
    MCP,
    OPENAI_CHAT,
    OPENAI_REALTIME,
    Adapted,
    Finding,
    adapt,
)
from catalog.model import ToolDef
from catalog.params import canonical_json

Exporter = Callable[[Iterable[ToolDef]], list[dict[str, Any]]]


class ExportError(ValueError):
    """Some tools break a rule of the export format that toolbus cannot adapt (SPEC C4).

    Exporting them anyway would make the provider reject the whole tools list.

    Args:
        findings: the unadapted findings, one per tool and rule; at least one.
    """

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = list(findings)
        super().__init__("; ".join(str(finding) for finding in self.findings))


def _adapted(
    tools: Iterable[ToolDef], provider: str, *, strict: bool = False
) -> list[tuple[ToolDef, Adapted]]:
    pairs = [(tool, adapt(tool, provider, strict=strict)) for tool in tools]
    errors = [finding for _, done in pairs for finding in done.findings if not finding.adapted]
    if errors:
        raise ExportError(errors)
    return pairs


def export_findings(
    tools: Iterable[ToolDef], formats: Iterable[str] = FORMATS, *, strict: bool = False
) -> list[Finding]:
    """Every provider rule any of ``tools`` breaks, per format (SPEC C4, O1 ``check``).

    Args:
        tools: the tools to check (``toolbus check`` passes the whole catalog).
        formats: export formats to check, default all of :data:`catalog.compat.FORMATS`.
        strict: also report OpenAI strict-mode findings for ``openai-chat``.

    Returns:
        Findings in tool order, then format order; ``adapted`` ones are notes, the
        others mean that format cannot carry the tool.
    """
    tools = list(tools)
    return [
        finding
        for tool in tools
        for provider in formats
        for finding in adapt(tool, provider, strict=strict and provider == OPENAI_CHAT).findings
    ]


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
        (``openai.types.realtime.RealtimeFunctionToolParam``), adapted
        (:func:`catalog.compat.adapt`).

    Raises:
        ExportError: a tool breaks a rule toolbus cannot adapt.
    """
    return [
        {
            "type": "function",
            "name": tool.name,
            "description": done.description,
            "parameters": done.parameters,
        }
        for tool, done in _adapted(tools, OPENAI_REALTIME)
    ]


def to_openai_chat(tools: Iterable[ToolDef], *, strict: bool = False) -> list[dict[str, Any]]:
    """OpenAI Chat Completions ``tools`` entries (SPEC C4).

    Args:
        tools: the tools to export.
        strict: add ``"strict"`` to each function: ``true`` when its schema fits OpenAI
            strict mode (:func:`catalog.compat.strict_findings`), else ``false``.

    Returns:
        ``[{"type": "function", "function": {"name", "description", "parameters",
        "strict"?}}, ...]`` (``openai.types.chat.ChatCompletionFunctionToolParam``),
        adapted (:func:`catalog.compat.adapt`).

    Raises:
        ExportError: a tool breaks a rule toolbus cannot adapt.
    """
    entries: list[dict[str, Any]] = []
    for tool, done in _adapted(tools, OPENAI_CHAT, strict=strict):
        function: dict[str, Any] = {
            "name": tool.name,
            "description": done.description,
            "parameters": done.parameters,
        }
        if strict:
            function["strict"] = done.strict
        entries.append({"type": "function", "function": function})
    return entries


def to_anthropic(tools: Iterable[ToolDef]) -> list[dict[str, Any]]:
    """Anthropic Messages API ``tools`` entries (SPEC C4).

    Returns:
        ``[{"name", "description", "input_schema"}, ...]`` (``anthropic.types.ToolParam``),
        adapted (:func:`catalog.compat.adapt`).

    Raises:
        ExportError: a tool breaks a rule toolbus cannot adapt.
    """
    return [
        {
            "name": tool.name,
            "description": done.description,
            "input_schema": done.parameters,
        }
        for tool, done in _adapted(tools, ANTHROPIC)
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
        (``mcp.types.Tool`` by alias); see :func:`mcp_annotations`. Adapted like the
        others (:func:`catalog.compat.adapt`): MCP allows root combinators, but hosts
        pass ``inputSchema`` to OpenAI or Anthropic unchanged.

    Raises:
        ExportError: a tool breaks a rule toolbus cannot adapt.
    """
    return [_mcp_entry(tool, done) for tool, done in _adapted(tools, MCP)]


def to_mcp_carried(tools: Iterable[ToolDef]) -> tuple[list[dict[str, Any]], list[Finding]]:
    """:func:`to_mcp` of the tools MCP can carry, and why the others were left out (SPEC
    M4, C4): one tool's export problem never takes the whole list down.

    Returns:
        ``(entries, findings)``: the entries of :func:`to_mcp` for every tool without an
        unadapted finding, in order; the unadapted findings of the tools left out.
    """
    entries: list[dict[str, Any]] = []
    left_out: list[Finding] = []
    for tool in tools:
        done = adapt(tool, MCP)
        errors = [finding for finding in done.findings if not finding.adapted]
        if errors:
            left_out.extend(errors)
        else:
            entries.append(_mcp_entry(tool, done))
    return entries, left_out


def _mcp_entry(tool: ToolDef, done: Adapted) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": done.description,
        "inputSchema": done.parameters,
        "annotations": mcp_annotations(tool),
    }


EXPORTERS: dict[str, Exporter] = {
    OPENAI_REALTIME: to_openai_realtime,
    OPENAI_CHAT: to_openai_chat,
    ANTHROPIC: to_anthropic,
    MCP: to_mcp,
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
