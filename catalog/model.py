"""The catalog's records: tools, profiles and the catalog itself (SPEC C1, C2).

Everything here is immutable data built by :mod:`catalog.loader`. The one piece of
behaviour is :meth:`Catalog.profile`, which fails closed: a profile name the catalog
does not know grants nothing, and the lookup is logged as an error (SPEC C2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from catalog.mcp_mounts import MountSpec

logger = logging.getLogger(__name__)

EMPTY_PARAMETERS: Mapping[str, Any] = MappingProxyType(
    {"type": "object", "properties": {}, "additionalProperties": False}
)
"""The schema a tool gets when its definition has no ``parameters``: no arguments at all."""


class Mode(StrEnum):
    """Where and how a tool runs (SPEC C1, I3, I9).

    ``SYNC``: the server runs the handler and answers with its value.
    ``ASYNC``: the server answers ``dispatched`` with a job id; the job runner runs it.
    ``CLIENT``: the frontend runs it; the server never executes it (``wrong_route``).
    """

    SYNC = "sync"
    ASYNC = "async"
    CLIENT = "client"


@dataclass(frozen=True, slots=True)
class Visibility:
    """Context conditions under which a granted tool is visible (SPEC C1, I2 ``denied_scope``).

    Attributes:
        requires_context: session context keys that must be present and non-empty,
            e.g. ``("project_id",)``.
        origins: allowed ``Origin`` values of the session; ``()`` allows any origin,
            including none.
        sandbox_only: visible only to sessions whose profile has ``sandbox: true``.
    """

    requires_context: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()
    sandbox_only: bool = False


@dataclass(frozen=True, slots=True)
class ToolDef:
    """One tool as loaded from a catalog file (SPEC C1).

    Attributes:
        name: model-facing name, ``^[a-zA-Z0-9_-]{1,64}$`` (OpenAI/Anthropic rule).
        description: model-facing description.
        parameters: the JSON Schema of the argument object; its root has ``type: object``.
        capability: the capability a profile must grant to see the tool (SPEC C2).
        mode: where the tool runs (:class:`Mode`).
        dangerous: never granted by capability alone; needs the profile's
            ``allow_dangerous`` (SPEC C2, I2).
        requires_approval: every call waits for a user decision (SPEC A1).
        timeout: run timeout in seconds; ``None`` = the server's global default;
            ``0`` = no timeout (SPEC I8).
        long_running: exempt from any run timeout (SPEC I8).
        promote_after: soft deadline in seconds after which a running sync call is
            promoted to a job; ``None`` = never (SPEC I14). Sync tools only.
        category: optional grouping label shown to clients.
        visibility: context conditions (SPEC I2 ``denied_scope``).
        handler: ``"module:function"`` path; set for sync/async tools, ``None`` for client.
        dispatch_message: async tools: what a voice agent says when the job starts
            (SPEC I9); ``None`` for other modes.
        idempotent: may be re-run after a server restart (SPEC J5).
        sensitive: top-level parameter names masked in audit records (SPEC I11).
        source: the file (or label) the tool was loaded from, for error messages.
        func: the resolved handler, or ``None`` for client tools or when the catalog
            was loaded without resolving handlers.
        read_only: the tool does not modify anything (MCP ``readOnlyHint``, SPEC C4).
        title: optional human-readable title (MCP ``annotations.title``, SPEC C4).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    capability: str
    mode: Mode
    dangerous: bool = False
    requires_approval: bool = False
    timeout: float | None = None
    long_running: bool = False
    promote_after: float | None = None
    category: str | None = None
    visibility: Visibility = field(default_factory=Visibility)
    handler: str | None = None
    dispatch_message: str | None = None
    idempotent: bool = False
    sensitive: tuple[str, ...] = ()
    source: str = ""
    func: Callable[..., Any] | None = None
    read_only: bool = False
    title: str | None = None


@dataclass(frozen=True, slots=True)
class Profile:
    """What a session may use (SPEC C2).

    Attributes:
        name: the profile's name (``""`` for the empty profile of a missing name).
        capabilities: capabilities granted; a tool is visible when its capability is here.
        allow_dangerous: names of dangerous tools opted into; a dangerous tool needs both
            its capability and its name here.
        auto_approve: tool names that skip the approval gate (SPEC A1).
        sandbox: sandbox sessions see ``sandbox_only`` tools.
        legacy_tools: legacy ``tools: true`` flag: the catalog's ``safe_default`` tools
            are granted as if by capability (never a dangerous one).
    """

    name: str
    capabilities: frozenset[str] = frozenset()
    allow_dangerous: frozenset[str] = frozenset()
    auto_approve: frozenset[str] = frozenset()
    sandbox: bool = False
    legacy_tools: bool = False

    @classmethod
    def empty(cls, name: str | None = None) -> Profile:
        """The profile that grants nothing: what fail-closed lookups return (SPEC C2).

        Args:
            name: the requested name, kept for logs and audit; ``None`` becomes ``""``.
        """
        return cls(name=name or "")


@dataclass(frozen=True, slots=True)
class Catalog:
    """A loaded, validated catalog: every tool, every profile (SPEC C1, C2).

    Attributes:
        tools: tool name -> definition, every tool of every file.
        profiles: profile name -> profile.
        guidance: invented tool name -> text telling the model what to use instead (SPEC I1).
        safe_default: tool names granted to legacy ``tools: true`` profiles; never holds
            a dangerous tool (SPEC C2).
        mounts: the MCP servers the tools files name (SPEC M1); their tools are added
            by the gateway once each server answers.
    """

    tools: Mapping[str, ToolDef] = field(default_factory=lambda: MappingProxyType({}))
    profiles: Mapping[str, Profile] = field(default_factory=lambda: MappingProxyType({}))
    guidance: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    safe_default: frozenset[str] = frozenset()
    mounts: tuple[MountSpec, ...] = ()

    def profile(self, name: str | None) -> Profile:
        """The profile called ``name``, failing closed (SPEC C2).

        Args:
            name: the requested profile, or ``None`` when the session named none.

        Returns:
            The profile, or :meth:`Profile.empty` when ``name`` is ``None`` or unknown;
            that case is logged at ERROR on the ``catalog`` logger tree, since a
            session asking for a profile that does not exist is a configuration bug.
        """
        found = self.profiles.get(name) if name is not None else None
        if found is None:
            logger.error("profile %r is not defined; granting nothing (SPEC C2)", name)
            return Profile.empty(name)
        return found
