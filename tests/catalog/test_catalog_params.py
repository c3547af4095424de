"""Argument validation: every violation with its JSON pointer (SPEC I4)."""

from __future__ import annotations

import socket
from typing import Any

import jsonschema_rs
import pytest

from catalog.loader import load_tool_dicts
from catalog.params import (
    NO_RETRIEVAL,
    ParamValidator,
    SchemaError,
    Violation,
    dialect_problem,
    json_pointer,
    validators_for,
)


def test_case_f08_unknown_argument_named() -> None:
    """SPEC I4 / F08: {"path": "x"} against a topic-only schema names path and topic."""
    schema = {
        "type": "object",
        "properties": {"topic": {"type": "string"}},
        "required": ["topic"],
        "additionalProperties": False,
    }
    violations = ParamValidator(schema).validate({"path": "x"})
    assert sorted(violations, key=lambda v: v.keyword or "") == [
        Violation(
            "",
            "Additional properties are not allowed ('path' was unexpected)",
            "additionalProperties",
        ),
        Violation("", '"topic" is a required property', "required"),
    ]


def test_case_f09_empty_params_validated() -> None:
    """SPEC I4 / F09: {} is validated (missing name), and so are omitted params (None)."""
    validator = ParamValidator(
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    )
    assert validator.validate({}) == [Violation("", '"name" is a required property', "required")]
    assert validator.validate(None) == [Violation("", 'null is not of type "object"', "type")]
    assert validator.validate({"name": "a"}) == []


def test_nested_errors_have_pointers() -> None:
    """SPEC I4: a nested error points at its place, e.g. /items/2/name."""
    schema = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                },
            }
        },
    }
    params = {"items": [{"name": "a"}, {"name": "b"}, {"name": 3}, {}]}
    assert ParamValidator(schema).validate(params) == [
        Violation("/items/2/name", '3 is not of type "string"', "type"),
        Violation("/items/3", '"name" is a required property', "required"),
    ]


def test_every_violation_reported() -> None:
    """SPEC I4: all violations are listed, not just the first."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"enum": ["x"]}, "c": {"maxLength": 1}},
    }
    pointers = [v.pointer for v in ParamValidator(schema).validate({"a": "1", "b": 1, "c": "cc"})]
    assert sorted(pointers) == ["/a", "/b", "/c"]


def test_pointer_escaping() -> None:
    """SPEC I4 / RFC 6901 §3: '~' and '/' in keys are escaped as ~0 and ~1."""
    assert json_pointer(["a/b", "c~d", 0]) == "/a~1b/c~0d/0"
    schema = {"type": "object", "properties": {"a/b": {"type": "string"}}}
    assert ParamValidator(schema).validate({"a/b": 1})[0].pointer == "/a~1b"


CASES: list[tuple[str, dict[str, Any], Any, list[str]]] = [
    (
        "ref-defs",
        {
            "type": "object",
            "$defs": {"pos": {"type": "integer", "minimum": 1}},
            "properties": {"n": {"$ref": "#/$defs/pos"}},
        },
        {"n": 0},
        ["/n"],
    ),
    (
        "ref-defs-ok",
        {
            "type": "object",
            "$defs": {"s": {"type": "string"}},
            "properties": {"n": {"$ref": "#/$defs/s"}},
        },
        {"n": "x"},
        [],
    ),
    (
        "allOf",
        {"type": "object", "allOf": [{"required": ["a"]}, {"required": ["b"]}]},
        {},
        ["", ""],
    ),
    (
        "not",
        {"type": "object", "properties": {"x": {"not": {"type": "string"}}}},
        {"x": "s"},
        ["/x"],
    ),
    ("not-ok", {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}, {"x": 1}, []),
    (
        "if-then",
        {
            "type": "object",
            "if": {"properties": {"kind": {"const": "email"}}},
            "then": {"required": ["address"]},
            "else": {"required": ["phone"]},
        },
        {"kind": "email"},
        [""],
    ),
    (
        "if-else",
        {
            "type": "object",
            "if": {"properties": {"kind": {"const": "email"}}},
            "then": {"required": ["address"]},
            "else": {"required": ["phone"]},
        },
        {"kind": "sms", "phone": "1"},
        [],
    ),
    ("const", {"type": "object", "properties": {"v": {"const": 2}}}, {"v": 3}, ["/v"]),
    (
        "format-not-asserted",
        {"type": "object", "properties": {"u": {"format": "uri"}}},
        {"u": "not a uri"},
        [],
    ),
    (
        "draft4-integer",
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "type": "object",
            "properties": {"i": {"type": "integer"}},
        },
        {"i": 3.0},
        ["/i"],
    ),
    (
        "2020-12-integer",
        {"type": "object", "properties": {"i": {"type": "integer"}}},
        {"i": 3.0},
        [],
    ),
]


@pytest.mark.parametrize(
    ("schema", "params", "pointers"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_schema_keywords(schema: dict[str, Any], params: Any, pointers: list[str]) -> None:
    """SPEC I4: $ref/$defs, allOf, not, if/then/else, const and dialects validate exactly."""
    assert [v.pointer for v in ParamValidator(schema).validate(params)] == pointers


def test_if_then_violation_keyword() -> None:
    """SPEC I4: the failing keyword inside then/else is reported."""
    schema = CASES[5][1]
    assert ParamValidator(schema).validate({"kind": "email"}) == [
        Violation("", '"address" is a required property', "required")
    ]


def test_uncompilable_schema_raises() -> None:
    """SPEC I4: a schema with a dangling $ref cannot become a validator."""
    with pytest.raises(SchemaError, match="does not exist"):
        ParamValidator({"$ref": "#/$defs/nope"})


def test_validators_for_covers_every_tool_and_caches() -> None:
    """SPEC I4: one compiled validator per tool; equal schemas share it."""
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    catalog = load_tool_dicts(
        [
            {"name": "a", "description": "d", "capability": "c", "parameters": schema},
            {"name": "b", "description": "d", "capability": "c", "parameters": dict(schema)},
        ],
        "mem",
    )
    validators = validators_for(catalog)
    assert sorted(validators) == ["a", "b"]
    assert validators["a"] is validators["b"]
    assert validators_for(catalog)["a"] is validators["a"]
    assert validators["a"].validate({"q": 1}) == [
        Violation("/q", '1 is not of type "string"', "type")
    ]


# -- SPEC M1, E3: a schema's $schema is never fetched ---------------------------------------


@pytest.mark.parametrize(
    "dialect",
    [
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-06/schema",
        "http://json-schema.org/draft-07/schema#",
        "https://json-schema.org/draft/2019-09/schema",
        "https://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2020-12/schema#",
    ],
)
def test_bundled_dialects_accepted(dialect: str) -> None:
    """SPEC C1, M1: the drafts the validator bundles are accepted, with or without '#'."""
    assert dialect_problem({"$schema": dialect, "type": "object"}) is None
    assert ParamValidator({"$schema": dialect, "type": "object"}).validate({}) == []


def test_unknown_dialect_refused_without_a_request() -> None:
    """SPEC M1, E3: any other $schema is refused naming the accepted drafts, and nothing
    is fetched: the URL is a listening socket that records a connection."""
    with socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen(1)
        url = f"http://127.0.0.1:{trap.getsockname()[1]}/meta"
        schema = {"$schema": url, "type": "object"}
        problem = dialect_problem(schema)
        with pytest.raises(SchemaError, match="not a dialect toolbus knows"):
            ParamValidator(schema)
        trap.setblocking(False)
        with pytest.raises(BlockingIOError):
            trap.accept()
    assert problem is not None
    assert url in problem
    assert "Draft 7" in problem
    assert "Draft 2020-12" in problem
    assert dialect_problem({"$schema": 7}) is not None


def test_meta_check_fetches_no_embedded_dialect() -> None:
    """SPEC M1, E3: the meta-schema check resolves nothing outside the bundled drafts
    (NO_RETRIEVAL), whatever a schema nests."""
    nested = {"$schema": "http://10.255.255.1/meta", "type": "object"}
    with pytest.raises(jsonschema_rs.ReferencingError, match=r"10\.255\.255\.1"):
        jsonschema_rs.meta.validate(nested, registry=NO_RETRIEVAL)
