"""Handlers of the demo catalog served by ``toolbus serve`` (SPEC O1).

Each handler is ``handler(params, ctx)`` (see :mod:`gateway.context`, SPEC I5). Plain
functions run in a worker thread (SPEC S3); coroutine functions run on the event loop.
Identity (user, project) comes only from ``ctx``, never from ``params``.

Notes live in SQLite at ``ctx.data_dir / "notes.db"``, one connection per call (calls
run in different threads), scoped by ``ctx.principal`` (tenant and user).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gateway.context import ToolContext

NOTES_DB = "notes.db"
SLOW_LOOKUP_SECONDS = 3.0
REPORT_SECTION_SECONDS = 0.5

_SCHEMA = """
CREATE TABLE IF NOT EXISTS notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user TEXT NOT NULL,
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS notes_user ON notes (user, id);
"""


@contextmanager
def _notes_db(ctx: ToolContext) -> Iterator[sqlite3.Connection]:
    """Open the notes database, creating the folder and table on first use."""
    ctx.data_dir.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(ctx.data_dir / NOTES_DB, timeout=5.0)) as db:
        db.row_factory = sqlite3.Row
        db.executescript(_SCHEMA)
        with db:  # one transaction per call: commit on success, roll back on error
            yield db


def _note(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "note_id": row["id"],
        "title": row["title"],
        "body": row["body"],
        "tags": json.loads(row["tags"]),
        "created_at": row["created_at"],
    }


def notes_create(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Store a note for the calling user; answers the stored note with its ``note_id``."""
    tags = json.dumps(sorted(set(params.get("tags", []))), ensure_ascii=False)
    created = datetime.now(UTC).isoformat(timespec="seconds")
    with _notes_db(ctx) as db:
        cursor = db.execute(
            "INSERT INTO notes (user, title, body, tags, created_at) VALUES (?, ?, ?, ?, ?)",
            (ctx.principal, params["title"], params["body"], tags, created),
        )
        row = db.execute("SELECT * FROM notes WHERE id = ?", (cursor.lastrowid,)).fetchone()
    return _note(row)


def notes_list(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """The calling user's newest notes, newest first (``limit``, default 20)."""
    limit = int(params.get("limit", 20))
    with _notes_db(ctx) as db:
        rows = db.execute(
            "SELECT * FROM notes WHERE user = ? ORDER BY id DESC LIMIT ?", (ctx.principal, limit)
        ).fetchall()
        total = db.execute("SELECT COUNT(*) FROM notes WHERE user = ?", (ctx.principal,)).fetchone()
    return {"notes": [_note(row) for row in rows], "total": total[0]}


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def notes_search(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """The calling user's notes whose title, body or tags contain ``query`` (any case)."""
    pattern = _like(params["query"])
    with _notes_db(ctx) as db:
        rows = db.execute(
            "SELECT * FROM notes WHERE user = :user AND (title LIKE :p ESCAPE '\\' "
            "OR body LIKE :p ESCAPE '\\' OR tags LIKE :p ESCAPE '\\') ORDER BY id DESC",
            {"user": ctx.principal, "p": pattern},
        ).fetchall()
    return {"query": params["query"], "notes": [_note(row) for row in rows]}


def notes_delete(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Delete one of the calling user's notes; another user's note counts as not found.

    Raises:
        LookupError: no such note for this user.
    """
    note_id = params["note_id"]
    with _notes_db(ctx) as db:
        deleted = db.execute(
            "DELETE FROM notes WHERE id = ? AND user = ?", (note_id, ctx.principal)
        ).rowcount
    if not deleted:
        raise LookupError(f"note {note_id} not found")
    return {"deleted": note_id}


def clock_now(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """The current time in an IANA time zone.

    Raises:
        ValueError: ``timezone`` is not a known IANA zone name.
    """
    name = params["timezone"]
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {name!r}; use an IANA name such as 'Europe/Paris' or 'UTC'"
        ) from None
    now = datetime.now(zone)
    offset = now.utcoffset()
    return {
        "timezone": name,
        "iso": now.isoformat(timespec="seconds"),
        "utc_offset_minutes": int(offset.total_seconds() // 60) if offset is not None else 0,
        "abbreviation": now.tzname(),
        "weekday": now.strftime("%A"),
    }


# Linear units: factor to the dimension's base unit (metre, kilogram).
_LINEAR: dict[str, tuple[str, float]] = {
    "mm": ("length", 0.001),
    "cm": ("length", 0.01),
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "in": ("length", 0.0254),
    "ft": ("length", 0.3048),
    "yd": ("length", 0.9144),
    "mi": ("length", 1609.344),
    "mg": ("mass", 1e-6),
    "g": ("mass", 0.001),
    "kg": ("mass", 1.0),
    "t": ("mass", 1000.0),
    "oz": ("mass", 0.028349523125),
    "lb": ("mass", 0.45359237),
    "st": ("mass", 6.35029318),
}

# Temperatures are affine: (to kelvin, from kelvin).
_TEMPERATURE: dict[str, tuple[Any, Any]] = {
    "C": (lambda v: v + 273.15, lambda k: k - 273.15),
    "F": (lambda v: (v - 32.0) * 5.0 / 9.0 + 273.15, lambda k: (k - 273.15) * 9.0 / 5.0 + 32.0),
    "K": (lambda v: v, lambda k: k),
}

UNITS = sorted([*_LINEAR, *_TEMPERATURE])


def _dimension(unit: str) -> str:
    if unit in _TEMPERATURE:
        return "temperature"
    if unit in _LINEAR:
        return _LINEAR[unit][0]
    raise ValueError(f"unknown unit {unit!r}; known: {', '.join(UNITS)}")


def convert_units(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Convert a length, mass or temperature between units.

    Raises:
        ValueError: an unknown unit, units of different dimensions, or a temperature
            below absolute zero.
    """
    value = float(params["value"])
    source, target = params["from_unit"], params["to_unit"]
    dimension = _dimension(source)
    if _dimension(target) != dimension:
        raise ValueError(f"cannot convert {dimension} ({source}) to {_dimension(target)}")
    if dimension == "temperature":
        kelvin = _TEMPERATURE[source][0](value)
        if kelvin < 0:
            raise ValueError(f"{value} {source} is below absolute zero")
        result = _TEMPERATURE[target][1](kelvin)
    else:
        result = value * _LINEAR[source][1] / _LINEAR[target][1]
    return {
        "value": value,
        "from_unit": source,
        "to_unit": target,
        "result": round(result, 6),
        "dimension": dimension,
    }


def project_summary(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Summarise the calling user's notes tagged with the session's project id.

    Raises:
        PermissionError: no project is linked (visibility should have hidden the tool).
    """
    project = ctx.project_id
    if not project:
        raise PermissionError("no project is linked to this session")
    with _notes_db(ctx) as db:
        rows = db.execute(
            "SELECT * FROM notes WHERE user = ? ORDER BY id", (ctx.principal,)
        ).fetchall()
    notes = [_note(row) for row in rows if project in json.loads(row["tags"])]
    tags = sorted({tag for note in notes for tag in note["tags"]} - {project})
    titles = [note["title"] for note in notes]
    summary = f"Project {project}: {len(notes)} note(s)" + (
        f": {'; '.join(titles)}." if titles else "."
    )
    return {
        "project_id": project,
        "note_count": len(notes),
        "titles": titles,
        "other_tags": tags,
        "latest": notes[-1] if notes else None,
        "summary": summary,
    }


async def report(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Write a Markdown report on ``topic``, one section at a time, reporting progress.

    Runs as a job (mode async, SPEC I9, J2): about 0.5 s per section.
    """
    topic = params["topic"]
    count = int(params.get("sections", 3))
    parts = [f"# Report: {topic}", "", f"_Generated for {ctx.user}._", ""]
    for index in range(1, count + 1):
        await asyncio.sleep(REPORT_SECTION_SECONDS)
        parts += [f"## Section {index} of {count}", "", _section_text(topic, index, count), ""]
        ctx.progress(index / count, f"section {index}")
    content = "\n".join(parts)
    return {
        "summary": f"Report on {topic} with {count} section(s) is ready.",
        "artifacts": [
            {"name": f"report-{_slug(topic)}.md", "mime_type": "text/markdown", "content": content}
        ],
        "sections": count,
        "words": len(content.split()),
    }


def _section_text(topic: str, index: int, count: int) -> str:
    if index == 1:
        return f"This report looks at {topic} in {count} part(s)."
    if index == count:
        return f"In conclusion, {topic} deserves a follow-up review."
    return f"Part {index} examines one further aspect of {topic}."


def _slug(text: str) -> str:
    slug = "".join(ch.lower() if ch.isalnum() else "-" for ch in text).strip("-")
    return "-".join(part for part in slug.split("-") if part)[:40] or "report"


def slow_lookup(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """A deliberately slow lookup (~3 s) to demonstrate promotion to a job (SPEC I14).

    Waits on ``ctx.cancelled`` in small steps, so a cancelled call stops promptly.

    Raises:
        InterruptedError: the call was cancelled while waiting.
    """
    cancelled: threading.Event = ctx.cancelled
    if cancelled.wait(SLOW_LOOKUP_SECONDS):
        raise InterruptedError("slow_lookup cancelled")
    query = params["query"]
    return {
        "query": query,
        "answer": f"{query!r} has {len(query)} characters and {len(query.split())} word(s).",
        "waited_seconds": SLOW_LOOKUP_SECONDS,
    }
