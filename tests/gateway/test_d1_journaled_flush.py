"""Flushes made durable by the store's journal, their commit owed (SPEC D1, D3, D6, I12;
issue 13; ``gateway/store_journal.py``, ``SqliteStore.journal``, ``Outbox``).

On the SQLite store a flush appends the writes staged since the last one (events, call,
ledger and counter rows) to the store's journal in one ``write(2)`` and sends; the
commit of the file it owes runs ``store.settle_after`` seconds later for every flush of
that time, or first thing in any read of the file. Checked here: what the journal takes
and refuses, that a read sees what was sent, that a batch entry left by a SIGKILL is
written at the next open (and guarded against an entry the file already has), that
results sent from the journal survive a real SIGKILL of the server, and that an owed
commit failing on a real lock (another process) starts an outage like any failed
commit.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from asyncio.subprocess import PIPE
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from gateway.server import Gateway
from gateway.store import JobRow, SessionRow, SqliteStore, StoreError, StoreUnavailable
from gateway.store_journal import SUFFIX, encode_batch
from gateway.store_rows import LedgerRow, job_values
from tests.gateway import ledger_tools as lt
from tests.gateway.store_faults import LOCKER, checked_peer, resumes_agree, stored_in, until
from tests.gateway.test_call_ledger import SUB
from tests.gateway.test_i15_intent_journal import (
    committed_call,
    committed_ledger,
    journaled,
    journaled_writes,
    resumed_on,
)
from tests.support import CONVERT, Peer, running, script_server, settings_for

CHARGE = {"amount": 100}

SERVER_SCRIPT = """
import asyncio, sys
from pathlib import Path
from gateway.server import Gateway
from tests.gateway.ledger_tools import ledger_settings

async def main():
    settings = ledger_settings(Path(sys.argv[1]), store={"settle_after": 3600})
    gateway = Gateway(settings)
    await gateway.start()
    print(gateway.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""
"""A gateway whose owed commits never come due: what a flush sent is only journaled."""


def _session(sid: str) -> SessionRow:
    return SessionRow(sid, "h", "alice", None, "demo", {}, {}, [], 0, 0, 0, 1.0, None, None)


def _file_events(db: Path, sid: str) -> list[tuple[int, bytes]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT seq, body FROM events WHERE session_id=? ORDER BY seq", (sid,)
        ).fetchall()
    conn.close()
    return [(seq, bytes(body)) for seq, body in rows]


def test_d1_a_flush_is_journaled_and_a_read_pays_the_owed_commit(tmp_path: Path) -> None:
    """SPEC D1, D3: ``journal()`` makes staged events and call rows durable by one
    append, not a commit: the file lacks them, the journal holds them. The next read of
    the file (a resume's ``events_after``) first commits what is owed and empties the
    journal, so it returns what was sent."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    try:
        store.stage_session(_session("s1"))
        assert store.journal() is True  # a session row is journaled like the rest
        store.commit()
        store.stage_event("s1", 1, b'{"type":"result","seq":1}')
        store.stage_call("s1", "c1", "done", b'{"type":"result","seq":1}')
        assert store.journal() is True
        assert store.owed is True
        assert _file_events(db, "s1") == []
        assert journaled_writes(db) == [
            ["e", "s1", 1, '{"type":"result","seq":1}'],
            ["c", "s1", "c1", "done", '{"type":"result","seq":1}'],
        ]
        assert store.events_after("s1", 0) == [(1, b'{"type":"result","seq":1}')]
        assert store.owed is False
        assert _file_events(db, "s1") == [(1, b'{"type":"result","seq":1}')]
        assert Path(str(db) + SUFFIX).stat().st_size == 0
        assert store.call("s1", "c1") == ("done", b'{"type":"result","seq":1}')
    finally:
        store.close()


def test_d1_the_journal_refuses_rows_no_entry_carries_and_a_failed_commit(
    tmp_path: Path,
) -> None:
    """SPEC D1, D6: a batch holding a deletion is committed, not journaled; while the
    last commit failed (another connection's write lock) no flush is journaled either,
    and the commit that succeeds afterwards writes all, the session row journaled
    before the failure included."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    try:
        store.stage_session(_session("s1"))
        store.commit()
        store.delete_session("gone")
        assert store.journal() is False
        store.commit()
        store.stage_event("s1", 1, b'{"seq":1}')
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            store.stage_session(_session("s2"))
            assert store.journal() is True
            with pytest.raises(StoreUnavailable):
                store.commit()
            store.stage_event("s1", 2, b'{"seq":2}')
            assert store.journal() is False  # the last commit failed (SPEC D6)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        store.commit()
        assert [seq for seq, _ in _file_events(db, "s1")] == [1, 2]
        assert store.load_session("s2") is not None
    finally:
        store.close()


KILLED_AFTER_FLUSH = """
import os, signal, sys
from gateway.store import SessionRow, SqliteStore
from gateway.store_rows import LedgerRow
store = SqliteStore(sys.argv[1])
row = SessionRow("s1", "h", "alice", None, "demo", {}, {}, [], 0, 0, 0, 1.0, None, None)
store.stage_session(row)
store.commit()
store.stage_event("s1", 1, b'{"seq":1}')
store.stage_event("s1", 2, b'{"seq":2}')
store.stage_call("s1", "c1", "done", b'{"seq":2}')
store.stage_ledger(LedgerRow("", "alice", "c1", "t", "h", "done", b'{"seq":2}', 5.0))
assert store.journal()
store.stage_seq("s1", 2, 1, 1)
assert store.journal()
os.kill(os.getpid(), signal.SIGKILL)
"""


async def test_d1_d3_batch_entries_left_by_a_sigkill_are_written_at_the_next_open(
    tmp_path: Path,
) -> None:
    """SPEC D1, D3, I12, I15: a process journals two flushes (events, a call's ended
    rows, then an ack's counters) and is SIGKILLed before their commit. The next open
    writes them in order: event 1 is gone again (at the floor the ack set), event 2 is
    there, the call's record and its ledger row say done."""
    db = tmp_path / "toolbus.db"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", KILLED_AFTER_FLUSH, str(db))
    assert await proc.wait() == -9
    assert _file_events(db, "s1") == []
    store = SqliteStore(db)
    try:
        assert store.events_after("s1", 0) == [(2, b'{"seq":2}')]
        row = store.load_session("s1")
        assert row is not None
        assert (row.last_seq, row.acked_seq, row.floor_seq) == (2, 1, 1)
        assert store.call("s1", "c1") == ("done", b'{"seq":2}')
        assert store.ledger("", "alice", "c1") == LedgerRow(
            "", "alice", "c1", "t", "h", "done", b'{"seq":2}', 5.0
        )
        assert journaled_writes(db) == []
    finally:
        store.close()


def test_d1_a_batch_entry_the_file_already_has_changes_nothing(tmp_path: Path) -> None:
    """A crash after a commit and before the journal's truncate leaves entries the file
    has, or has gone past (a truncate that failed): written again at open they change
    nothing: no event of a session the file lacks or at or below its floor, no ledger
    row over a newer one, no `running` row over an ended one of the same call (ledger
    and call record), counters only forward (a session row's too, whose other columns
    are the entry's)."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    store.stage_session(_session("s1"))
    store.stage_seq("s1", 9, 5, 5)
    store.stage_ledger(LedgerRow("", "alice", "c1", "t", "h", "done", b"new", 9.0))
    store.stage_ledger(LedgerRow("", "alice", "c2", "t", "h", "done", b"out", 7.0))
    store.stage_call("s1", "c2", "done", b"out")
    store.commit()
    store.close()
    stale = [
        ("e", "gone", 1, "{}"),
        ("e", "s1", 4, "{}"),
        ("e", "s1", 6, '{"seq":6}'),
        ("q", "s1", 3, 2, 2),
        ("s", "s1", "h", "alice", None, "demo", "{}", "{}", '["t"]', 3, 2, 2, 1.0, 9.5, None, None),
        ("l", "", "alice", "c1", "t", "h", "done", "old", 1.0),
        ("l", "", "alice", "c2", "t", "h", "running", None, 7.0),
        ("c", "s1", "c2", "running", '{"tool":"t"}'),
    ]
    Path(str(db) + SUFFIX).write_bytes(encode_batch(1, stale))
    store = SqliteStore(db)
    try:
        assert store.events_after("gone", 0) == []
        assert store.events_after("s1", 0) == [(6, b'{"seq":6}')]
        row = store.load_session("s1")
        assert row is not None
        assert (row.acked_seq, row.floor_seq) == (5, 5)
        assert (row.grants, row.expires_at) == (["t"], 9.5)
        found = store.ledger("", "alice", "c1")
        assert found is not None
        assert found.outcome == b"new"
        ended = store.ledger("", "alice", "c2")
        assert ended is not None
        assert (ended.state, ended.outcome) == ("done", b"out")
        assert store.call("s1", "c2") == ("done", b"out")
    finally:
        store.close()


def test_d2_the_purge_reads_a_session_row_journaled_since_the_commit(tmp_path: Path) -> None:
    """SPEC D2, S4: a parked session (its row committed with `expires_at`) resumes; the
    row that clears `expires_at` is journaled, the file still has the old one. The purge
    that runs past the old expiry first pays the owed commit, so it does not delete the
    live session."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    try:
        store.stage_session(replace(_session("s1"), expires_at=5.0))
        store.commit()
        store.stage_session(_session("s1"))  # resumed: no expiry
        assert store.journal() is True
        store.purge(now=10.0, job_retention=3600.0)
        row = store.load_session("s1")
        assert row is not None
        assert row.expires_at is None
    finally:
        store.close()


def test_d6_a_purge_while_the_file_is_locked_stays_staged(tmp_path: Path) -> None:
    """SPEC D6 (found in review): the purge pays the owed commit before it reads; while
    another connection holds the write lock that fails, and the purge neither raises nor
    expires a session (the file is behind), but stays staged: once the lock is gone the
    next commit (here the one a read pays) deletes the job finished before its
    retention."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    try:
        ended = ("t", "done", "s1", "alice", None, "demo", None, {}, {}, 1.0, 1.0, 2.0)
        store.stage_job(JobRow("j1", *ended, None, [], None, None))
        store.commit()
        store.stage_session(_session("s1"))
        assert store.journal() is True  # its commit is owed
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            store.purge(now=10_000.0, job_retention=3600.0)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.job("j1") is None  # the read pays the owed commit, the purge in it
        assert store.load_session("s1") is not None
    finally:
        store.close()


def test_d2_a_session_resumed_while_the_purge_waits_keeps_its_row_log_and_call(
    tmp_path: Path,
) -> None:
    """SPEC D2, D3, I15, D6: the purge reads s1 and s2 as expired, but its commit fails
    (another connection holds the file's write lock). s1, whose call c1 runs with its
    rows held in the journal, is resumed meanwhile: its row with `expires_at` cleared is
    staged. The next commit deletes s2 and its events and keeps s1, its event and c1's
    `running` row (written by the commit that empties the journal). Before, the purge's
    staged deletion ran last in that commit whatever was staged since, and it dropped
    the session's held call rows at once."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    try:
        for sid in ("s1", "s2"):
            store.stage_session(replace(_session(sid), expires_at=5.0))
            store.stage_event(sid, 1, b'{"type":"catalog","seq":1}')
        journaled(store, "s1", "c1", 4.0)
        store.commit()
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            store.purge(now=10.0, job_retention=3600.0)
            assert store.dirty  # the purge's commit failed; it stays staged
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        store.stage_session(_session("s1"))  # resumed: no expiry
        store.commit()
        row = store.load_session("s1")
        assert row is not None
        assert row.expires_at is None
        assert store.events_after("s1", 0) == [(1, b'{"type":"catalog","seq":1}')]
        assert (store.load_session("s2"), store.events_after("s2", 0)) == (None, [])
        store.purge_ledger(0.0)  # empties the journal: held rows are written first
        assert committed_call(db, "s1", "c1") == [("running",)]
    finally:
        store.close()


async def test_d2_a_session_ended_by_bye_stays_ended_after_a_sigkill(tmp_path: Path) -> None:
    """SPEC D2, S4 (found in review): `bye` ends the session for good. Its deletion is
    committed at once, so a server killed right after (whose owed commits never come
    due: the session's row was only journaled) does not bring the session back at the
    next start, and a resume with its token is not resumed."""
    settings = lt.ledger_settings(tmp_path)
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        connect(f"ws://127.0.0.1:{first.port}/", subprotocols=[SUB]) as ws,
    ):
        a = Peer(ws)
        welcome = await a.hello()
        await a.send({"type": "bye"})
        await ws.wait_closed()
        assert ws.close_code == 4001
        await first.crash()
    async with running(settings) as gw, resumed_on(gw, welcome) as again:
        assert gw.store.load_session(welcome["session_id"]) is None
        assert again.welcome["resumed"] is False


SESSION_WRITE = ["s", "s1", "h", "alice", "t1", "demo", '{"k":"v"}', '{"o":1}', '["g"]']

KILLED_AFTER_A_HELLO = """
import os, signal, sys
from gateway.store import SessionRow, SqliteStore
store = SqliteStore(sys.argv[1])
store.stage_session(SessionRow("s1", "h", "alice", "t1", "demo", {"k": "v"}, {"o": 1}, ["g"],
                               1, 0, 0, 2.0, None, "v1", None))
store.stage_event("s1", 1, b'{"seq":1}')
assert store.journal()
os.kill(os.getpid(), signal.SIGKILL)
"""


async def test_d1_d3_a_session_row_is_journaled_and_written_back_at_open(tmp_path: Path) -> None:
    """SPEC D1, D3: a session row (a `hello`, a resume, a context update, a grant) is
    journaled like the other rows: the flush appends it, its JSON columns as text, and
    the file lacks it until the commit it owes. A process SIGKILLed before that commit
    leaves it in the journal only; the next open writes it back, then the events staged
    after it."""
    db = tmp_path / "toolbus.db"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", KILLED_AFTER_A_HELLO, str(db))
    assert await proc.wait() == -9
    assert journaled_writes(db) == [
        [*SESSION_WRITE, 1, 0, 0, 2.0, None, "v1", None],
        ["e", "s1", 1, '{"seq":1}'],
    ]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone() == (0,)
    conn.close()
    store = SqliteStore(db)
    try:
        assert store.load_session("s1") == SessionRow(
            "s1", "h", "alice", "t1", "demo", {"k": "v"}, {"o": 1}, ["g"], 1, 0, 0, 2.0, None, "v1"
        )
        assert store.events_after("s1", 0) == [(1, b'{"seq":1}')]
    finally:
        store.close()


KILLED_AFTER_A_JOB_STARTED = """
import os, signal, sys
from gateway.store import JobRow, SqliteStore
store = SqliteStore(sys.argv[1])
params = {"text": "caf\u00e9", "n": [1, 2.5, None]}
row = JobRow("j1", "t", "running", "s1", "alice", None, "demo", "c1", params, {"k": "v"},
             1.0, 2.0, None, None, [], None, None)
store.stage_job(row)
assert store.journal()
os.kill(os.getpid(), signal.SIGKILL)
"""


async def test_j5_a_job_started_on_the_journal_is_running_after_a_sigkill(
    tmp_path: Path,
) -> None:
    """SPEC J5, J6, D1: a job's `running` row is journaled, not committed, before its
    handler starts; the process is SIGKILLed. The next open writes the row, JSON columns
    and all, so recovery finds the job started (and reports it interrupted, never runs
    it again)."""
    db = tmp_path / "toolbus.db"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KILLED_AFTER_A_JOB_STARTED, str(db)
    )
    assert await proc.wait() == -9
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    conn.close()
    store = SqliteStore(db)
    try:
        params = {"text": "caf\u00e9", "n": [1, 2.5, None]}
        assert store.job("j1") == JobRow(
            "j1", "t", "running", "s1", "alice", None, "demo", "c1", params, {"k": "v"},
            1.0, 2.0, None, None, [], None, None,
        )  # fmt: skip
        assert [job.job_id for job in store.unfinished_jobs()] == ["j1"]
        assert journaled_writes(db) == []
    finally:
        store.close()


def test_j5_a_stale_job_row_in_the_journal_never_turns_a_job_back(tmp_path: Path) -> None:
    """A job row written again at open (an entry the file has gone past) never moves
    the job back in its one-way order: no `running` or `queued` row over an ended one,
    no `queued` over `running`; a row further on is written."""
    db = tmp_path / "toolbus.db"

    def job(job_id: str, state: str, result: dict[str, int] | None = None) -> JobRow:
        finished = None if state in ("queued", "running") else 3.0
        return JobRow(
            job_id, "t", state, "s1", "alice", None, "demo", None, {}, {},
            1.0, 2.0, finished, None, [], result, None,
        )  # fmt: skip

    store = SqliteStore(db)
    store.stage_job(job("ended", "done", {"n": 1}))
    store.stage_job(job("started", "running"))
    store.stage_job(job("behind", "queued"))
    store.commit()
    store.close()
    stale = [
        ("j", *job_values_text(job("ended", "running"))),
        ("j", *job_values_text(job("started", "queued"))),
        ("j", *job_values_text(job("behind", "running"))),
    ]
    Path(str(db) + SUFFIX).write_bytes(encode_batch(1, stale))
    store = SqliteStore(db)
    try:
        assert store.job("ended") == job("ended", "done", {"n": 1})
        assert store.job("started") == job("started", "running")
        assert store.job("behind") == job("behind", "running")
    finally:
        store.close()


JOB_START_REFUSED_BY_A_FULL_DISK = """
import asyncio, os, resource, signal, sys
from dataclasses import replace
from gateway.outbox import Outbox
from gateway.store import JobRow, SessionRow, SqliteStore
from gateway.store_journal import SUFFIX, encode_batch
from gateway.store_rows import job_values
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
db = sys.argv[1]

async def main():
    store = SqliteStore(db, checkpoint_interval=3600)
    outbox = Outbox(store, settle_after=3600)
    store.stage_session(SessionRow("s1", "h", "alice", None, "demo", {}, {}, [], 0, 0, 0,
                                   1.0, None, None))
    queued = JobRow("j1", "once_only", "queued", "s1", "alice", None, "demo", "c1", {"n": 1},
                    {}, 1.0, None, None, None, [], None, None)
    store.stage_job(queued)
    assert outbox.commit()          # a session row: committed; the job is queued in the file
    # JobRunner._execute's started(): the job turns running, made durable first.
    running = replace(queued, state="running", started_at=2.0)
    text = [v.decode() if isinstance(v, bytes) else v for v in job_values(running)]
    entry = encode_batch(1, [("j", *text)])
    store.stage_job(running)
    # The disk fills: the append stops one byte short of the entry (its newline).
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    size = os.path.getsize(db + SUFFIX)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + len(entry) - 1, hard))
    durable = outbox.commit()
    assert durable is False, "started() must refuse: the tool does not run"
    # ToolFailure(UNAVAILABLE): the job ends failed, staged; the disk is still full.
    store.stage_job(replace(running, state="failed", finished_at=3.0,
                            error={"code": "unavailable", "message": "store"}))
    assert outbox.commit() is False
    print("refused", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


async def test_j6_a_job_whose_start_the_journal_refused_is_not_started_after_a_restart(
    tmp_path: Path,
) -> None:
    """SPEC J6, D6 (found in review): the disk fills while a job's `running` row is
    appended before its handler: the append stops one byte short of the entry's
    newline and reports failure, the commit the outbox then tries fails too, so the
    handler never runs (the job ends `unavailable`, staged); SIGKILL. The entry left
    part way is never read back (the append cut it off again, and an entry without its
    newline is skipped besides): the next open finds the job `queued`, never started,
    so it runs after the restart instead of being reported interrupted."""
    db = tmp_path / "toolbus.db"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", JOB_START_REFUSED_BY_A_FULL_DISK, str(db), stdout=PIPE
    )
    out, _ = await proc.communicate()
    assert (out, proc.returncode) == (b"refused\n", -9)
    store = SqliteStore(db)
    try:
        row = store.job("j1")
        assert row is not None
        assert (row.state, row.started_at) == ("queued", None)
    finally:
        store.close()


def test_i15_an_entry_without_its_newline_is_never_read_back(tmp_path: Path) -> None:
    """An append that failed part way (its caller was told, and committed instead) may
    leave a whole entry but its closing newline, if cutting it off failed too: it is
    skipped at open, the whole entries before it are written."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    store.stage_session(_session("s1"))
    store.commit()
    store.close()
    whole = encode_batch(1, [("e", "s1", 1, '{"seq":1}')])
    torn = encode_batch(2, [("e", "s1", 2, '{"seq":2}')])[:-1]
    Path(str(db) + SUFFIX).write_bytes(whole + torn)
    store = SqliteStore(db)
    try:
        assert store.events_after("s1", 0) == [(1, b'{"seq":1}')]
    finally:
        store.close()


def job_values_text(row: JobRow) -> list[Any]:
    """A job row's values as a batch entry carries them (JSON columns as text)."""
    return [v.decode() if isinstance(v, bytes) else v for v in job_values(row)]


RESULT = b'{"type":"result","seq":2,"call_id":"c1"}'


KILLED_AFTER_ONE_FLUSH = """
import os, signal, sys
from gateway.store import SqliteStore
store = SqliteStore(sys.argv[1])
store.stage_call("s1", "c2", "done", b'{"seq":3}')
assert store.journal()
os.kill(os.getpid(), signal.SIGKILL)
"""


def _left_after_its_commit(db: Path) -> None:
    """The first part of the test below: an entry written by a commit and left in the
    journal is skipped at the next open."""
    journal = Path(str(db) + SUFFIX)
    store = SqliteStore(db)
    store.stage_session(_session("s1"))
    store.commit()
    store.stage_call("s1", "c1", "done", RESULT)
    store.stage_ledger(LedgerRow("", "alice", "c1", "t", "h", "done", RESULT, 5.0))
    assert store.journal() is True
    left = journal.read_bytes()
    store.commit()  # the commit the flush owes
    assert journal.stat().st_size == 0
    store.stage_forget_call("s1", "c1")
    store.commit()
    store.close()
    journal.write_bytes(left)  # killed after the commit, before the truncate
    reopened = SqliteStore(db)
    try:
        assert reopened.call("s1", "c1") is None
        assert reopened.ledger("", "alice", "c1") == LedgerRow(
            "", "alice", "c1", "t", "h", "done", RESULT, 5.0
        )
        assert journal.stat().st_size == 0
    finally:
        reopened.close()


def _generations(db: Path) -> list[int]:
    """The numbers of the batch entries in the journal of ``db``."""
    lines = Path(str(db) + SUFFIX).read_bytes().split()
    return [orjson.loads(line)["gen"] for line in lines if line.startswith(b"{")]


async def test_d1_i12_an_entry_left_after_its_commit_is_not_written_again(
    tmp_path: Path,
) -> None:
    """SPEC D1, I12 (found in review): a flush journals a call's ended record; a later
    commit (the one the flush owes) writes it, records the entry's number and would
    empty the journal, and the call's record then leaves its window (forgotten,
    committed). The process dies between that commit and the truncate: the journal still
    holds the entry (put back here after the store closed, as a crash leaves it). At the
    next open it is skipped, not written again: the forgotten record stays forgotten.
    The next store numbers its entries on from the file's mark: one a SIGKILL leaves
    before its commit is past the mark, and written at the next open."""
    db = tmp_path / "toolbus.db"
    _left_after_its_commit(db)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KILLED_AFTER_ONE_FLUSH, str(db)
    )
    assert await proc.wait() == -9
    assert _generations(db) == [2]
    reopened = SqliteStore(db)
    try:
        assert reopened.call("s1", "c2") == ("done", b'{"seq":3}')
    finally:
        reopened.close()


SHORT_APPEND_THEN_FORGOTTEN = """
import os, resource, signal, sys
from gateway.store import SessionRow, SqliteStore
from gateway.store_journal import encode_batch
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
db = sys.argv[1]
store = SqliteStore(db, checkpoint_interval=3600)  # no checkpoint under the size limit
row = SessionRow("s1", "h", "alice", None, "demo", {}, {}, [], 0, 0, 0, 1.0, None, None)
store.stage_session(row)
store.commit()
store.stage_call("s1", "c1", "running", b'{"tool":"t"}')
# The disk fills: the append of entry 1 writes all of it but its closing newline.
size = len(encode_batch(1, [("c", "s1", "c1", "running", '{"tool":"t"}')]))
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(db + "-intent") + size - 1, hard))
journaled = store.journal()
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
assert journaled is False
store.commit()  # what the outbox does when the journal did not take the flush
store.stage_call("s1", "c1", "done", b'{"seq":1}')
store.stage_session(row)
store.commit()
store.stage_forget_call("s1", "c1")
store.stage_session(row)
store.commit()
os.kill(os.getpid(), signal.SIGKILL)
"""


async def test_d1_i12_a_short_append_whose_rows_were_committed_is_not_written_again(
    tmp_path: Path,
) -> None:
    """SPEC D1, I12 (found in review): a full disk stops a batch entry's append one byte
    short, after the whole entry but its newline, so it reads back whole; the store
    commits the rows instead, then the call ends and its record is forgotten, all
    committed; SIGKILL. The commit after the failed append recorded the entry's number
    and emptied the journal, so the next open does not bring the forgotten call back."""
    db = tmp_path / "toolbus.db"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SHORT_APPEND_THEN_FORGOTTEN, str(db)
    )
    assert await proc.wait() == -9
    store = SqliteStore(db)
    try:
        assert store.call("s1", "c1") is None
        assert store.running_ledger() == []
    finally:
        store.close()


def test_d1_d6_a_journal_that_exists_and_cannot_be_opened_stops_the_store(
    tmp_path: Path,
) -> None:
    """SPEC D1, D6 (found in review): the journal may hold sent events and running calls
    the database lacks, so a journal that exists but cannot be opened (here a folder in
    its place; in the field a permission or attribute changed) stops the store with a
    typed error naming it, instead of opening without its entries."""
    db = tmp_path / "toolbus.db"
    SqliteStore(db).close()
    Path(str(db) + SUFFIX).unlink()
    Path(str(db) + SUFFIX).mkdir()
    with pytest.raises(StoreError, match="cannot open the store's journal"):
        SqliteStore(db)


async def test_d1_i12_results_sent_from_the_journal_survive_a_sigkill(tmp_path: Path) -> None:
    """SPEC D1, D3, I12, I15: a server whose owed commits never come due sends a call's
    result from the journal alone and is SIGKILLed: the file has no row of the call, nor
    of the session (its row, staged at `hello`, was journaled too). The next server
    writes the journal's entries at open; the session resumes, gets the result by
    replay, a re-send of the call id gets the recorded result, and the tool ran once."""
    settings = lt.ledger_settings(tmp_path)
    db = settings.data_dir / "toolbus.db"
    lt.reset()
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        connect(f"ws://127.0.0.1:{first.port}/", subprotocols=[SUB]) as ws,
    ):
        a = Peer(ws)
        welcome = await a.hello(options={"tool_start": "gated"})
        await a.invoke("c1", "charge", CHARGE)
        sent = await a.terminal("c1")
        assert (sent["type"], sent["result"]) == ("result", {"charged": 100})
        await first.crash()
    assert first.proc.returncode == -9
    assert committed_ledger(db, "c1") == []
    sid = welcome["session_id"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT 1 FROM sessions WHERE session_id=?", (sid,)).fetchall() == []
    conn.close()
    assert {w[3] for w in journaled_writes(db) if w[0] == "s" and w[1] == sid} == {"alice"}
    # The batch entries carry the call's ended rows only: its `running` rows are in its
    # intent entry (admission), which the ended ones make spent.
    assert [w[6] for w in journaled_writes(db) if w[0] == "l" and w[3] == "c1"] == ["done"]
    assert [w[3] for w in journaled_writes(db) if w[0] == "c" and w[2] == "c1"] == ["done"]
    async with (
        running(settings) as gw,
        resumed_on(gw, welcome, options={"tool_start": "gated"}) as resumed,
    ):
        assert resumed.welcome["resumed"] is True
        assert await resumed.terminal("c1") == sent
        await resumed.invoke("c1", "charge", CHARGE)
        again = await resumed.terminal("c1")
        assert {k: v for k, v in again.items() if k != "seq"} == {
            k: v for k, v in sent.items() if k != "seq"
        }
    assert committed_ledger(db, "c1") == [("done", "charge")]
    assert lt.runs(settings.data_dir) == ["c1 100"]


async def test_d6_an_owed_commit_failing_on_a_lock_starts_an_outage(tmp_path: Path) -> None:
    """SPEC D1, D6: another process holds the file's write lock. A call's result still
    leaves from the journal (durable there; the checked peer finds every event it gets
    in the file or the journal); the commit it owes fails, and from then on events are
    held, not sent. Once the lock is gone the held result arrives and every resume
    agrees with the log."""
    settings = settings_for(tmp_path, store={"retry_max": 0.05, "settle_after": 0.05})
    gw = Gateway(settings)
    await gw.start()
    db = settings.data_dir / "toolbus.db"
    locker = None
    try:
        async with checked_peer(gw, stored_in(db)) as a:
            await a.expect("catalog")
            # The hello's own owed commit lands first: a lock taken before it would
            # start the outage before a1, whose result would then be held, not sent.
            await until(lambda: not gw.store.owed, "the hello's owed commit landed")
            locker = await asyncio.create_subprocess_exec(
                sys.executable, "-c", LOCKER, str(db), stdin=PIPE, stdout=PIPE
            )
            assert locker.stdout is not None
            assert await locker.stdout.readline() == b"locked\n"
            await a.invoke("a1", "convert_units", CONVERT)
            first = await a.terminal("a1")
            assert first["type"] == "result"
            await until(lambda: gw.outbox.failing_since is not None, "the owed commit failed")
            await a.invoke("a2", "convert_units", {**CONVERT, "value": 2})
            await until(lambda: gw.outbox.held > 0, "a2's events held")
            assert "a2" not in {m.get("call_id") for m in a.seen}
            assert locker.stdin is not None
            locker.stdin.write(b"release\n")
            await locker.stdin.drain()
            second = await a.terminal("a2")
            assert (second["type"], second["result"]["result"]) == ("result", 200.0)
            await until(lambda: gw.outbox.failing_since is None, "commits again")
            await resumes_agree(gw, a)
    finally:
        if locker is not None:
            if locker.returncode is None:
                locker.kill()
            await locker.communicate()
        await gw.drain()
    assert orjson.loads(_file_events(db, a.welcome["session_id"])[-1][1])["call_id"] == "a2"
