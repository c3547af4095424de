"""The stores: bounded WAL (SQLite), bounded call records and the purge on SQLite and
PostgreSQL (SPEC D1-D3, I12, N1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import store as store_module
from gateway.store import JobRow, SessionRow, SqliteStore, Store
from gateway.store_pg import PgStore
from tests.pg_support import store_backend  # noqa: F401 (fixture: SQLite, PostgreSQL)
from tests.support import peer, running, settings_for


def test_wal_stays_bounded_under_sustained_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC D1: commits keep coming, yet the WAL file does not grow without bound."""
    monkeypatch.setattr(store_module, "WAL_PAGES", 256)  # 1 MiB instead of 64 MiB
    store = SqliteStore(tmp_path / "db.sqlite", checkpoint_interval=3600)
    body = b"x" * 4000
    for seq in range(1, 5001):  # about 20 MB of events, one commit per event
        store.stage_event("s1", seq, body)
        store.commit()
    wal = tmp_path / "db.sqlite-wal"
    assert wal.stat().st_size <= 4 * 256 * 4096
    assert [seq for seq, _ in store.events_after("s1", 4998)] == [4999, 5000]
    store.close()


@pytest.mark.usefixtures("store_backend")
async def test_call_records_window(tmp_path: Path) -> None:
    """SPEC I12: the last max_call_records outcomes are re-sent as recorded; an older
    call_id re-sent is a new call, and its old record is gone from the store."""
    settings = settings_for(tmp_path, sessions={"max_call_records": 3})
    params = {"timezone": "UTC"}
    async with running(settings) as gw, peer(gw) as p:
        terminals = {}
        for i in range(5):
            await p.invoke(f"c{i}", "clock_now", params)
            terminals[f"c{i}"] = await p.terminal(f"c{i}")
        await p.invoke("c4", "clock_now", params)
        assert await p.terminal("c4") == terminals["c4"]
        await p.invoke("c0", "clock_now", params)
        again = await p.terminal("c0")
        assert again["seq"] > terminals["c4"]["seq"]
        session = gw.sessions.get(p.welcome["session_id"])
        assert session is not None
        assert list(session.done_calls) == ["c3", "c4", "c0"]
        gw.outbox.flush()
        assert gw.store.call(session.id, "c1") is None
        assert gw.store.done_call_ids(session.id) == ["c3", "c4", "c0"]


def _job(job_id: str, finished_at: float | None) -> JobRow:
    state = "done" if finished_at is not None else "running"
    return JobRow(
        job_id,
        "report",
        state,
        "s1",
        "alice",
        None,
        "demo",
        None,
        {},
        {},
        0.0,
        0.0,
        finished_at,
        None,
        [],
        None,
        None,
    )


def _session(session_id: str, expires_at: float | None) -> SessionRow:
    return SessionRow(
        session_id, "h", "alice", None, "demo", {}, {}, [], 0, 0, 0, 0.0, expires_at, None
    )


def test_purge_keeps_jobs_for_their_retention_and_drops_expired_sessions(
    tmp_path: Path,
    store_backend: str,  # noqa: F811 (the fixture imported above)
) -> None:
    """SPEC D2: finished jobs stay readable for the retention (7 days by default); running
    jobs and live sessions are never purged; sessions past their resume window are."""
    store: Store
    if store_backend == "sqlite":
        store = SqliteStore(tmp_path / "db.sqlite")
    else:
        store = PgStore(store_backend)
    day = 24 * 3600.0
    now = 100 * day
    for job in (_job("old", now - 8 * day), _job("recent", now - 6 * day), _job("live", None)):
        store.stage_job(job)
    for row in (_session("expired", now - 1), _session("parked", now + 60), _session("live", None)):
        store.stage_session(row)
    store.stage_event("expired", 1, b"{}")
    store.commit()
    store.purge(now, 7 * day)
    assert [store.job(j) is not None for j in ("old", "recent", "live")] == [False, True, True]
    assert sorted(s.session_id for s in store.all_sessions()) == ["live", "parked"]
    assert store.events_after("expired", 0) == []
    store.close()


def test_purge_drops_old_jobs_when_no_session_expired(
    tmp_path: Path,
    store_backend: str,  # noqa: F811 (the fixture imported above)
) -> None:
    """SPEC D2: the job retention holds on its own; a purge with no expired session still
    deletes jobs finished before the retention."""
    store: Store
    if store_backend == "sqlite":
        store = SqliteStore(tmp_path / "db.sqlite")
    else:
        store = PgStore(store_backend)
    day = 24 * 3600.0
    now = 100 * day
    for job in (_job("old", now - 8 * day), _job("recent", now - 6 * day)):
        store.stage_job(job)
    store.stage_session(_session("live", None))
    store.commit()
    store.purge(now, 7 * day)
    assert [store.job(j) is not None for j in ("old", "recent")] == [False, True]
    assert [s.session_id for s in store.all_sessions()] == ["live"]
    store.close()
