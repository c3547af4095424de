"""Every profile's ``catalog`` frame fits the announced frame size (SPEC E2, C3).

``welcome.limits.max_message_bytes`` bounds every frame the server sends. A ``catalog``
event carries the whole visible catalog of a session in one frame, so a catalog too
large for the announced size cannot be sent at all. It is refused where it enters:

- at start (``toolbus serve``, ``toolbus check`` and :class:`gateway.server.Gateway`),
  one line per profile naming the profile and both sizes (:func:`oversized`);
- at hot reload (and when a mounted MCP server's tools arrive): the new catalog is not
  swapped in, an error is logged, and the previous one stays
  (:class:`gateway.catalog_state.CatalogState`).

A session sees a subset of its profile's tools that depends on its context and origin
(SPEC S5). The check measures the *widest* catalog a session of the profile can be
shown: every tool the profile is granted (capability, dangerous opt-in) in some context
and origin, in the largest envelope (a 20-digit ``seq``, a 128-character request ``id``
of characters JSON escapes as 6 bytes each, the longest ``reason``). A catalog that
passes fits every session of the profile.
"""

from __future__ import annotations

from catalog.exports import catalog_version, tool_info
from catalog.model import Catalog, Profile, ToolDef
from catalog.visibility import Scope, check_access
from protocol import messages as m
from protocol.codec import encode

_WIDEST_ID = "\x00" * 128
"""A request id of the most JSON bytes a client may send (max 128 characters, each
escaped as ``\\u0000``)."""
_WIDEST_SEQ = 2**64 - 1
"""The widest ``seq`` the codec writes (20 digits), more than any session reaches."""
_WIDEST_REASON = max(m.CatalogReason, key=lambda reason: len(reason.value))


class CatalogTooLarge(ValueError):
    """A profile's catalog frame exceeds ``server.max_message_bytes`` (SPEC E2); the
    message has one line per profile (see :func:`oversized`)."""


def widest_tools(catalog: Catalog, profile: Profile) -> list[ToolDef]:
    """Every tool a session of ``profile`` may be shown in some context and origin."""
    return [
        tool
        for _, tool in sorted(catalog.tools.items())
        if check_access(tool, profile, _opening(tool), catalog.safe_default) is None
    ]


def _opening(tool: ToolDef) -> Scope:
    """A scope that passes ``tool``'s context and origin rules (SPEC S5)."""
    rules = tool.visibility
    context = dict.fromkeys(rules.requires_context, "x")
    return Scope(context, rules.origins[0] if rules.origins else None)


def frame_bytes(catalog: Catalog, profile: Profile) -> int:
    """Bytes of the largest ``catalog`` frame a session of ``profile`` can be sent."""
    tools = widest_tools(catalog, profile)
    frame = m.Catalog(
        seq=_WIDEST_SEQ,
        id=_WIDEST_ID,
        version=catalog_version(tools),
        reason=_WIDEST_REASON,
        tools=[m.ToolInfo(**tool_info(tool)) for tool in tools],
    )
    return len(encode(frame))


def oversized(catalog: Catalog, max_frame: int) -> list[str]:
    """One line per profile whose catalog frame exceeds ``max_frame`` bytes (SPEC E2).

    Args:
        catalog: the loaded catalog (mounted MCP tools included when there are any).
        max_frame: the announced ``server.max_message_bytes``, in bytes.

    Returns:
        e.g. ``profile 'demo': its catalog frame takes 4668 bytes, more than
        server.max_message_bytes (4096); raise server.max_message_bytes or grant the
        profile fewer tools``; ``[]`` when every profile fits.
    """
    lines = []
    for name, profile in sorted(catalog.profiles.items()):
        size = frame_bytes(catalog, profile)
        if size > max_frame:
            lines.append(
                f"profile {name!r}: its catalog frame takes {size} bytes, more than "
                f"server.max_message_bytes ({max_frame}); raise server.max_message_bytes "
                f"or grant the profile fewer tools"
            )
    return lines


def check_fits(catalog: Catalog, max_frame: int | None) -> None:
    """Raise :class:`CatalogTooLarge` when some profile's catalog frame does not fit
    ``max_frame`` bytes (``None``: no bound)."""
    lines = [] if max_frame is None else oversized(catalog, max_frame)
    if lines:
        raise CatalogTooLarge("\n".join(lines))
