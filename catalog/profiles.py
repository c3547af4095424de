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

Unknown keys are errors. Names in ``allow_dangerous``, ``auto_approve`` and
``safe_default`` must be tools of the catalog (typo protection); a dangerous tool in
``safe_default`` is dropped and reported, since legacy profiles never get one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.errors import LoadIssue, unknown_key
from catalog.model import Profile, ToolDef

FILE_KEYS = frozenset({"profiles", "safe_default"})


class _Bad(ValueError):
    """A key's value is invalid; the message says why."""


def _names(value: Any) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _Bad("must be a list of non-empty strings")
    return frozenset(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Bad("must be true or false")
    return value


_PARSERS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "capabilities": ("capabilities", _names),
    "allow_dangerous": ("allow_dangerous", _names),
    "auto_approve": ("auto_approve", _names),
    "sandbox": ("sandbox", _flag),
    "tools": ("legacy_tools", _flag),
}
"""Profile key -> (Profile field, parser). Exactly the keys a profile may use."""


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
    if not isinstance(raw, Mapping):
        doc.problem(who, "a profile must be a mapping")
        return
    values: dict[str, Any] = {}
    broken = False
    for key, value in raw.items():
        entry = _PARSERS.get(str(key))
        if entry is None:
            doc.problem(who, unknown_key(key, _PARSERS))
            broken = True
            continue
        try:
            values[entry[0]] = entry[1](value)
        except _Bad as exc:
            doc.problem(who, f"{key}: {exc}")
            broken = True
    if not broken:
        doc.profiles[name] = Profile(name=name, **values)


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
    if not isinstance(raw, Mapping):
        doc.problem(None, "a profiles file must be a mapping with 'profiles' and 'safe_default'")
        return doc
    for key in sorted(set(map(str, raw)) - FILE_KEYS):
        doc.problem(None, f"{key}: unknown top-level key; allowed: {', '.join(sorted(FILE_KEYS))}")
    try:
        doc.safe_default = tuple(sorted(_names(raw.get("safe_default", []))))
    except _Bad as exc:
        doc.problem(None, f"safe_default: {exc}")
    profiles = raw.get("profiles", {})
    if not isinstance(profiles, Mapping):
        doc.problem(None, "profiles: must be a mapping of profile name -> profile")
        return doc
    for name, body in profiles.items():
        if not isinstance(name, str) or not name:
            doc.problem(None, f"profiles: profile name {name!r} must be a non-empty string")
            continue
        _parse_profile(doc, name, body)
    return doc


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
