"""The catalog files' pydantic shapes and their messages (SPEC C1, C2, M1)."""

from __future__ import annotations

import dataclasses

from catalog.mcp_mounts import MountShape, MountSpec, parse_mounts
from catalog.model import Profile, ToolDef
from catalog.profiles import ProfileShape, parse_profiles
from catalog.tooldefs import REQUIRED_KEYS, ToolShape, parse_tool


def test_tool_shape_has_every_definition_key() -> None:
    """SPEC C1: the shape's keys are exactly ToolDef's fields a file may set, the
    required ones first, so a missing key is reported in REQUIRED_KEYS order."""
    fields = {f.name for f in dataclasses.fields(ToolDef)} - {"source", "func"}
    assert set(ToolShape.allowed_keys()) == fields
    assert tuple(ToolShape.allowed_keys()[:3]) == REQUIRED_KEYS


def test_profile_and_mount_shapes_match_their_records() -> None:
    """SPEC C2, M1: every Profile and MountSpec field has its key (``tools`` is the
    legacy flag's name in a file; a mount's per-tool overrides are its ``tools``)."""
    profile = {f.name for f in dataclasses.fields(Profile)} - {"name", "legacy_tools"}
    assert set(ProfileShape.allowed_keys()) == profile | {"tools"}
    mount = {f.name for f in dataclasses.fields(MountSpec)} - {"source", "overrides"}
    assert set(MountShape.allowed_keys()) == mount | {"tools"}


def test_one_problem_per_bad_key_in_file_order() -> None:
    """SPEC C1: missing keys first, then each bad key once, in the order written."""
    raw = {"name": "t", "timeout": "soon", "mod": "sync", "read_only": 1}
    parsed = parse_tool(raw, "mem", 0, resolve_handlers=False)
    assert parsed.tool is None
    assert parsed.problems == (
        "description: required",
        "capability: required",
        "timeout: must be a number of seconds or null",
        "mod: unknown key (did you mean mode?); allowed: capability, category, dangerous, "
        "description, dispatch_message, handler, idempotent, long_running, mode, name, "
        "parameters, promote_after, read_only, requires_approval, sensitive, timeout, "
        "title, visibility",
        "read_only: must be true or false",
    )


def test_null_mount_keys_are_refused_not_unset() -> None:
    """SPEC M1: ``command: null`` is a bad value, named as such, not a missing key."""
    _, issues = parse_mounts([{"name": "a", "command": None, "sampling": None}], "f.yaml")
    assert [str(issue) for issue in issues] == [
        "f.yaml: mcp:a: command: must be a non-empty string",
        "f.yaml: mcp:a: sampling: must be a non-empty string",
        "f.yaml: mcp:a: exactly one of command (stdio) or url (Streamable HTTP) is required",
    ]


def test_profile_file_key_is_tools_not_the_field_name() -> None:
    """SPEC C2: the legacy flag is written ``tools``; its record field name is not a key."""
    doc = parse_profiles({"profiles": {"p": {"legacy_tools": True}, "q": {"tools": True}}}, "m")
    assert [str(issue) for issue in doc.issues] == [
        "m: profile:p: legacy_tools: unknown key; allowed: allow_dangerous, auto_approve, "
        "capabilities, sandbox, tools"
    ]
    assert list(doc.profiles) == ["q"]
    assert doc.profiles["q"].legacy_tools
