"""A session's catalog view is decided per session and made once per tool set (SPEC C3,
S5; issue 13: the version hash and tool infos were two thirds of a `hello`'s server
time).

`CatalogState.view` runs the visibility rules for each session (profile, context,
origin) and keeps, per catalog, one frozen tool info per tool and the version of each
set of visible tools. Checked on the demo catalog's real files: sessions that see the
same tools share one view, a scope that shows another tool gets its own version but
the same infos, and a reload that changes a tool makes its view anew.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from catalog.exports import catalog_version, tool_info
from catalog.visibility import Scope, visible_tools
from gateway.catalog_state import CatalogState
from gateway.config import DEMO_DIR
from protocol import messages as m


def _session(state: CatalogState, profile: str, **context: str) -> Any:
    """The session facts `view` reads (profile, context, origin)."""
    return SimpleNamespace(profile=state.current.profile(profile), context=context, origin=None)


def test_c3_sessions_seeing_the_same_tools_share_one_view() -> None:
    state = CatalogState([DEMO_DIR / "tools.yaml"], [DEMO_DIR / "profiles.yaml"])
    first = state.view(_session(state, "demo"))
    second = state.view(_session(state, "demo"))
    assert first == second
    assert all(a is b for a, b in zip(first[1], second[1], strict=True))
    tools = visible_tools(state.current, state.current.profile("demo"), Scope())
    assert first[0] == catalog_version(tools)
    assert first[1] == [m.ToolInfo(**tool_info(tool)) for tool in tools]


def test_c3_a_scope_that_shows_another_tool_gets_its_own_view() -> None:
    """The demo's `project_summary` needs `project_id` in the session context (S5)."""
    state = CatalogState([DEMO_DIR / "tools.yaml"], [DEMO_DIR / "profiles.yaml"])
    without = state.view(_session(state, "demo"))
    with_project = state.view(_session(state, "demo", project_id="p1"))
    assert with_project[2] - without[2] == {"project_summary"}
    assert with_project[0] != without[0]
    assert state.view(_session(state, "demo"))[0] == without[0]
    # One info per tool whatever the scope (found in review: a copy of the whole
    # catalog per scope let one client pin hundreds of MB with context updates).
    shared = {info.name: info for info in with_project[1]}
    assert all(shared[info.name] is info for info in without[1])


def test_c3_a_reload_makes_the_views_anew(tmp_path: Path) -> None:
    tools = tmp_path / "tools.yaml"
    shutil.copy(DEMO_DIR / "tools.yaml", tools)
    state = CatalogState([tools], [DEMO_DIR / "profiles.yaml"])
    before = state.view(_session(state, "demo"))
    text = tools.read_text()
    assert "description: " in text
    tools.write_text(text.replace("description: ", "description: Changed. ", 1))
    stat = tools.stat()
    os.utime(tools, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert state.reload()
    after = state.view(_session(state, "demo"))
    assert after[2] == before[2]
    assert after[0] != before[0]
    changed = [a for a, b in zip(after[1], before[1], strict=True) if a != b]
    assert len(changed) == 1
    assert changed[0].description.startswith("Changed. ")
