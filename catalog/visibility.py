"""Who may see and call which tool: the one gate function (SPEC C2, C3, I2).

:func:`check_access` is used twice with the same arguments: to build a session's
catalog (:func:`visible_tools`, SPEC C3) and again at execution time (SPEC I2), since
the client's copy of the catalog is a convenience, not a control. Keeping one function
means the catalog a session sees and the calls it may make can never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from catalog.model import Catalog, Profile, ToolDef
from protocol.outcomes import CallOutcome


class Denial(StrEnum):
    """Why a tool is refused; the values are the wire outcome codes (SPEC I2, I11), taken
    from the one outcome vocabulary, :class:`protocol.outcomes.CallOutcome`."""

    CAPABILITY = CallOutcome.DENIED_CAPABILITY.value
    DANGEROUS = CallOutcome.DENIED_DANGEROUS.value
    SCOPE = CallOutcome.DENIED_SCOPE.value


@dataclass(frozen=True, slots=True)
class Scope:
    """The session facts visibility depends on (SPEC S5).

    Attributes:
        context: the session context, e.g. ``{"project_id": "p1"}``.
        origin: the connection's ``Origin`` header, or ``None`` (non-browser client).
    """

    context: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    origin: str | None = None


def _granted(tool: ToolDef, profile: Profile, safe_default: frozenset[str]) -> bool:
    if tool.capability in profile.capabilities:
        return True
    return profile.legacy_tools and tool.name in safe_default


def _in_scope(tool: ToolDef, profile: Profile, scope: Scope) -> bool:
    rules = tool.visibility
    if any(not scope.context.get(key) for key in rules.requires_context):
        return False
    if rules.origins and scope.origin not in rules.origins:
        return False
    return profile.sandbox or not rules.sandbox_only


def check_access(
    tool: ToolDef,
    profile: Profile,
    scope: Scope,
    safe_default: frozenset[str] = frozenset(),
) -> Denial | None:
    """Whether ``profile`` in ``scope`` may see and call ``tool`` (SPEC C2, I2).

    Checks, in this order, and answers the first failure:

    1. capability: ``tool.capability`` is granted, or the profile is legacy
       (``tools: true``) and the tool is in ``safe_default`` -> else ``CAPABILITY``;
    2. dangerous: a dangerous tool also needs its name in ``allow_dangerous``; a
       capability alone never implies it -> else ``DANGEROUS``;
    3. scope: every ``requires_context`` key present and non-empty, the origin allowed
       when ``origins`` is set, ``sandbox_only`` only for sandbox profiles -> else
       ``SCOPE``.

    Args:
        tool: the tool asked for.
        profile: the session's profile (the empty profile grants nothing).
        scope: the session's context and origin.
        safe_default: the catalog's legacy safe set (:attr:`Catalog.safe_default`).

    Returns:
        ``None`` when allowed, else the :class:`Denial`.
    """
    if not _granted(tool, profile, safe_default):
        return Denial.CAPABILITY
    if tool.dangerous and tool.name not in profile.allow_dangerous:
        return Denial.DANGEROUS
    if not _in_scope(tool, profile, scope):
        return Denial.SCOPE
    return None


def visible_tools(catalog: Catalog, profile: Profile, scope: Scope) -> list[ToolDef]:
    """The tools ``profile`` sees in ``scope``: its session catalog (SPEC C3).

    Returns:
        Every tool for which :func:`check_access` answers ``None``, sorted by name.
    """
    return [
        tool
        for name, tool in sorted(catalog.tools.items())
        if check_access(tool, profile, scope, catalog.safe_default) is None
    ]
