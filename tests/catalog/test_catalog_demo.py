"""The bundled demo catalog loads with its handlers, and each handler does its work (SPEC O1)."""

from __future__ import annotations

import dataclasses
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from catalog.loader import load_catalog
from catalog.model import Catalog, Mode
from catalog.params import validators_for
from gateway.context import ToolContext
from gateway.demo import PROFILES_PATH, TOOLS_PATH, handlers


@pytest.fixture(scope="module")
def demo() -> Catalog:
    """The demo catalog, handlers imported."""
    return load_catalog([TOOLS_PATH], [PROFILES_PATH])


def make_ctx(tmp_path: Path, user: str = "ann", **context: str) -> ToolContext:
    """A ToolContext for direct handler calls, data in tmp_path."""
    return ToolContext(
        session_id="s1",
        user=user,
        profile="demo",
        context=context,
        call_id="c1",
        tool="t",
        data_dir=tmp_path / "data",
    )


def call(demo: Catalog, name: str, params: dict[str, Any], ctx: ToolContext) -> Any:
    """Validate ``params`` like the gateway does (SPEC I4), then run the resolved handler."""
    assert validators_for(demo)[name].validate(params) == []
    func = demo.tools[name].func
    assert func is not None
    return func(params, ctx)


def test_demo_catalog_shape(demo: Catalog) -> None:
    """SPEC C1/C2: the demo catalog has its tools, modes, handlers, profiles and guidance."""
    assert sorted(demo.tools) == [
        "clock_now",
        "convert_units",
        "notes_create",
        "notes_delete",
        "notes_list",
        "notes_search",
        "project_summary",
        "report",
        "show_map",
        "slow_lookup",
    ]
    assert {n for n, t in demo.tools.items() if t.func is None} == {"show_map"}
    assert demo.tools["show_map"].mode is Mode.CLIENT
    assert demo.tools["report"].mode is Mode.ASYNC
    assert demo.tools["report"].dispatch_message == (
        "I'm writing that report now; I'll tell you when it's ready."
    )
    assert demo.tools["slow_lookup"].promote_after == 1.0
    delete = demo.tools["notes_delete"]
    assert (delete.dangerous, delete.requires_approval) == (True, True)
    assert demo.tools["project_summary"].visibility.requires_context == ("project_id",)
    assert sorted(demo.profiles) == ["demo", "legacy", "readonly", "voice"]
    assert demo.profile("voice").auto_approve == frozenset({"clock_now"})
    assert demo.profile("legacy").legacy_tools is True
    assert demo.safe_default == frozenset({"clock_now", "convert_units", "notes_list"})
    assert {"search_web", "get_weather"} <= set(demo.guidance)


def test_notes_round_trip(demo: Catalog, tmp_path: Path) -> None:
    """Demo notes: create, list, search and delete in SQLite, newest first."""
    ctx = make_ctx(tmp_path)
    first = call(demo, "notes_create", {"title": "Groceries", "body": "milk, eggs"}, ctx)
    second = call(
        demo, "notes_create", {"title": "Plan", "body": "ship v1", "tags": ["p1", "work"]}, ctx
    )
    assert (first["note_id"], second["note_id"]) == (1, 2)
    assert second["tags"] == ["p1", "work"]
    assert (tmp_path / "data" / "notes.db").is_file()
    listed = call(demo, "notes_list", {}, ctx)
    assert [n["title"] for n in listed["notes"]] == ["Plan", "Groceries"]
    assert listed["total"] == 2
    assert [n["title"] for n in call(demo, "notes_list", {"limit": 1}, ctx)["notes"]] == ["Plan"]
    found = call(demo, "notes_search", {"query": "EGGS"}, ctx)
    assert [n["note_id"] for n in found["notes"]] == [1]
    assert call(demo, "notes_search", {"query": "work"}, ctx)["notes"][0]["note_id"] == 2
    assert call(demo, "notes_search", {"query": "%"}, ctx)["notes"] == []
    assert call(demo, "notes_delete", {"note_id": 1}, ctx) == {"deleted": 1}
    assert [n["note_id"] for n in call(demo, "notes_list", {}, ctx)["notes"]] == [2]


def test_notes_are_per_user(demo: Catalog, tmp_path: Path) -> None:
    """SPEC I5: notes are scoped by ctx.user; another user can neither see nor delete them."""
    ann, bob = make_ctx(tmp_path, "ann"), make_ctx(tmp_path, "bob")
    note = call(demo, "notes_create", {"title": "secret", "body": "x"}, ann)
    assert call(demo, "notes_list", {}, bob) == {"notes": [], "total": 0}
    assert call(demo, "notes_search", {"query": "secret"}, bob)["notes"] == []
    with pytest.raises(LookupError, match="note 1 not found"):
        call(demo, "notes_delete", {"note_id": note["note_id"]}, bob)
    assert call(demo, "notes_list", {}, ann)["total"] == 1


def test_clock_now(demo: Catalog, tmp_path: Path) -> None:
    """Demo clock: the current time in the named zone."""
    result = call(demo, "clock_now", {"timezone": "Asia/Kolkata"}, make_ctx(tmp_path))
    assert result["timezone"] == "Asia/Kolkata"
    assert result["utc_offset_minutes"] == 330
    assert datetime.fromisoformat(result["iso"]).utcoffset() is not None
    assert result["iso"].endswith("+05:30")


@pytest.mark.parametrize("zone", ["Mars/Olympus", "../etc/passwd", ""])
def test_clock_now_invalid_zone(demo: Catalog, tmp_path: Path, zone: str) -> None:
    """Demo clock: an unknown zone raises ValueError naming it."""
    func = demo.tools["clock_now"].func
    assert func is not None
    with pytest.raises(ValueError, match="unknown time zone"):
        func({"timezone": zone}, make_ctx(tmp_path))


@pytest.mark.parametrize(
    ("value", "source", "target", "expected"),
    [
        (1, "mi", "km", 1.609344),
        (12, "in", "cm", 30.48),
        (1, "lb", "g", 453.59237),
        (2.5, "t", "kg", 2500.0),
        (100, "C", "F", 212.0),
        (-40, "F", "C", -40.0),
        (0, "K", "C", -273.15),
        (32, "F", "K", 273.15),
    ],
    ids=["mi-km", "in-cm", "lb-g", "t-kg", "C-F", "F-C", "K-C", "F-K"],
)
def test_convert_units(
    demo: Catalog, tmp_path: Path, value: float, source: str, target: str, expected: float
) -> None:
    """Demo units: real length, mass and temperature conversions."""
    params = {"value": value, "from_unit": source, "to_unit": target}
    assert call(demo, "convert_units", params, make_ctx(tmp_path))["result"] == expected


@pytest.mark.parametrize(
    ("source", "target", "value", "message"),
    [("kg", "m", 1, "cannot convert mass"), ("K", "C", -1, "below absolute zero")],
    ids=["dimension", "absolute-zero"],
)
def test_convert_units_refusals(
    demo: Catalog, tmp_path: Path, source: str, target: str, value: float, message: str
) -> None:
    """Demo units: incompatible dimensions and impossible temperatures raise ValueError."""
    params = {"value": value, "from_unit": source, "to_unit": target}
    with pytest.raises(ValueError, match=message):
        call(demo, "convert_units", params, make_ctx(tmp_path))


def test_project_summary(demo: Catalog, tmp_path: Path) -> None:
    """SPEC I5: project_summary summarises notes tagged with ctx.project_id."""
    ctx = make_ctx(tmp_path, project_id="apollo")
    call(demo, "notes_create", {"title": "Kickoff", "body": "b", "tags": ["apollo"]}, ctx)
    call(demo, "notes_create", {"title": "Other", "body": "b", "tags": ["zeus"]}, ctx)
    call(demo, "notes_create", {"title": "Risks", "body": "b", "tags": ["apollo", "risk"]}, ctx)
    result = call(demo, "project_summary", {}, ctx)
    assert result["summary"] == "Project apollo: 2 note(s): Kickoff; Risks."
    assert (result["note_count"], result["other_tags"]) == (2, ["risk"])
    assert result["latest"]["title"] == "Risks"
    with pytest.raises(PermissionError):
        call(demo, "project_summary", {}, make_ctx(tmp_path))


async def test_report_writes_markdown_with_progress(
    demo: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC J2/J4: report reports progress per section and returns a Markdown artifact."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", 0.0)
    progress: list[tuple[float | None, str | None]] = []
    ctx = dataclasses.replace(make_ctx(tmp_path), progress=lambda f, m: progress.append((f, m)))
    result = await call(demo, "report", {"topic": "Solar power", "sections": 4}, ctx)
    assert progress == [
        (0.25, "section 1"),
        (0.5, "section 2"),
        (0.75, "section 3"),
        (1.0, "section 4"),
    ]
    assert result["summary"] == "Report on Solar power with 4 section(s) is ready."
    [artifact] = result["artifacts"]
    assert artifact["name"] == "report-solar-power.md"
    assert artifact["mime_type"] == "text/markdown"
    assert artifact["content"].startswith("# Report: Solar power\n")
    assert artifact["content"].count("\n## Section ") == 4


def test_slow_lookup_answers(demo: Catalog, tmp_path: Path, monkeypatch) -> None:
    """SPEC I14: slow_lookup returns its answer after its wait (shortened here)."""
    monkeypatch.setattr(handlers, "SLOW_LOOKUP_SECONDS", 0.0)
    result = call(demo, "slow_lookup", {"query": "two words"}, make_ctx(tmp_path))
    assert result["answer"] == "'two words' has 9 characters and 2 word(s)."


def test_slow_lookup_stops_when_cancelled(demo: Catalog, tmp_path: Path) -> None:
    """SPEC I8: a cancelled slow_lookup stops at once instead of finishing its 3 s wait."""
    cancelled = threading.Event()
    cancelled.set()
    ctx = dataclasses.replace(make_ctx(tmp_path), cancelled=cancelled)
    with pytest.raises(InterruptedError):
        call(demo, "slow_lookup", {"query": "q"}, ctx)
