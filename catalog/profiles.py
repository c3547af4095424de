"""Profiles files -> :class:`Profile` records, and grant checks against the tools (SPEC C2).

A profiles file is a mapping::

    safe_default: [clock_now, convert_units]   # granted to legacy ``tools: true`` profiles
    profiles:
      NAME:
        capabilities: [notes, time]
        allow_dangerous: [notes_delete]
        auto_approve: [clock_now]
        sandbox: false
        tools: true          # legacy flag

:class:`ProfileShape` and :class:`ProfilesFileShape` are the shapes (pydantic models,
:mod:`catalog.shapes`): unknown keys are errors. Names in ``allow_dangerous``, ``auto_approve`` and
``safe_default`` must be tools of the catalog (typo protection); a dangerous tool in
``safe_default`` is dropped and reported, since legacy profiles never get one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field, Strict, ValidationError

from catalog.errors import LoadIssue
from catalog.model import Profile, ToolDef
from catalog.shapes import Flag, Names, Shape, in_document_order, problems, says


class ProfileShape(Shape):
    """One profile as written (SPEC C2); docs/catalog.md describes each key."""

    capabilities: Names = []
    allow_dangerous: Names = []
    auto_approve: Names = []
    sandbox: Flag = False
    legacy_tools: Flag = Field(default=False, alias="tools")


class ProfilesFileShape(Shape):
    """The top level of a profiles file; each profile is checked on its own."""

    safe_default: Names = []
    profiles: Annotated[
        dict[Any, Any], Strict(), says("must be a mapping of profile name -> profile")
    ] = {}


def _top_level(key: str, allowed: Iterable[str]) -> str:
    return f"{key}: unknown top-level key; allowed: {', '.join(sorted(allowed))}"


def profile_label(name: str) -> str:
    """How issues name a profile: ``profile:NAME``."""
    return f"profile:{name}"


@dataclass(slots=True)
class ProfilesDoc:
    """What one profiles file holds, and its problems (file-local checks only)."""

    source: str
    profiles: dict[str, Profile] = field(default_factory=dict)
    safe_default: tuple[str, ...] = ()
    issues: list[LoadIssue] = field(default_factory=list)

    def problem(self, who: str | None, message: str) -> None:
        self.issues.append(LoadIssue(self.source, who, message))


def _parse_profile(doc: ProfilesDoc, name: str, raw: Any) -> None:
    who = profile_label(name)
    try:
        shape = ProfileShape.model_validate(raw)
    except ValidationError as exc:
        found = problems(exc, ProfileShape, not_mapping="a profile must be a mapping")
        for text in in_document_order(found, raw if isinstance(raw, Mapping) else {}):
            doc.problem(who, text)
        return
    doc.profiles[name] = Profile(
        name=name,
        capabilities=frozenset(shape.capabilities),
        allow_dangerous=frozenset(shape.allow_dangerous),
        auto_approve=frozenset(shape.auto_approve),
        sandbox=shape.sandbox,
        legacy_tools=shape.legacy_tools,
    )


def parse_profiles(raw: Any, source: str) -> ProfilesDoc:
    """Validate one profiles document (SPEC C2).

    Args:
        raw: the parsed YAML document (``None`` for an empty file).
        source: the file it came from.

    Returns:
        The valid profiles, the file's ``safe_default`` names, and every problem. A
        profile with any problem is left out, so it fails closed at lookup.
    """
    doc = ProfilesDoc(source)
    if raw is None:
        return doc
    try:
        shape = ProfilesFileShape.model_validate(raw)
    except ValidationError as exc:
        found = problems(exc, ProfilesFileShape, not_mapping=_NOT_A_FILE, unknown=_top_level)
        for problem in sorted(found, key=lambda p: (not p.unknown, p.key if p.unknown else "")):
            doc.problem(None, problem.text)
        bad = {p.key for p in found}
        if not isinstance(raw, Mapping) or "profiles" in bad:
            return doc
        # Unknown keys or a bad safe_default leave the profiles to check (SPEC C2).
        safe = [] if "safe_default" in bad else raw.get("safe_default", [])
        shape = ProfilesFileShape.model_construct(
            safe_default=safe, profiles=raw.get("profiles", {})
        )
    doc.safe_default = tuple(sorted(set(shape.safe_default)))
    for name, body in shape.profiles.items():
        if not isinstance(name, str) or not name:
            doc.problem(None, f"profiles: profile name {name!r} must be a non-empty string")
            continue
        _parse_profile(doc, name, body)
    return doc


_NOT_A_FILE = "a profiles file must be a mapping with 'profiles' and 'safe_default'"


@dataclass(frozen=True, slots=True)
class GrantCheck:
    """Result of :func:`check_grants`: the usable safe default set and the problems."""

    safe_default: frozenset[str]
    issues: tuple[LoadIssue, ...]
    broken_profiles: frozenset[str]


def _check_profile(
    profile: Profile, source: str, tools: Mapping[str, ToolDef], mounted: tuple[str, ...] = ()
) -> list[LoadIssue]:
    issues: list[LoadIssue] = []
    who = profile_label(profile.name)
    for key, names in (
        ("allow_dangerous", profile.allow_dangerous),
        ("auto_approve", profile.auto_approve),
    ):
        for name in sorted(names - tools.keys()):
            if mounted and name.startswith(mounted):
                continue  # SPEC M1: a mounted server's tool, known once it connects
            issues.append(LoadIssue(source, who, f"{key}: {name!r} is not a tool of the catalog"))
    return issues


def check_grants(
    docs: list[ProfilesDoc], tools: Mapping[str, ToolDef], mounted_prefixes: tuple[str, ...] = ()
) -> GrantCheck:
    """Check what profiles name against the loaded tools (SPEC C2).

    Args:
        docs: every parsed profiles file.
        tools: every loaded tool.
        mounted_prefixes: name prefixes of mounted MCP servers (SPEC M1): their tools are
            only known once the server answers, so a grant naming one is not checked.

    Returns:
        The ``safe_default`` set (the union of every file's, unknown and dangerous tools
        removed: a legacy profile never gets a dangerous tool), each problem, and the
        profiles that name unknown tools.
    """
    issues: list[LoadIssue] = []
    broken: set[str] = set()
    safe: set[str] = set()
    for doc in docs:
        for name in doc.safe_default:
            tool = tools.get(name)
            if tool is None:
                message = f"safe_default: {name!r} is not a tool of the catalog"
                issues.append(LoadIssue(doc.source, None, message))
            elif tool.dangerous:
                message = f"safe_default: {name!r} is dangerous; legacy profiles never get it"
                issues.append(LoadIssue(doc.source, None, message + " (dropped)"))
            else:
                safe.add(name)
        for profile in doc.profiles.values():
            found = _check_profile(profile, doc.source, tools, mounted_prefixes)
            if found:
                broken.add(profile.name)
                issues.extend(found)
    return GrantCheck(frozenset(safe), tuple(issues), frozenset(broken))
