"""One tool definition mapping -> :class:`ToolDef`, with every problem reported (SPEC C1).

:class:`ToolShape` is the definition's shape, a pydantic model (:mod:`catalog.shapes`):
a key it lacks is an error with a did-you-mean (typo protection), and each bad value
is named with its key. After the shape, :func:`check_schema` checks ``parameters``
against its JSON Schema dialect and :func:`_cross_checks` looks at combinations
(handler vs mode, ``promote_after`` only for sync tools, ...).

:func:`from_mcp_tool` converts an MCP ``tools/list`` entry (or an OpenAI-style tool
stored the same way) into a definition mapping, for importing published tools.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import jsonschema_rs
from pydantic import StringConstraints, ValidationError, WrapValidator

from catalog.handlers import HANDLER_PATH, HandlerError, resolve_handler
from catalog.model import EMPTY_PARAMETERS, Mode, ToolDef, Visibility
from catalog.params import (
    NO_RETRIEVAL,
    SchemaError,
    canonical_json,
    compiled,
    dialect_problem,
    json_pointer,
)
from catalog.shapes import (
    CUSTOM,
    NON_EMPTY,
    Flag,
    Names,
    OptionalText,
    Positive,
    Seconds,
    Shape,
    Text,
    checked,
    in_document_order,
    problems,
    refuse,
    says,
)

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""Names OpenAI and Anthropic accept; enforced for every tool (SPEC C4)."""

REQUIRED_KEYS = ("name", "description", "capability")
"""Keys every definition has; :class:`ToolShape` declares them first, in this order."""


class _Bad(ValueError):
    """A key's value is invalid; the message says why (without the key name)."""


@dataclass(frozen=True, slots=True)
class ParsedTool:
    """Result of parsing one definition: the tool when valid, and every problem."""

    tool: ToolDef | None
    label: str
    problems: tuple[str, ...]


def _name_message(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return f"{value!r} must match {TOOL_NAME.pattern} (OpenAI/Anthropic tool names)"
    return NON_EMPTY


def _mode_message(value: Any) -> str:
    return f"must be one of {', '.join(m.value for m in Mode)}, not {value!r}"


class VisibilityShape(Shape):
    """``visibility`` of a definition (SPEC C1, I2)."""

    requires_context: Names = []
    origins: Names = []
    sandbox_only: Flag = False


def _visibility_message(value: Any) -> str:
    if not isinstance(value, Mapping):
        return "must be a mapping with requires_context, origins, sandbox_only"
    unknown = sorted(set(map(str, value)) - set(VisibilityShape.allowed_keys()))
    return f"unknown key(s) {', '.join(unknown)}; allowed: {sorted(VisibilityShape.allowed_keys())}"


def _visibility(value: Any, handler: Callable[[Any], Any]) -> Any:
    """The nested mapping's first problem, in one sentence under ``visibility``."""
    try:
        return handler(value)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        unknown = any(e["type"] in ("extra_forbidden", "invalid_key") for e in errors)
        if errors[0]["type"] == CUSTOM and not unknown:
            raise refuse(errors[0]["msg"]) from None
        raise refuse(_visibility_message(value)) from None


def check_schema(value: Any) -> dict[str, Any]:
    """Check that ``value`` is a usable parameters schema (SPEC C1, I4).

    It must be a JSON object, valid against its dialect's meta-schema (``$schema``, one
    of the bundled :data:`catalog.params.DIALECTS`, else Draft 2020-12; nothing is
    fetched: SPEC M1, E3), compile (regexes, local ``$ref``), and have ``type: object`` at the
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
    dialect = dialect_problem(schema)
    if dialect is not None:
        # SPEC M1, E3: an unknown $schema would be fetched by the meta-schema check.
        raise _Bad(f"is not a valid JSON Schema: {dialect}")
    try:
        jsonschema_rs.meta.validate(schema, registry=NO_RETRIEVAL)
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


class ToolShape(Shape):
    """One tool definition as written (SPEC C1); docs/catalog.md describes each key.

    The first three keys are required. The rest default as :class:`ToolDef` says.
    """

    name: Annotated[
        str, StringConstraints(strict=True, pattern=TOOL_NAME.pattern), says(_name_message)
    ]
    description: Text
    capability: Text
    parameters: Annotated[dict[str, Any], checked(check_schema, _Bad)] = {}
    mode: Annotated[Mode, says(_mode_message)] = Mode.SYNC
    dangerous: Flag = False
    requires_approval: Flag = False
    timeout: Seconds = None
    long_running: Flag = False
    promote_after: Positive = None
    category: OptionalText = None
    visibility: Annotated[VisibilityShape, WrapValidator(_visibility)] = VisibilityShape()
    handler: OptionalText = None
    dispatch_message: OptionalText = None
    idempotent: Flag = False
    sensitive: Names = []
    read_only: Flag = False
    title: OptionalText = None


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
    if isinstance(raw, Mapping) and isinstance(raw.get("name"), str) and raw["name"]:
        label = raw["name"]
    try:
        shape = ToolShape.model_validate(raw)
    except ValidationError as exc:
        found = problems(exc, ToolShape, not_mapping="a tool definition must be a mapping")
        ordered = in_document_order(found, raw if isinstance(raw, Mapping) else {})
        return ParsedTool(None, label, tuple(ordered))
    values = _values(shape)
    issues = _cross_checks(values, resolve_handlers)
    func, handler_problems = _resolve(values, resolve_handlers)
    issues.extend(handler_problems)
    if issues:
        return ParsedTool(None, label, tuple(issues))
    return ParsedTool(_build(values, source, func), label, ())


def _values(shape: ToolShape) -> dict[str, Any]:
    """The shape's fields as :class:`ToolDef` takes them (tuples, a :class:`Visibility`)."""
    values = dict(shape)
    seen = shape.visibility
    values["visibility"] = Visibility(
        requires_context=tuple(seen.requires_context),
        origins=tuple(seen.origins),
        sandbox_only=seen.sandbox_only,
    )
    values["sensitive"] = tuple(shape.sensitive)
    if "parameters" not in shape.model_fields_set:
        values["parameters"] = dict(EMPTY_PARAMETERS)
    if values["timeout"] is not None:
        values["timeout"] = float(values["timeout"])
    if values["promote_after"] is not None:
        values["promote_after"] = float(values["promote_after"])
    return values


def _build(values: dict[str, Any], source: str, func: Any) -> ToolDef:
    if values["mode"] is Mode.ASYNC and values["dispatch_message"] is None:
        values = {**values, "dispatch_message": f"Started {values['name']}."}
    return ToolDef(**values, source=source, func=func)


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
