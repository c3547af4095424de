"""A damaged store is never served as if whole (SPEC D3, D6, O5; cases F27, F28, F32).

F27: a log with a hole resumes ``resumed: false``, and the writer checks every seq of a
replay, not only each page's first. F28: a read that fails inside a socket's writer
closes that socket with a typed code and a log line. F32: a store truncated to 0 bytes
or with a damaged schema stops ``serve`` with one line naming the file and the damage.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any, cast

import pytest
from websockets.exceptions import ConnectionClosed

from gateway.config import Settings
from gateway.server import Gateway
from gateway.store import SqliteStore, Store, StoreDamaged, StoreUnavailable
from tests.support import (
    CONVERT,
    WAIT,
    Peer,
    closed,
    dropped,
    park_signal,
    peer,
    resume_fields,
    running,
    sequenced,
    settings_for,
    spawn_serve,
)


async def _session_with_events(gw: Gateway, calls: int) -> Peer:
    """A parked session whose log holds ``1 + 2 * calls`` events (catalog, then a
    ``tool_start`` and a ``result`` per call; call ids are new to the user, SPEC I15)."""
    parked = park_signal(gw)
    async with peer(gw) as p:
        sid = p.welcome["session_id"]
        for i in range(calls):
            await p.invoke(f"{sid}-c{i}", "convert_units", CONVERT)
            await p.terminal(f"{sid}-c{i}")
        assert sequenced(p.seen) == list(range(1, 2 + 2 * calls))
        await dropped(p, parked)
    return p


def _delete_events(db: Path, session_id: str, first: int, last: int) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(
            "DELETE FROM events WHERE session_id=? AND seq BETWEEN ? AND ?",
            (session_id, first, last),
        )


async def test_case_f27_hole_in_log_is_never_resumed_as_whole(tmp_path: Path) -> None:
    """SPEC D3, D6, case F27: events 5-7 missing from a session's stored log; a resume
    from ``last_seq`` 0 (or 4) answers ``resumed: false``, never ``[1-4, 8, ...]``;
    from 7 on, the rest of the log is whole and resumes."""
    settings = settings_for(tmp_path)
    async with running(settings) as gw:
        p = await _session_with_events(gw, 5)  # seqs 1..11
    _delete_events(settings.data_dir / "toolbus.db", p.welcome["session_id"], 5, 7)
    async with running(settings) as gw:
        for after in (0, 4):
            async with peer(gw, **resume_fields(p, after)) as again:
                assert again.welcome["resumed"] is False
                assert again.welcome["session_id"] != p.welcome["session_id"]
        async with peer(gw, **resume_fields(p, 7)) as again:
            assert again.welcome["resumed"] is True
            await again.send({"type": "grants.list", "id": "b"})
            await again.expect("grants", id="b")
            assert sequenced(again.seen) == [8, 9, 10, 11]


class _HoleHidingStore:
    """A store whose log has a hole its :meth:`events_complete` does not see (a hole
    made after the resume was admitted): the writer must find it itself."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner

    def events_complete(self, session_id: str, after: int, upto: int) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_replay_checks_every_seq_not_only_each_page(tmp_path: Path) -> None:
    """SPEC D3, D6 (F27, writer side): a hole in the middle of a replay page stops the
    replay before it and closes the socket 1013; the events after the hole are never
    sent as if they followed."""
    settings = settings_for(tmp_path)
    async with running(settings) as gw:
        p = await _session_with_events(gw, 5)
    _delete_events(settings.data_dir / "toolbus.db", p.welcome["session_id"], 5, 7)
    store = _HoleHidingStore(SqliteStore(settings.data_dir / "toolbus.db"))
    gw = Gateway(settings, store=cast(Store, store))
    await gw.start()
    try:
        async with peer(gw, **resume_fields(p, 0)) as again:
            assert again.welcome["resumed"] is True
            error = await closed(again)
            assert error.rcvd is not None
            assert (error.rcvd.code, error.rcvd.reason) == (
                1013,
                "replay history no longer available",
            )
            assert sequenced(again.seen) == [1, 2, 3, 4]
    finally:
        await gw.drain()


class _UnreadableStore:
    """A store whose event reads fail for some sessions, as a damaged page would."""

    def __init__(self, inner: SqliteStore, broken: set[str]) -> None:
        self.inner = inner
        self.broken = broken

    def events_after(
        self, session_id: str, seq: int, limit: int | None = None
    ) -> list[tuple[int, bytes]]:
        if session_id in self.broken:
            raise StoreUnavailable(
                "test.db: reading events failed: database disk image is malformed"
            )
        return self.inner.events_after(session_id, seq, limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_case_f28_read_error_in_writer_closes_typed_and_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SPEC D6, E1, case F28: 10 sessions resume and send ``grants.list``; the replay
    reads of 5 of them fail inside the socket's writer. Each of those is closed 1011
    with a log line naming the failure; the other 5 work. None hangs."""
    settings = settings_for(tmp_path, limits={"max_sessions_per_user": 20})
    async with running(settings) as gw:
        peers = [await _session_with_events(gw, 1) for _ in range(10)]
    broken = {p.welcome["session_id"] for p in peers[::2]}
    store = _UnreadableStore(SqliteStore(settings.data_dir / "toolbus.db"), broken)
    gw = Gateway(settings, store=cast(Store, store))
    await gw.start()
    caplog.set_level(logging.INFO)
    try:
        async with asyncio.timeout(WAIT):
            outcomes = await asyncio.gather(*(_resume_and_ask(gw, p) for p in peers))
    finally:
        await gw.drain()
    for p, outcome in zip(peers, outcomes, strict=True):
        if p.welcome["session_id"] in broken:
            assert outcome == "closed 1011 internal error"
        else:
            assert outcome == "grants []"
    failed = [
        r.getMessage()
        for r in caplog.records
        if r.name == "gateway.outbox" and r.levelno == logging.ERROR
    ]
    assert (
        failed
        == [
            "socket writer failed, closing 1011: "
            "test.db: reading events failed: database disk image is malformed"
        ]
        * 5
    )
    assert gw.metrics.registry.get_sample_value("toolbus_closes_total", {"code": "1011"}) == 5


async def _resume_and_ask(gw: Gateway, p: Peer) -> str:
    async with peer(gw, **resume_fields(p, 0)) as again:
        assert again.welcome["resumed"] is True
        try:
            await again.send({"type": "grants.list", "id": "g"})
            reply = await again.expect("grants", id="g")
        except ConnectionClosed as exc:
            sent = exc.rcvd
        else:
            sent = None
        if sent is not None:
            return f"closed {sent.code} {sent.reason}"
        assert sequenced(again.seen) == [1, 2, 3]
        return f"grants {reply['tools']}"


def _fresh_advice(db: Path) -> str:
    return (
        f"refusing to start rather than drop its sessions and jobs silently. To start fresh "
        f"on purpose, move {db} and its -wal, -shm and -intent files away (their sessions, "
        f"jobs and event logs are then gone)."
    )


async def _stopped_store(tmp_path: Path) -> tuple[Settings, Path]:
    settings = settings_for(tmp_path)
    async with running(settings) as gw:
        await _session_with_events(gw, 2)
    return settings, settings.data_dir / "toolbus.db"


async def test_case_f32_truncated_store_stops_serve_with_one_line(tmp_path: Path) -> None:
    """SPEC O5, D6, case F32: the SQLite file truncated to 0 bytes; ``toolbus serve``
    exits 1 with one line naming the file, the damage and how to start fresh; no
    traceback, and the file is left as it was."""
    settings, db = await _stopped_store(tmp_path)
    os.truncate(db, 0)
    proc = await spawn_serve(
        "--port",
        "0",
        "--data-dir",
        str(settings.data_dir),
        cwd=tmp_path,
        env={**os.environ, "TOOLBUS_CATALOG__HOT_RELOAD": "false"},
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(WAIT * 3):
        out, err = await proc.communicate()
    assert proc.returncode == 1
    assert out == b""
    assert err.decode() == (
        f"toolbus: cannot start: {db}: the store is damaged (the file is empty (0 bytes): "
        f"it was truncated); {_fresh_advice(db)}\n"
    )
    assert db.stat().st_size == 0


async def test_case_f28_garbage_in_the_middle_is_refused_at_start(tmp_path: Path) -> None:
    """SPEC D6, case F28 (the file itself): 16 KiB of garbage in the middle of a stopped
    server's SQLite file fails the integrity check at start: the server refuses, naming
    the file, instead of serving sockets from a damaged log."""
    settings, db = await _stopped_store(tmp_path)
    size = db.stat().st_size
    with db.open("r+b") as f:
        f.seek(size // 2 - 8192)
        f.write(os.urandom(16384))
    with pytest.raises(StoreDamaged) as raised:
        Gateway(settings)
    assert str(raised.value).startswith(f"{db}: the store is damaged (")
    assert str(raised.value).endswith(_fresh_advice(db))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("DROP TABLE events", "table(s) events missing from the schema"),
        (
            "ALTER TABLE jobs DROP COLUMN error",
            "table jobs has columns ['job_id', 'tool', 'state', 'session_id', 'user', "
            "'tenant', 'profile', 'call_id', 'params', 'context', 'created_at', "
            "'started_at', 'finished_at', 'summary', 'artifacts', 'result'], expected "
            "['job_id', 'tool', 'state', 'session_id', 'user', 'tenant', 'profile', "
            "'call_id', 'params', 'context', 'created_at', 'started_at', 'finished_at', "
            "'summary', 'artifacts', 'result', 'error']",
        ),
        ("PRAGMA user_version=99", "schema version 99 is newer than this toolbus's 2"),
    ],
)
async def test_case_f32_damaged_schema_is_refused(
    tmp_path: Path, damage: str, expected: str
) -> None:
    """SPEC O5, D6, case F32: a schema with a table or column gone, or written by a
    newer toolbus, is refused at open with the file and the damage named."""
    settings, db = await _stopped_store(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute(damage)
    with pytest.raises(StoreDamaged) as raised:
        Gateway(settings)
    assert str(raised.value) == f"{db}: the store is damaged ({expected}); {_fresh_advice(db)}"


async def test_store_without_version_is_adopted(tmp_path: Path) -> None:
    """A store written before schema versions (``user_version`` 0, same tables) opens
    and is stamped with the current version; its sessions still resume (SPEC D3)."""
    settings, db = await _stopped_store(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA user_version=0")
        (sid,) = conn.execute("SELECT session_id FROM sessions").fetchone()
    async with running(settings) as gw:
        assert gw.sessions.get(sid) is not None
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (2,)
