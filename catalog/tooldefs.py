"""One tool definition mapping -> :class:`ToolDef`, with every problem reported (SPEC C1).

Each key has a parser in :data:`_PARSERS` (a table, not an if/elif chain); a key not in
the table is an error (typo protection). After the keys, :func:`_cross_checks` looks at
combinations (handler vs mode, ``promote_after`` only for sync tools, ...).

:func:`from_mcp_tool` converts an MCP ``tools/list`` entry (or an OpenAI-style tool
stored the same way) into a definition mapping, for importing published tools.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema_rs

from catalog.errors import unknown_key
from catalog.handlers import HANDLER_PATH, HandlerError, resolve_handler
from catalog.model import EMPTY_PARAMETERS, Mode, ToolDef, Visibility
from catalog.params import SchemaError, canonical_json, compiled, json_pointer

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""Names OpenAI and Anthropic accept; enforced for every tool (SPEC C4)."""

REQUIRED_KEYS = ("name", "description", "capability")


class _Bad(ValueError):
    """A key's value is invalid; the message says why (without the key name)."""


@dataclass(frozen=True, slots=True)
class ParsedTool:
    """Result of parsing one definition: the tool when valid, and every problem."""

    tool: ToolDef | None
    label: str
    problems: tuple[str, ...]


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Bad("must be a non-empty string")
    return value


def _name(value: Any) -> str:
    name = _text(value)
    if not TOOL_NAME.match(name):
        raise _Bad(f"{name!r} must match {TOOL_NAME.pattern} (OpenAI/Anthropic tool names)")
    return name


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Bad("must be true or false")
    return value


def _seconds(value: Any, *, allow_zero: bool) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Bad("must be a number of seconds or null")
    if value < 0 or (value == 0 and not allow_zero):
        raise _Bad("must be " + ("zero or positive" if allow_zero else "positive"))
    return float(value)


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _Bad("must be a list of non-empty strings")
    return tuple(value)


def _mode(value: Any) -> Mode:
    try:
        return Mode(value)
    except ValueError:
        raise _Bad(f"must be one of {', '.join(m.value for m in Mode)}, not {value!r}") from None


_VISIBILITY_KEYS = {"requires_context", "origins", "sandbox_only"}


def _visibility(value: Any) -> Visibility:
    if not isinstance(value, Mapping):
        raise _Bad("must be a mapping with requires_context, origins, sandbox_only")
    unknown = sorted(set(map(str, value)) - _VISIBILITY_KEYS)
    if unknown:
        raise _Bad(f"unknown key(s) {', '.join(unknown)}; allowed: {sorted(_VISIBILITY_KEYS)}")
    return Visibility(
        requires_context=_names(value.get("requires_context", [])),
        origins=_names(value.get("origins", [])),
        sandbox_only=_flag(value.get("sandbox_only", False)),
    )


def check_schema(value: Any) -> dict[str, Any]:
    """Check that ``value`` is a usable parameters schema (SPEC C1, I4).

    It must be a JSON object, valid against its dialect's meta-schema (``$schema``, else
    Draft 2020-12), compile (regexes, local ``$ref``), and have ``type: object`` at the
    root (the model-facing formats require it).

    Returns:
        The schema as a plain dict.

    Raises:
        _Bad: with the first problem found, pointing into the schema.
    """
    if not isinstance(value, Mapping):
        raise _Bad("must be a JSON Schema object (a mapping)")
    schema = dict(value)
    try:
        canonical_json(schema)
    except (TypeError, ValueError) as exc:
        raise _Bad(f"is not plain JSON: {exc}") from None
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as exc:
        where = json_pointer(list(exc.instance_path)) or "/"
        raise _Bad(f"is not a valid JSON Schema at {where}: {exc.message}") from None
    except jsonschema_rs.ReferencingError as exc:
        raise _Bad(f"is not a valid JSON Schema: {str(exc).splitlines()[0]}") from None
    if schema.get("type") != "object":
        raise _Bad(f"must have type: object at the root, not {schema.get('type')!r}")
    _check_callable(schema)
    try:
        compiled(schema)
    except SchemaError as exc:
        raise _Bad(f"does not compile: {exc}") from None
    return schema


def _check_callable(schema: Mapping[str, Any]) -> None:
    """Refuse a root that no argument object can satisfy: a ``required`` name that
    ``additionalProperties: false`` forbids, since it is not among ``properties``."""
    if schema.get("additionalProperties") is not False:
        return
    declared = schema.get("properties", {})
    missing = [name for name in schema.get("required", []) if name not in declared]
    if missing:
        raise _Bad(
            f"requires {', '.join(map(repr, missing))} but does not declare it in properties "
            "while additionalProperties is false: no call could ever be valid"
        )


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "name": _name,
    "description": _text,
    "parameters": check_schema,
    "capability": _text,
    "mode": _mode,
    "dangerous": _flag,
    "requires_approval": _flag,
    "timeout": lambda v: _seconds(v, allow_zero=True),
    "long_running": _flag,
    "promote_after": lambda v: _seconds(v, allow_zero=False),
    "category": _optional_text,
    "visibility": _visibility,
    "handler": _optional_text,
    "dispatch_message": _optional_text,
    "idempotent": _flag,
    "sensitive": _names,
    "read_only": _flag,
    "title": _optional_text,
}
"""Tool definition key -> parser. These are exactly the keys a definition may use."""

_DEFAULTS: dict[str, Any] = {
    "parameters": dict(EMPTY_PARAMETERS),
    "mode": Mode.SYNC,
    "visibility": Visibility(),
    "sensitive": (),
}


def _cross_checks(values: dict[str, Any], resolve_handlers: bool) -> list[str]:
    problems: list[str] = []
    mode = values.get("mode", Mode.SYNC)
    handler = values.get("handler")
    if mode is Mode.CLIENT and handler is not None:
        problems.append("handler: a client-mode tool runs in the frontend and has no handler")
    if mode is not Mode.CLIENT and handler is None and resolve_handlers:
        problems.append(f"handler: required for a {mode.value} tool ('module:function')")
    if values.get("dispatch_message") is not None and mode is not Mode.ASYNC:
        problems.append("dispatch_message: only async tools have one")
    if values.get("promote_after") is not None and mode is not Mode.SYNC:
        problems.append("promote_after: only sync tools are promoted to jobs (SPEC I14)")
    if values.get("long_running") and values.get("timeout") is not None:
        problems.append("timeout: a long_running tool has no timeout; remove one of the two")
    if values.get("read_only") and values.get("dangerous"):
        problems.append("read_only: a dangerous tool cannot be read-only")
    properties = values.get("parameters", {}).get("properties", {})
    for name in values.get("sensitive", ()):
        if not isinstance(properties, Mapping) or name not in properties:
            problems.append(f"sensitive: {name!r} is not a top-level parameter")
    return problems


def _resolve(values: dict[str, Any], resolve_handlers: bool) -> tuple[Any, list[str]]:
    handler = values.get("handler")
    if handler is None or values.get("mode") is Mode.CLIENT:
        return None, []
    try:
        if resolve_handlers:
            return resolve_handler(handler), []
        if not HANDLER_PATH.match(handler):
            return None, [f"handler: {handler!r} is not a 'module:function' path"]
        return None, []
    except HandlerError as exc:
        return None, [f"handler: {exc}"]


def parse_tool(raw: Any, source: str, index: int, *, resolve_handlers: bool) -> ParsedTool:
    """Validate one definition mapping and build its :class:`ToolDef` (SPEC C1).

    Args:
        raw: the mapping from YAML (or memory).
        source: the file (or label) it came from; stored in :attr:`ToolDef.source`.
        index: its position in the file, to label a tool without a usable name.
        resolve_handlers: import the handler now (an import failure is a problem).
            When false, only the handler path's format is checked and sync/async tools
            may have none (definitions only: exports, checks, tests).

    Returns:
        :class:`ParsedTool`; ``tool`` is ``None`` when there is any problem.
    """
    label = f"tools[{index}]"
    if not isinstance(raw, Mapping):
        return ParsedTool(None, label, ("a tool definition must be a mapping",))
    if isinstance(raw.get("name"), str) and raw["name"]:
        label = raw["name"]
    problems = [f"{key}: required" for key in REQUIRED_KEYS if key not in raw]
    values: dict[str, Any] = {}
    for key, value in raw.items():
        parser = _PARSERS.get(str(key))
        if parser is None:
            problems.append(unknown_key(key, _PARSERS))
            continue
        try:
            values[str(key)] = parser(value)
        except _Bad as exc:
            problems.append(f"{key}: {exc}")
    if problems:
        return ParsedTool(None, label, tuple(problems))
    problems.extend(_cross_checks(values, resolve_handlers))
    func, handler_problems = _resolve(values, resolve_handlers)
    problems.extend(handler_problems)
    if problems:
        return ParsedTool(None, label, tuple(problems))
    return ParsedTool(_build(values, source, func), label, ())


def _build(values: dict[str, Any], source: str, func: Any) -> ToolDef:
    merged = {**_DEFAULTS, **values}
    if merged["mode"] is Mode.ASYNC and merged.get("dispatch_message") is None:
        merged["dispatch_message"] = f"Started {merged['name']}."
    return ToolDef(**merged, source=source, func=func)


_MCP_HINTS = {"readOnlyHint": "read_only", "idempotentHint": "idempotent"}


def from_mcp_tool(
    entry: Mapping[str, Any], *, capability: str, mode: Mode = Mode.SYNC
) -> dict[str, Any]:
    """A definition mapping from an MCP ``tools/list`` entry (SPEC C1, C4).

    ``inputSchema`` becomes ``parameters``; ``title`` (or ``annotations.title``) the
    title; ``destructiveHint: true`` (with ``readOnlyHint`` not true) makes the tool
    dangerous; ``readOnlyHint`` and ``idempotentHint`` map to ``read_only`` and
    ``idempotent``. Other keys (``outputSchema``, ``icons``, ``_meta``, ...) are dropped.

    Args:
        entry: ``{"name", "description"?, "inputSchema", "annotations"?, "title"?, ...}``.
        capability: the capability to file the tool under.
        mode: how it runs here (default sync).

    Returns:
        A mapping for :func:`parse_tool` / ``load_tool_dicts`` (no ``handler``).
    """
    hints = entry.get("annotations") or {}
    definition: dict[str, Any] = {
        "name": entry.get("name"),
        "description": entry.get("description") or entry.get("title") or entry.get("name"),
        "parameters": entry.get("inputSchema"),
        "capability": capability,
        "mode": mode.value,
    }
    read_only = hints.get("readOnlyHint") is True
    if hints.get("destructiveHint") is True and not read_only:
        definition["dangerous"] = True
    for hint, key in _MCP_HINTS.items():
        if isinstance(hints.get(hint), bool):
            definition[key] = hints[hint]
    title = entry.get("title") or hints.get("title")
    if isinstance(title, str) and title:
        definition["title"] = title
    return definition
