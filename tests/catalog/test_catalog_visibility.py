"""The one access check: catalog building and execution agree (SPEC I2, C3)."""

from __future__ import annotations

import itertools

import pytest

from catalog.loader import load_catalog
from catalog.model import Catalog, Profile, Visibility
from catalog.visibility import Denial, Scope, check_access, visible_tools
from gateway.demo import PROFILES_PATH, TOOLS_PATH

BASE = Profile("p", capabilities=frozenset({"cap"}))


def test_capability_denial(make_tool) -> None:
    """SPEC I2: a tool whose capability the profile lacks -> denied_capability."""
    tool = make_tool(capability="other")
    assert check_access(tool, BASE, Scope({})) is Denial.CAPABILITY


def test_dangerous_denial(make_tool) -> None:
    """SPEC I2: a dangerous tool without allow_dangerous -> denied_dangerous."""
    tool = make_tool("rm", dangerous=True)
    assert check_access(tool, BASE, Scope({})) is Denial.DANGEROUS
    allowed = Profile("p", capabilities=frozenset({"cap"}), allow_dangerous=frozenset({"rm"}))
    assert check_access(tool, allowed, Scope({})) is None


@pytest.mark.parametrize(
    ("visibility", "scope", "sandbox", "expected"),
    [
        (Visibility(requires_context=("project_id",)), Scope({}), False, Denial.SCOPE),
        (
            Visibility(requires_context=("project_id",)),
            Scope({"project_id": ""}),
            False,
            Denial.SCOPE,
        ),
        (Visibility(requires_context=("project_id",)), Scope({"project_id": "p1"}), False, None),
        (Visibility(origins=("https://app.example",)), Scope({}), False, Denial.SCOPE),
        (
            Visibility(origins=("https://app.example",)),
            Scope({}, "https://evil.example"),
            False,
            Denial.SCOPE,
        ),
        (
            Visibility(origins=("https://app.example",)),
            Scope({}, "https://app.example"),
            False,
            None,
        ),
        (Visibility(sandbox_only=True), Scope({}), False, Denial.SCOPE),
        (Visibility(sandbox_only=True), Scope({}), True, None),
        (Visibility(), Scope({}, "https://anything.example"), False, None),
    ],
    ids=[
        "context-missing",
        "context-empty",
        "context-present",
        "origin-missing",
        "origin-wrong",
        "origin-ok",
        "sandbox-no",
        "sandbox-yes",
        "no-conditions",
    ],
)
def test_scope_conditions(
    make_tool, visibility: Visibility, scope: Scope, sandbox: bool, expected: Denial | None
) -> None:
    """SPEC I2: context keys, origins and sandbox_only -> denied_scope when unmet."""
    profile = Profile("p", capabilities=frozenset({"cap"}), sandbox=sandbox)
    assert check_access(make_tool(visibility=visibility), profile, scope) is expected


def test_denials_checked_in_order(make_tool) -> None:
    """SPEC I2: capability is checked before dangerous, dangerous before scope."""
    tool = make_tool(
        "rm", capability="other", dangerous=True, visibility=Visibility(sandbox_only=True)
    )
    assert check_access(tool, BASE, Scope({})) is Denial.CAPABILITY
    granted = Profile("p", capabilities=frozenset({"other"}))
    assert check_access(tool, granted, Scope({})) is Denial.DANGEROUS
    opted = Profile("p", capabilities=frozenset({"other"}), allow_dangerous=frozenset({"rm"}))
    assert check_access(tool, opted, Scope({})) is Denial.SCOPE


def test_denial_values_are_wire_outcomes() -> None:
    """SPEC I2/I11: denials carry the outcome codes used on the wire and in audit."""
    assert [d.value for d in Denial] == ["denied_capability", "denied_dangerous", "denied_scope"]


def _demo() -> Catalog:
    return load_catalog([TOOLS_PATH], [PROFILES_PATH])


SCOPES = [Scope({}), Scope({"project_id": "p1"}), Scope({"project_id": "p1"}, "https://x")]


@pytest.mark.parametrize(
    ("profile", "scope"),
    list(itertools.product(["demo", "readonly", "voice", "legacy", "missing"], SCOPES)),
)
def test_visible_tools_is_check_access(profile: str, scope: Scope) -> None:
    """SPEC I2/C3: visible_tools lists exactly the tools check_access allows, by name."""
    catalog = _demo()
    prof = catalog.profiles.get(profile, Profile.empty(profile))
    expected = sorted(
        name
        for name, tool in catalog.tools.items()
        if check_access(tool, prof, scope, catalog.safe_default) is None
    )
    assert [tool.name for tool in visible_tools(catalog, prof, scope)] == expected


def test_project_tool_appears_with_project_context() -> None:
    """SPEC S5/C3: linking a project adds project_summary to the demo profile's catalog."""
    catalog = _demo()
    profile = catalog.profile("demo")
    without = {t.name for t in visible_tools(catalog, profile, Scope({}))}
    with_project = {t.name for t in visible_tools(catalog, profile, Scope({"project_id": "p"}))}
    assert with_project - without == {"project_summary"}
