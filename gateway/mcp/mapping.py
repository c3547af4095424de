"""An MCP ``CallToolResult`` as a toolbus result object with artifacts (SPEC M3).

The table (docs/mcp.md repeats it):

================  =============================================================
MCP               toolbus result object
================  =============================================================
``text``          ``content[i] = {"type": "text", "text"}``; all text blocks,
                  joined by newlines, are ``text`` and (clipped) ``summary``
``image``         ``content[i] = {"type": "image", "mime_type", "artifact"}`` and
                  an artifact ``{"name", "mime_type", "encoding": "base64",
                  "content"}``
``audio``         as ``image``, with ``"type": "audio"``
``resource``      ``content[i] = {"type": "resource", "uri", "mime_type"?,
                  "artifact"}`` and an artifact with the ``uri``: ``content`` is
                  the text, or the base64 blob with ``"encoding": "base64"``
``resource_link`` ``content[i] = {"type": "resource_link", "uri", "name",
                  "mime_type"?, "description"?}`` and an artifact holding the
                  same reference (``uri``, no ``content``)
annotations       kept on the content entry as ``annotations``
``structured``    ``structuredContent`` as is, under ``structured``
``isError``       not a result: ``handler_error`` with the joined text
================  =============================================================

An async tool's ``summary`` and ``artifacts`` become ``job.done``'s (SPEC J4).
"""

from __future__ import annotations

import posixpath
from typing import Any

import mcp_types as types

SUMMARY_CHARS = 200
"""Longest ``summary`` taken from the text blocks (a voice agent speaks it)."""

_EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/mpeg": "mp3",
    "audio/ogg": "ogg",
}


def _name(tool: str, index: int, mime_type: str | None) -> str:
    ext = _EXTENSIONS.get(mime_type or "", "bin")
    return f"{tool}-{index}.{ext}"


def _uri_name(uri: str, fallback: str) -> str:
    base = posixpath.basename(uri.rstrip("/"))
    return base or fallback


def _annotated(entry: dict[str, Any], block: Any) -> dict[str, Any]:
    annotations = getattr(block, "annotations", None)
    if annotations is not None:
        entry["annotations"] = annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
    return entry


def _media(
    block: types.ImageContent | types.AudioContent, tool: str, index: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    name = _name(tool, index, block.mime_type)
    artifact = {
        "name": name,
        "mime_type": block.mime_type,
        "encoding": "base64",
        "content": block.data,
    }
    return {"type": block.type, "mime_type": block.mime_type, "artifact": name}, artifact


def _resource(
    block: types.EmbeddedResource, tool: str, index: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    res = block.resource
    uri = str(res.uri)
    name = _uri_name(uri, f"{tool}-{index}")
    artifact: dict[str, Any] = {"name": name, "uri": uri, "mime_type": res.mime_type}
    if isinstance(res, types.TextResourceContents):
        artifact["content"] = res.text
    else:
        artifact["encoding"] = "base64"
        artifact["content"] = res.blob
    entry = {"type": "resource", "uri": uri, "mime_type": res.mime_type, "artifact": name}
    return {k: v for k, v in entry.items() if v is not None}, {
        k: v for k, v in artifact.items() if v is not None
    }


def _link(block: types.ResourceLink) -> tuple[dict[str, Any], dict[str, Any]]:
    reference = {
        "uri": str(block.uri),
        "name": block.name,
        "mime_type": block.mime_type,
        "description": block.description,
    }
    reference = {k: v for k, v in reference.items() if v is not None}
    return {"type": "resource_link", **reference}, dict(reference)


def error_text(result: types.CallToolResult) -> str:
    """The text of an ``isError`` result for ``handler_error`` (SPEC M3)."""
    texts = [b.text for b in result.content if isinstance(b, types.TextContent)]
    return "\n".join(texts) or "the MCP server reported an error without text"


def to_result(result: types.CallToolResult, tool: str) -> dict[str, Any]:
    """Map a successful ``CallToolResult`` to the toolbus result object (SPEC M3).

    Args:
        result: what the MCP server answered (``isError`` false).
        tool: the toolbus tool name, used to name unnamed artifacts.

    Returns:
        ``{"content": [...], "artifacts": [...], "text"?, "summary"?, "structured"?}``
        as in the module's table.
    """
    content: list[dict[str, Any]] = []
    artifacts: list[dict[str, Any]] = []
    texts: list[str] = []
    for index, block in enumerate(result.content):
        if isinstance(block, types.TextContent):
            texts.append(block.text)
            entry: dict[str, Any] = {"type": "text", "text": block.text}
        elif isinstance(block, types.ImageContent | types.AudioContent):
            entry, artifact = _media(block, tool, index)
            artifacts.append(artifact)
        elif isinstance(block, types.EmbeddedResource):
            entry, artifact = _resource(block, tool, index)
            artifacts.append(artifact)
        elif isinstance(block, types.ResourceLink):
            entry, artifact = _link(block)
            artifacts.append(artifact)
        else:  # a content type newer than this table: passed through as JSON
            entry = block.model_dump(mode="json", by_alias=True, exclude_none=True)
        content.append(_annotated(entry, block))
    mapped: dict[str, Any] = {"content": content, "artifacts": artifacts}
    if texts:
        joined = "\n".join(texts)
        mapped["text"] = joined
        mapped["summary"] = (
            joined if len(joined) <= SUMMARY_CHARS else joined[: SUMMARY_CHARS - 1] + "…"
        )
    if result.structured_content is not None:
        mapped["structured"] = result.structured_content
    return mapped
