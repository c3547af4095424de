"""Profiles and grants: explicit, fail closed, dangerous never implied (SPEC C2)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from catalog.errors import CatalogError
from catalog.loader import load_catalog, load_tool_dicts
from catalog.model import Catalog, Profile
from catalog.visibility import Denial, Scope, check_access, visible_tools

TOOLS = [
    {"name": "read", "description": "d", "capability": "files"},
    {"name": "wipe", "description": "d", "capability": "files", "dangerous": True},
    {"name": "clock", "description": "d", "capability": "time"},
]

TOOLS_YAML = """\
tools:
  - {name: read, description: d, capability: files}
  - {name: wipe, description: d, capability: files, dangerous: true}
  - {name: clock, description: d, capability: time}
"""

NO_SCOPE = Scope({})


def catalog_with(profiles: dict[str, object]) -> Catalog:
    """An in-memory catalog of :data:`TOOLS` with the given profiles document."""
    return load_tool_dicts(TOOLS, "mem", profiles=profiles)


def names(catalog: Catalog, profile: str | None) -> list[str]:
    """Names visible to ``profile`` with an empty context."""
    return [tool.name for tool in visible_tools(catalog, catalog.profile(profile), NO_SCOPE)]


def test_capabilities_grant_their_tools() -> None:
    """SPEC C2: a profile sees the tools of its capabilities, and only those."""
    catalog = catalog_with({"profiles": {"p": {"capabilities": ["time"]}}})
    assert names(catalog, "p") == ["clock"]


def test_dangerous_tool_never_implied_by_capability() -> None:
    """SPEC C2: the files capability grants read, not the dangerous wipe."""
    catalog = catalog_with({"profiles": {"p": {"capabilities": ["files"]}}})
    assert names(catalog, "p") == ["read"]
    denial = check_access(catalog.tools["wipe"], catalog.profile("p"), NO_SCOPE)
    assert denial is Denial.DANGEROUS


def test_allow_dangerous_opts_in_by_name() -> None:
    """SPEC C2: naming the dangerous tool in allow_dangerous (with its capability) grants it."""
    catalog = catalog_with(
        {"profiles": {"p": {"capabilities": ["files"], "allow_dangerous": ["wipe"]}}}
    )
    assert names(catalog, "p") == ["read", "wipe"]


def test_allow_dangerous_without_capability_grants_nothing() -> None:
    """SPEC C2/I2: allow_dangerous is an extra opt-in, not a grant on its own."""
    catalog = catalog_with({"profiles": {"p": {"allow_dangerous": ["wipe"]}}})
    assert names(catalog, "p") == []
    denial = check_access(catalog.tools["wipe"], catalog.profile("p"), NO_SCOPE)
    assert denial is Denial.CAPABILITY


def test_profile_fields_loaded() -> None:
    """SPEC C2/A1: every profile key lands in the record."""
    catalog = catalog_with(
        {
            "profiles": {
                "p": {
                    "capabilities": ["time", "files"],
                    "allow_dangerous": ["wipe"],
                    "auto_approve": ["clock"],
                    "sandbox": True,
                }
            }
        }
    )
    assert catalog.profile("p") == Profile(
        name="p",
        capabilities=frozenset({"time", "files"}),
        allow_dangerous=frozenset({"wipe"}),
        auto_approve=frozenset({"clock"}),
        sandbox=True,
        legacy_tools=False,
    )


@pytest.mark.parametrize("requested", ["nope", None, ""], ids=["unknown", "none", "empty"])
def test_unknown_or_missing_profile_fails_closed(caplog, requested: str | None) -> None:
    """SPEC C2: an unknown or missing profile grants nothing and logs an ERROR."""
    catalog = catalog_with({"profiles": {"p": {"capabilities": ["time", "files"]}}})
    with caplog.at_level(logging.ERROR, logger="catalog"):
        profile = catalog.profile(requested)
    assert profile == Profile.empty(requested)
    assert (profile.capabilities, profile.allow_dangerous, profile.legacy_tools) == (
        frozenset(),
        frozenset(),
        False,
    )
    assert visible_tools(catalog, profile, NO_SCOPE) == []
    assert [(r.name, r.levelno) for r in caplog.records] == [("catalog.model", logging.ERROR)]
    assert repr(requested) in caplog.records[0].getMessage()


def test_unreadable_profiles_file_is_a_load_error(tmp_path: Path, write_yaml) -> None:
    """SPEC C2: by default an unreadable profiles file stops the load, naming the file."""
    tools = write_yaml("tools.yaml", TOOLS_YAML)
    broken = write_yaml("profiles.yaml", "profiles: {p: [\n")
    with pytest.raises(CatalogError) as info:
        load_catalog([tools], [broken], resolve_handlers=False)
    [issue] = info.value.issues
    assert issue.file == str(broken)
    assert issue.message.startswith("invalid YAML: ")


def test_unreadable_profiles_file_fails_closed_when_lenient(caplog, write_yaml) -> None:
    """SPEC C2: lenient loading keeps the tools, drops the unreadable file's profiles,
    logs an ERROR, and a session asking for one of them gets nothing."""
    tools = write_yaml("tools.yaml", TOOLS_YAML)
    good = write_yaml("good.yaml", "profiles: {ok: {capabilities: [time]}}\n")
    broken = write_yaml("broken.yaml", "profiles: {p: [\n")
    with caplog.at_level(logging.ERROR, logger="catalog"):
        catalog = load_catalog(
            [tools], [good, broken], resolve_handlers=False, strict_profiles=False
        )
        assert names(catalog, "p") == []
    assert names(catalog, "ok") == ["clock"]
    assert len(catalog.tools) == 3
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(messages) == 2
    assert str(broken) in messages[0]
    assert "'p'" in messages[1]


def test_invalid_profile_entry_fails_closed_when_lenient(caplog) -> None:
    """SPEC C2: a profile with a bad key is left out entirely (not half-granted)."""
    profiles = {"profiles": {"p": {"capabilities": ["files"], "allow_dangerus": ["wipe"]}}}
    with caplog.at_level(logging.ERROR, logger="catalog"):
        catalog = load_tool_dicts(TOOLS, "mem", profiles=profiles, strict_profiles=False)
    assert "p" not in catalog.profiles
    assert "allow_dangerus: unknown key" in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    ("profiles", "expected"),
    [
        ({"profiles": {"p": {"capabilities": "time"}}}, "capabilities: must be a list"),
        ({"profiles": {"p": {"sandbox": "yes"}}}, "sandbox: must be true or false"),
        ({"profiles": {"p": {"allow_dangerous": ["wip"]}}}, "'wip' is not a tool"),
        ({"profiles": {"p": {"auto_approve": ["clok"]}}}, "'clok' is not a tool"),
        ({"profiles": {"p": {"capabilitys": []}}}, "capabilitys: unknown key"),
        ({"profile": {}}, "profile: unknown top-level key"),
        ({"profiles": {"p": None}}, "a profile must be a mapping"),
        ({"safe_default": ["nothing"]}, "safe_default: 'nothing' is not a tool"),
    ],
    ids=["caps", "sandbox", "dangerous-typo", "approve-typo", "key", "top", "null", "safe"],
)
def test_profile_problems_reported(profiles: dict[str, object], expected: str) -> None:
    """SPEC C2: profile problems are load issues naming the profile and key."""
    with pytest.raises(CatalogError) as info:
        load_tool_dicts(TOOLS, "mem", profiles=profiles)
    [issue] = info.value.issues
    assert issue.file == "mem"
    assert expected in issue.message


def test_duplicate_profile_across_files_refused(write_yaml) -> None:
    """SPEC C2: two files defining one profile name fail, naming both files."""
    tools = write_yaml("tools.yaml", TOOLS_YAML)
    one = write_yaml("one.yaml", "profiles: {p: {capabilities: [time]}}\n")
    two = write_yaml("two.yaml", "profiles: {p: {capabilities: [files]}}\n")
    with pytest.raises(CatalogError) as info:
        load_catalog([tools], [one, two], resolve_handlers=False)
    [issue] = info.value.issues
    assert (issue.file, issue.tool) == (str(two), "profile:p")
    assert str(one) in issue.message


def test_legacy_tools_true_gets_safe_default_only() -> None:
    """SPEC C2: a legacy `tools: true` profile sees the safe default set and nothing else."""
    catalog = catalog_with({"safe_default": ["clock"], "profiles": {"old": {"tools": True}}})
    assert catalog.safe_default == frozenset({"clock"})
    assert names(catalog, "old") == ["clock"]
    assert check_access(catalog.tools["read"], catalog.profile("old"), NO_SCOPE) is (
        Denial.CAPABILITY
    )


def test_legacy_never_gets_a_dangerous_tool(caplog) -> None:
    """SPEC C2: a dangerous tool listed in safe_default is refused; lenient drops it."""
    profiles = {"safe_default": ["clock", "wipe"], "profiles": {"old": {"tools": True}}}
    with pytest.raises(CatalogError) as info:
        load_tool_dicts(TOOLS, "mem", profiles=profiles)
    [issue] = info.value.issues
    assert issue.message.startswith("safe_default: 'wipe' is dangerous")
    with caplog.at_level(logging.ERROR, logger="catalog"):
        catalog = load_tool_dicts(TOOLS, "mem", profiles=profiles, strict_profiles=False)
    assert catalog.safe_default == frozenset({"clock"})
    assert names(catalog, "old") == ["clock"]
    assert len(caplog.records) == 1


def test_legacy_flag_false_grants_nothing() -> None:
    """SPEC C2: `tools: false` is not a grant."""
    catalog = catalog_with({"safe_default": ["clock"], "profiles": {"old": {"tools": False}}})
    assert names(catalog, "old") == []
