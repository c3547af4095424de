"""Parameter validation against a tool's JSON Schema (SPEC I4).

A :class:`ParamValidator` is compiled once per distinct schema (cached by the schema's
canonical JSON, so a hot reload reuses unchanged validators) and reports *every*
violation, each with an RFC 6901 JSON pointer into the arguments.

Dialect: the schema's ``$schema`` when present, else JSON Schema Draft 2020-12 (the MCP
default). Only the drafts jsonschema-rs bundles are accepted (:data:`DIALECTS`: Draft 4,
6, 7, 2019-09 and 2020-12); any other ``$schema`` is refused by :func:`dialect_problem`,
never looked up. ``format`` is annotation only, never asserted. Nothing a schema names
is ever fetched (no I/O here, SPEC M1, E3): an unresolvable reference fails at compile
time, and :data:`NO_RETRIEVAL` is the registry of every meta-schema check.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, NoReturn

import jsonschema_rs

if TYPE_CHECKING:
    from catalog.model import Catalog


class SchemaError(ValueError):
    """A tool's ``parameters`` is not a usable JSON Schema (bad keyword value, bad regex,
    unresolvable ``$ref``, unknown ``$schema``). The loader turns it into a load issue."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One way the arguments break the schema (SPEC I4).

    Attributes:
        pointer: RFC 6901 JSON pointer into the arguments; ``""`` is the argument object
            itself (e.g. a missing required property or an unexpected one).
        message: human-readable text naming the offending property or value.
        keyword: the failing schema keyword (``required``, ``type``, ...), or ``None``
            when the validator names none.
    """

    pointer: str
    message: str
    keyword: str | None


DIALECTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "http://json-schema.org/draft-04/schema": "Draft 4",
        "http://json-schema.org/draft-06/schema": "Draft 6",
        "http://json-schema.org/draft-07/schema": "Draft 7",
        "https://json-schema.org/draft/2019-09/schema": "Draft 2019-09",
        "https://json-schema.org/draft/2020-12/schema": "Draft 2020-12",
    }
)
"""The ``$schema`` values accepted (each also with a trailing ``#``): the meta-schemas
jsonschema-rs bundles. Any other value would make its meta-schema check *fetch* the URL
(server-side request forgery, and a blocking read on the event loop: SPEC M1, E3)."""


def _no_retrieval(uri: str) -> NoReturn:
    raise ValueError(f"toolbus fetches no schema ({uri})")


NO_RETRIEVAL: Final = jsonschema_rs.Registry([], retriever=_no_retrieval)
"""A registry that retrieves nothing: a meta-schema check given it resolves only the
bundled drafts, whatever a schema names (SPEC M1, E3)."""


def dialect_problem(schema: Mapping[str, Any]) -> str | None:
    """Why the schema's ``$schema`` is refused, or ``None`` when it is absent or one of
    :data:`DIALECTS` (SPEC C1, M1, E3). Never fetches anything.

    Returns:
        e.g. ``"$schema 'http://10.0.0.1/meta' is not a dialect toolbus knows (only
        the bundled Draft 4, ...; nothing is fetched)"``.
    """
    if "$schema" not in schema:
        return None
    dialect = schema["$schema"]
    if isinstance(dialect, str) and dialect.removesuffix("#") in DIALECTS:
        return None
    shown = repr(dialect) if len(repr(dialect)) <= 120 else repr(dialect)[:119] + "…"
    known = ", ".join(DIALECTS.values())
    return (
        f"$schema {shown} is not a dialect toolbus knows (only the drafts its validator "
        f"bundles: {known}, named by their meta-schema URI; nothing is fetched)"
    )


def json_pointer(path: list[str | int] | tuple[str | int, ...]) -> str:
    """Render path segments as an RFC 6901 pointer (``~`` -> ``~0``, ``/`` -> ``~1``, §3).

    Args:
        path: object keys and array indexes from the root, e.g. ``["items", 2, "name"]``.

    Returns:
        ``"/items/2/name"``; ``""`` for the empty path.
    """
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def canonical_json(value: Any) -> str:
    """Stable JSON text of ``value``: sorted keys, no whitespace, UTF-8 kept.

    Raises:
        TypeError: ``value`` holds something JSON cannot express.
        ValueError: ``value`` holds NaN or an infinity.
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class ParamValidator:
    """A compiled validator for one tool's ``parameters`` schema (SPEC I4).

    Args:
        schema: a JSON Schema (one of :data:`DIALECTS`, chosen by ``$schema``,
            default Draft 2020-12).

    Raises:
        SchemaError: the schema cannot be compiled, or names another ``$schema``.
    """

    __slots__ = ("_validator",)

    def __init__(self, schema: Mapping[str, Any]) -> None:
        problem = dialect_problem(schema)
        if problem is not None:
            raise SchemaError(problem)
        try:
            self._validator: Any = jsonschema_rs.validator_for(
                dict(schema), validate_formats=False, offline=True
            )
        except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError) as exc:
            raise SchemaError(_first_line(exc)) from exc
        except (ValueError, TypeError) as exc:
            raise SchemaError(_first_line(exc)) from exc

    def is_valid(self, params: Any) -> bool:
        """Whether ``params`` satisfies the schema; cheaper than :meth:`validate`."""
        return bool(self._validator.is_valid(params))

    def validate(self, params: Any) -> list[Violation]:
        """Every violation of ``params`` against the schema, in validator order.

        Args:
            params: the decoded arguments, normally a dict; ``{}`` and ``None`` are
                validated like anything else (SPEC I4, case F09).

        Returns:
            An empty list when ``params`` is valid.
        """
        if self._validator.is_valid(params):
            return []
        return [_violation(error) for error in self._validator.iter_errors(params)]


def _violation(error: Any) -> Violation:
    schema_path = list(error.schema_path)
    keyword = schema_path[-1] if schema_path and isinstance(schema_path[-1], str) else None
    return Violation(json_pointer(list(error.instance_path)), str(error.message), keyword)


@functools.lru_cache(maxsize=4096)
def _compile(canonical: str) -> ParamValidator:
    return ParamValidator(json.loads(canonical))


def compiled(schema: Mapping[str, Any]) -> ParamValidator:
    """The cached :class:`ParamValidator` for ``schema`` (equal schemas share one).

    Raises:
        SchemaError: the schema cannot be compiled.
        TypeError, ValueError: the schema is not JSON.
    """
    return _compile(canonical_json(schema))


def validators_for(catalog: Catalog) -> Mapping[str, ParamValidator]:
    """One compiled validator per tool of ``catalog`` (SPEC I4).

    Returns:
        Read-only mapping tool name -> validator. Cheap after the first call for the
        same schemas (the loader already compiled them all).
    """
    return MappingProxyType(
        {name: compiled(tool.parameters) for name, tool in catalog.tools.items()}
    )
