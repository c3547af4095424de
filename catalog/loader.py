"""Loading the catalog: tool files, profile files, guidance (SPEC C1, C2, I1).

:func:`load_catalog` reads YAML files; :func:`load_tool_dicts` takes definitions already
in memory (tests, imported MCP tools). Both validate everything, collect *every*
problem as a :class:`LoadIssue`, then either return a :class:`Catalog` or raise one
:class:`CatalogError` listing them all.

A tools file is a mapping::

    tools:                      # list of tool definitions (see docs/catalog.md)
      - name: clock_now
        ...
    guidance:                   # optional: invented tool name -> what to use instead
      search_web: "There is no web search; ..."

Reading files is the only I/O here; handler modules are imported when
``resolve_handlers`` is true (SPEC C1: an import failure is a load error).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import Strict, TypeAdapter, ValidationError

from catalog.errors import CatalogError, LoadIssue
from catalog.mcp_mounts import MountSpec, parse_mounts
from catalog.model import Catalog, Profile, ToolDef
from catalog.profiles import ProfilesDoc, check_grants, parse_profiles, profile_label
from catalog.shapes import Shape, Text, problems, says
from catalog.tooldefs import parse_tool
from catalog.yamlio import YamlError, read_yaml

__all__ = ["CatalogError", "LoadIssue", "expand_paths", "load_catalog", "load_tool_dicts"]

logger = logging.getLogger(__name__)


class ToolsFileShape(Shape):
    """The top level of a tools file (SPEC C1, M1); each entry is checked on its own."""

    tools: Annotated[list[Any], Strict(), says("must be a list of definitions")] = []
    guidance: Any = None
    mcp_servers: Any = None


_GUIDANCE: TypeAdapter[dict[str, str]] = TypeAdapter(
    Annotated[dict[Annotated[str, Strict()], Text], Strict()]
)
"""``guidance``: invented tool name -> what to use instead (SPEC I1)."""

_NOT_A_FILE = "a tools file must be a mapping with 'tools', 'guidance'"


def _top_level(key: str, allowed: Iterable[str]) -> str:
    return f"{key}: unknown top-level key; allowed: {', '.join(sorted(allowed))}"


YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(slots=True)
class _Builder:
    """Accumulates tools, guidance and profiles from several sources, then checks the
    whole (duplicates across files, grants against tools) and builds the catalog."""

    resolve_handlers: bool
    tools: dict[str, ToolDef] = field(default_factory=dict)
    guidance: dict[str, tuple[str, str]] = field(default_factory=dict)
    profile_docs: list[ProfilesDoc] = field(default_factory=list)
    issues: list[LoadIssue] = field(default_factory=list)
    profile_issues: list[LoadIssue] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, MountSpec] = field(default_factory=dict)

    def add_mounts(self, raw: Any, source: str) -> None:
        """SPEC M1: the file's ``mcp_servers``; names are unique across files."""
        specs, issues = parse_mounts(raw, source)
        self.issues.extend(issues)
        for spec in specs:
            first = self.mounts.get(spec.name)
            if first is not None:
                message = f"duplicate MCP server {spec.name!r}: in {first.source} and in {source}"
                self.problem(source, f"mcp:{spec.name}", message)
            else:
                self.mounts[spec.name] = spec

    def problem(self, source: str, who: str | None, message: str) -> None:
        self.issues.append(LoadIssue(source, who, message))

    def add_tools(self, defs: Iterable[Any], source: str) -> None:
        for index, raw in enumerate(defs):
            parsed = parse_tool(raw, source, index, resolve_handlers=self.resolve_handlers)
            first = self.seen.get(parsed.label) if parsed.label != f"tools[{index}]" else None
            if first is not None:
                # SPEC C1 / case F10: name both places so the fix is obvious.
                message = f"duplicate tool name {parsed.label!r}: in {first} and in {source}"
                self.problem(source, parsed.label, message)
                continue
            self.seen.setdefault(parsed.label, source)
            self.issues.extend(LoadIssue(source, parsed.label, p) for p in parsed.problems)
            if parsed.tool is not None:
                self.tools[parsed.tool.name] = parsed.tool

    def add_guidance(self, raw: Any, source: str) -> None:
        try:
            entries = _GUIDANCE.validate_python(raw)
        except ValidationError as exc:
            bad = self._guidance_problems(exc, source)
            if bad is None:
                return
            entries = {k: v for k, v in raw.items() if k not in bad}
        for name, text in entries.items():
            if name in self.guidance:
                first = self.guidance[name][1]
                self.problem(source, None, f"guidance: {name!r} twice: in {first} and {source}")
            else:
                self.guidance[name] = (text, source)

    def _guidance_problems(self, exc: ValidationError, source: str) -> set[Any] | None:
        """Report each bad guidance entry; the bad names, or ``None`` for a non-mapping."""
        bad: set[Any] = set()
        for error in exc.errors(include_url=False):
            if not error["loc"]:
                self.problem(source, None, "guidance: must map tool name -> text")
                return None
            name = error["loc"][0]
            if name not in bad:
                bad.add(name)
                self.problem(source, None, f"guidance: {name!r} must map to non-empty text")
        return bad

    def add_tools_document(self, raw: Any, source: str) -> None:
        if raw is None:
            return
        try:
            shape = ToolsFileShape.model_validate(raw)
        except ValidationError as exc:
            found = problems(exc, ToolsFileShape, not_mapping=_NOT_A_FILE, unknown=_top_level)
            for problem in sorted(found, key=lambda p: (not p.unknown, p.key if p.unknown else "")):
                self.problem(source, None, problem.text)
            if not isinstance(raw, Mapping):
                return
            # The keys that are fine are still read, so one run shows every problem.
            bad = {p.key for p in found}
            good = {
                k: v for k, v in raw.items() if k in ToolsFileShape.model_fields and k not in bad
            }
            shape = ToolsFileShape.model_construct(**good)
        self.add_tools(shape.tools, source)
        if "guidance" in shape.model_fields_set:
            self.add_guidance(shape.guidance, source)
        if "mcp_servers" in shape.model_fields_set:
            self.add_mounts(shape.mcp_servers, source)

    def add_profiles_document(self, raw: Any, source: str) -> None:
        doc = parse_profiles(raw, source)
        self.profile_docs.append(doc)
        self.profile_issues.extend(doc.issues)

    def _profiles(self) -> tuple[dict[str, Profile], frozenset[str]]:
        prefixes = tuple(spec.prefix for spec in self.mounts.values())
        grants = check_grants(self.profile_docs, self.tools, prefixes)
        self.profile_issues.extend(grants.issues)
        profiles: dict[str, Profile] = {}
        where: dict[str, str] = {}
        for doc in self.profile_docs:
            for name, profile in doc.profiles.items():
                if name in where:
                    message = f"duplicate profile {name!r}: in {where[name]} and in {doc.source}"
                    self.profile_issues.append(LoadIssue(doc.source, profile_label(name), message))
                    profiles.pop(name, None)  # ambiguous: neither wins (fail closed)
                    continue
                where[name] = doc.source
                if name not in grants.broken_profiles:
                    profiles[name] = profile
        return profiles, grants.safe_default

    def _guidance(self) -> dict[str, str]:
        for name, (_, source) in sorted(self.guidance.items()):
            if name in self.tools:
                message = f"guidance: {name!r} is a defined tool; guidance is for invented names"
                self.problem(source, None, message)
        return {name: text for name, (text, _) in self.guidance.items()}

    def build(self, *, strict_profiles: bool) -> Catalog:
        guidance = self._guidance()
        profiles, safe_default = self._profiles()
        issues = list(self.issues)
        if strict_profiles:
            issues.extend(self.profile_issues)
        else:
            for issue in self.profile_issues:
                # SPEC C2: a broken profile grants nothing; say so loudly.
                logger.error("profile problem, failing closed: %s", issue)
        if issues:
            raise CatalogError(issues, tuple(self.mounts.values()))
        return Catalog(
            tools=MappingProxyType(dict(sorted(self.tools.items()))),
            profiles=MappingProxyType(profiles),
            guidance=MappingProxyType(guidance),
            safe_default=safe_default,
            mounts=tuple(self.mounts.values()),
        )


def expand_paths(paths: Sequence[Path]) -> tuple[list[Path], list[LoadIssue]]:
    """Files named by ``paths``: a file as is, a directory as its ``*.yaml``/``*.yml``
    files (not recursive, sorted by name).

    Returns:
        The files, and an issue for each path that does not exist.
    """
    files: list[Path] = []
    issues: list[LoadIssue] = []
    for path in paths:
        if path.is_dir():
            files.extend(
                sorted(p for p in path.iterdir() if p.suffix in YAML_SUFFIXES and p.is_file())
            )
        elif path.exists():
            files.append(path)
        else:
            issues.append(LoadIssue(str(path), None, "no such file or directory"))
    return files, issues


def _read_all(builder: _Builder, paths: Sequence[Path], *, profiles: bool) -> None:
    files, missing = expand_paths(paths)
    (builder.profile_issues if profiles else builder.issues).extend(missing)
    for path in files:
        try:
            raw = read_yaml(path)
        except YamlError as exc:
            issue = LoadIssue(str(path), None, str(exc))
            (builder.profile_issues if profiles else builder.issues).append(issue)
            continue
        if profiles:
            builder.add_profiles_document(raw, str(path))
        else:
            builder.add_tools_document(raw, str(path))


def load_catalog(
    tool_paths: Sequence[Path],
    profile_paths: Sequence[Path] = (),
    *,
    resolve_handlers: bool = True,
    strict_profiles: bool = True,
) -> Catalog:
    """Load and validate tools, guidance and profiles from YAML files (SPEC C1, C2).

    Args:
        tool_paths: tools files, or directories of them (``*.yaml``/``*.yml``, sorted).
        profile_paths: profiles files or directories.
        resolve_handlers: import every handler now (an import failure is an issue);
            false loads definitions only (sync/async tools may then lack a handler).
        strict_profiles: true (default): a profile problem is an issue like any other.
            False: a problem with a profile (or an unreadable profiles file) is logged
            at ERROR and that profile is left out, so it grants nothing (SPEC C2 fail
            closed) while the rest of the catalog loads; tool problems still raise.

    Returns:
        The catalog; tools sorted by name.

    Raises:
        CatalogError: listing every issue found, each with file and tool or profile:
            unknown keys, bad values, invalid schemas, handler import failures,
            duplicate tool names across files (naming both files, case F10), grants
            naming unknown tools, a dangerous tool in ``safe_default``.
    """
    builder = _Builder(resolve_handlers=resolve_handlers)
    _read_all(builder, tool_paths, profiles=False)
    _read_all(builder, profile_paths, profiles=True)
    return builder.build(strict_profiles=strict_profiles)


def load_tool_dicts(
    defs: Iterable[Mapping[str, Any]],
    source: str,
    *,
    resolve_handlers: bool = False,
    guidance: Mapping[str, str] | None = None,
    profiles: Mapping[str, Any] | None = None,
    strict_profiles: bool = True,
) -> Catalog:
    """Build a catalog from definitions already in memory (SPEC C1, C2).

    Same validation as :func:`load_catalog`. To import MCP ``tools/list`` entries
    (``inputSchema``), convert each with :func:`catalog.tooldefs.from_mcp_tool` first.

    Args:
        defs: tool definition mappings, as in a tools file's ``tools`` list.
        source: label used as the "file" in issues and :attr:`ToolDef.source`.
        resolve_handlers: as for :func:`load_catalog`, but off by default.
        guidance: invented tool name -> guidance text.
        profiles: a profiles document (``{"profiles": {...}, "safe_default": [...]}``).
        strict_profiles: as for :func:`load_catalog`.

    Raises:
        CatalogError: listing every issue.
    """
    builder = _Builder(resolve_handlers=resolve_handlers)
    builder.add_tools(defs, source)
    if guidance is not None:
        builder.add_guidance(guidance, source)
    if profiles is not None:
        builder.add_profiles_document(profiles, source)
    return builder.build(strict_profiles=strict_profiles)
