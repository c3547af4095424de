"""What each model provider accepts in a tool's parameter schema (SPEC C4, case F18).

A provider rejects the *whole* ``tools`` list when one tool's schema breaks its rules, so
every export is either adapted to the provider or the tool is reported; never passed on
silently. toolbus itself always validates calls against the full schema (SPEC I4): an
adaptation only changes what the model is shown.

Rules (the table in ``docs/catalog.md`` names the source document of each):

- :data:`ROOT_COMBINATOR`: no ``oneOf``/``anyOf``/``allOf``/``not`` (and for OpenAI
  no ``enum``) at the root of the parameters. Adapted when every branch only lists
  ``required`` names: ``allOf`` merges into ``required``; ``oneOf``/``anyOf``/``not``
  are dropped and the rule is appended to the description. Anything else is an error.
- :data:`ROOT_OBJECT`: the root has ``type: object`` (also refused at load, SPEC C1).
- Strict mode (OpenAI Structured Outputs, ``--strict``): :data:`STRICT_RULES`. A tool
  that breaks one is exported with ``strict: false`` (accepted, just not constrained)
  and the finding says which rule.

:func:`adapt` applies the rules for one tool and one export format.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from catalog.model import ToolDef
from catalog.params import json_pointer

OPENAI_CHAT = "openai-chat"
OPENAI_REALTIME = "openai-realtime"
ANTHROPIC = "anthropic"
MCP = "mcp"
FORMATS = (OPENAI_REALTIME, OPENAI_CHAT, ANTHROPIC, MCP)
"""The export formats the rules know, as named by ``toolbus catalog --format``."""

ROOT_COMBINATOR = "root-combinator"
ROOT_OBJECT = "root-object"
STRICT_ADDITIONAL = "strict-additional-properties"
STRICT_REQUIRED = "strict-all-required"
STRICT_KEYWORD = "strict-unsupported-keyword"
STRICT_DEPTH = "strict-nesting-depth"
STRICT_PROPERTIES = "strict-property-count"
STRICT_STRINGS = "strict-string-size"
STRICT_ENUMS = "strict-enum-size"
STRICT_RULES = (
    STRICT_ADDITIONAL,
    STRICT_REQUIRED,
    STRICT_KEYWORD,
    STRICT_DEPTH,
    STRICT_PROPERTIES,
    STRICT_STRINGS,
    STRICT_ENUMS,
)

_OPENAI_ROOT = ("oneOf", "anyOf", "allOf", "enum", "not")
_ANTHROPIC_ROOT = ("oneOf", "anyOf", "allOf")
FORBIDDEN_AT_ROOT: dict[str, tuple[str, ...]] = {
    OPENAI_CHAT: _OPENAI_ROOT,
    OPENAI_REALTIME: _OPENAI_ROOT,
    ANTHROPIC: _ANTHROPIC_ROOT,
    # MCP itself allows them, but hosts hand inputSchema to OpenAI or Anthropic unchanged.
    MCP: _OPENAI_ROOT,
}
"""Root keywords each format may not carry (rule :data:`ROOT_COMBINATOR`)."""

_DESCRIBABLE = frozenset({"required", "description", "title", "$comment"})
STRICT_UNSUPPORTED = (
    "allOf",
    "not",
    "oneOf",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    # Type-specific keywords the Structured Outputs guide lists as not supported, and
    # ``default`` (the API answers "'default' is not permitted").
    "patternProperties",
    "unevaluatedProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "unevaluatedItems",
    "contains",
    "minContains",
    "maxContains",
    "uniqueItems",
    "default",
)
"""Keywords outside OpenAI's Structured Outputs subset (rule :data:`STRICT_KEYWORD`)."""
STRICT_MAX_DEPTH = 10
STRICT_MAX_PROPERTIES = 5000
STRICT_MAX_STRING_CHARS = 120_000
STRICT_MAX_ENUM_VALUES = 1000
STRICT_BIG_ENUM = 250
STRICT_BIG_ENUM_CHARS = 15_000


@dataclass(frozen=True, slots=True)
class Finding:
    """One provider rule a tool's schema breaks (SPEC C4).

    Attributes:
        tool: the tool's name.
        provider: the export format (``openai-chat``, ``anthropic``, ...).
        rule: the rule id (:data:`ROOT_COMBINATOR`, :data:`STRICT_REQUIRED`, ...).
        message: what is wrong and, when ``adapted``, what the export does instead.
        adapted: ``True`` when the export was changed to satisfy the rule; ``False``
            when the tool cannot be exported in this format (an error).
    """

    tool: str
    provider: str
    rule: str
    message: str
    adapted: bool

    def __str__(self) -> str:
        return f"{self.tool}: {self.provider}: {self.rule}: {self.message}"


@dataclass(frozen=True, slots=True)
class Adapted:
    """A tool's schema and description as one provider will accept them.

    Attributes:
        parameters: a deep copy of the tool's parameters, adapted.
        description: the description, with any dropped root rule appended.
        strict: ``True`` when the schema fits OpenAI strict mode (only computed when
            asked for; else ``False``).
        findings: every rule broken, adapted or not.
    """

    parameters: dict[str, Any]
    description: str
    strict: bool
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        """``True`` when the provider will accept the export (no unadapted finding)."""
        return all(finding.adapted for finding in self.findings)


def _branch_names(branch: Any) -> list[str] | None:
    """The ``required`` names of a branch that only lists names, else ``None``."""
    if not isinstance(branch, Mapping) or not set(branch) <= _DESCRIBABLE:
        return None
    names = branch.get("required", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return names


def _phrase(names: list[str]) -> str:
    return " and ".join(f"`{name}`" for name in names) if names else "nothing"


_SENTENCES = {
    "oneOf": "Arguments must include exactly one of: {}.",
    "anyOf": "Arguments must include at least one of: {}.",
}


def _root_combinators(
    tool: ToolDef, provider: str, schema: dict[str, Any]
) -> tuple[list[str], list[Finding]]:
    """Drop or merge the root keywords ``provider`` refuses; return added sentences."""
    sentences: list[str] = []
    findings: list[Finding] = []
    for key in FORBIDDEN_AT_ROOT[provider]:
        if key not in schema:
            continue
        value = schema[key]
        branches = value if isinstance(value, list) else [value]
        lists = [_branch_names(branch) for branch in branches]
        if key == "enum" or any(names is None for names in lists):
            findings.append(
                Finding(
                    tool.name,
                    provider,
                    ROOT_COMBINATOR,
                    f"{key} at the root of the parameters is refused, and it says more than "
                    "which names are required, so toolbus cannot drop it; "
                    "move the alternatives into a property or split the tool",
                    adapted=False,
                )
            )
            continue
        del schema[key]
        names_lists = [names for names in lists if names is not None]
        if key == "allOf":
            required = list(schema.get("required", []))
            for names in names_lists:
                required += [name for name in names if name not in required]
            schema["required"] = required
            done = "merged into required"
        elif key == "not":
            sentences.append(f"Arguments must not include all of: {_phrase(names_lists[0])}.")
            done = "dropped from the export and stated in the description"
        else:
            options = " | ".join(_phrase(names) for names in names_lists)
            sentences.append(_SENTENCES[key].format(options))
            done = "dropped from the export and stated in the description"
        findings.append(
            Finding(
                tool.name,
                provider,
                ROOT_COMBINATOR,
                f"{key} at the root of the parameters is refused; {done} "
                "(toolbus still validates calls against it)",
                adapted=True,
            )
        )
    return sentences, findings


def adapt(tool: ToolDef, provider: str, *, strict: bool = False) -> Adapted:
    """The parameters and description of ``tool`` as ``provider`` accepts them (SPEC C4).

    Args:
        tool: the tool to export; never modified.
        provider: one of :data:`FORMATS`.
        strict: also check OpenAI strict mode (:func:`strict_findings`); only meaningful
            for ``openai-chat``.

    Returns:
        :class:`Adapted`; ``ok`` is ``False`` when the tool cannot be exported.

    Raises:
        KeyError: ``provider`` is not one of :data:`FORMATS`.
    """
    schema = copy.deepcopy(tool.parameters)
    findings: list[Finding] = []
    if schema.get("type") != "object":
        findings.append(
            Finding(tool.name, provider, ROOT_OBJECT, "the root must have type: object", False)
        )
    sentences, root = _root_combinators(tool, provider, schema)
    findings += root
    description = " ".join(part for part in [tool.description.strip(), *sentences] if part)
    fits = False
    if strict:
        broken = strict_findings(tool.name, schema)
        fits = not broken
        findings += broken
    return Adapted(schema, description, fits, tuple(findings))


def _subschemas(schema: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], str]]:
    """Direct subschemas of ``schema``, each with its JSON pointer suffix (RFC 6901)."""
    for key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas"):
        for name, sub in (schema.get(key) or {}).items():
            if isinstance(sub, Mapping):
                yield sub, json_pointer([key, name])
    for key in ("items", "additionalProperties", "not", "if", "then", "else", "contains"):
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            yield sub, json_pointer([key])
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for index, sub in enumerate(schema.get(key) or []):
            if isinstance(sub, Mapping):
                yield sub, json_pointer([key, index])


def _is_object(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return (
        kind == "object"
        or (isinstance(kind, list) and "object" in kind)
        or ("properties" in schema)
    )


@dataclass(slots=True)
class _Tally:
    problems: dict[str, str]
    properties: int = 0
    chars: int = 0
    enum_values: int = 0
    depth: int = 0

    def note(self, rule: str, text: str) -> None:
        self.problems.setdefault(rule, text)


def _walk(schema: Mapping[str, Any], where: str, level: int, tally: _Tally) -> None:
    if _is_object(schema):
        level += 1
        tally.depth = max(tally.depth, level)
        props = schema.get("properties") or {}
        tally.properties += len(props)
        tally.chars += sum(len(name) for name in props)
        if schema.get("additionalProperties") is not False:
            tally.note(
                STRICT_ADDITIONAL, f"object at {where or '/'} lacks additionalProperties: false"
            )
        missing = [name for name in props if name not in (schema.get("required") or [])]
        if missing:
            tally.note(STRICT_REQUIRED, f"{where or '/'}: {', '.join(missing)} not in required")
    for key in STRICT_UNSUPPORTED:
        if key in schema:
            tally.note(STRICT_KEYWORD, f"{key} at {where or '/'}")
    for key in ("$defs", "definitions"):
        tally.chars += sum(len(name) for name in schema.get(key) or {})
    _enum(schema, where, tally)
    for sub, suffix in _subschemas(schema):
        _walk(sub, where + suffix, level, tally)


def _enum(schema: Mapping[str, Any], where: str, tally: _Tally) -> None:
    values = schema.get("enum")
    if isinstance(values, list):
        tally.enum_values += len(values)
        texts = [value for value in values if isinstance(value, str)]
        tally.chars += sum(map(len, texts))
        if len(texts) > STRICT_BIG_ENUM and sum(map(len, texts)) > STRICT_BIG_ENUM_CHARS:
            tally.note(
                STRICT_ENUMS,
                f"enum at {where or '/'} has {len(texts)} strings over "
                f"{STRICT_BIG_ENUM_CHARS} characters",
            )
    const = schema.get("const")
    if isinstance(const, str):
        tally.chars += len(const)


def strict_findings(name: str, schema: Mapping[str, Any]) -> list[Finding]:
    """OpenAI strict-mode (Structured Outputs) rules ``schema`` breaks (SPEC C4).

    Every object needs ``additionalProperties: false`` and all its properties in
    ``required``; no keyword of :data:`STRICT_UNSUPPORTED`; at most
    :data:`STRICT_MAX_DEPTH` levels of object nesting and :data:`STRICT_MAX_PROPERTIES`
    properties; at most :data:`STRICT_MAX_STRING_CHARS` characters of property names,
    definition names, enum and const values; at most :data:`STRICT_MAX_ENUM_VALUES`
    enum values.

    Returns:
        One adapted :class:`Finding` (provider ``openai-chat``) per broken rule, the
        first offending place named; ``[]`` when ``strict: true`` can be sent.
    """
    tally = _Tally({})
    _walk(schema, "", 0, tally)
    if tally.depth > STRICT_MAX_DEPTH:
        tally.note(STRICT_DEPTH, f"{tally.depth} levels of objects (max {STRICT_MAX_DEPTH})")
    if tally.properties > STRICT_MAX_PROPERTIES:
        tally.note(STRICT_PROPERTIES, f"{tally.properties} properties (max 5000)")
    if tally.chars > STRICT_MAX_STRING_CHARS:
        tally.note(STRICT_STRINGS, f"{tally.chars} characters of names and values (max 120000)")
    if tally.enum_values > STRICT_MAX_ENUM_VALUES:
        tally.note(STRICT_ENUMS, f"{tally.enum_values} enum values (max 1000)")
    return [
        Finding(name, OPENAI_CHAT, rule, f"{text}; exported with strict: false", adapted=True)
        for rule, text in tally.problems.items()
    ]


def render_findings(findings: list[Finding], sources: Mapping[str, str]) -> list[str]:
    """One line per tool, rule and message, the formats that share it joined (SPEC O1).

    Args:
        findings: from :func:`catalog.exports.export_findings`.
        sources: tool name -> the file it was loaded from (``ToolDef.source``).

    Returns:
        e.g. ``"note: tools.yaml: get_event: openai-realtime, openai-chat: root-combinator:
        oneOf at the root ..."``; ``note:`` for adapted findings, ``error:`` otherwise;
        in the order first seen.
    """
    grouped: dict[tuple[str, str, str, bool], list[str]] = {}
    for finding in findings:
        key = (finding.tool, finding.rule, finding.message, finding.adapted)
        grouped.setdefault(key, []).append(finding.provider)
    lines = []
    for (tool, rule, message, adapted), providers in grouped.items():
        level = "note" if adapted else "error"
        where = f"{sources[tool]}: {tool}" if tool in sources else tool
        lines.append(f"{level}: {where}: {', '.join(providers)}: {rule}: {message}")
    return lines
