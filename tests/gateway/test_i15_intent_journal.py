"""The SQLite store's intent journal (SPEC I15, D6; ``gateway/store_journal.py``).

A call of a tool with side effects may start its handler once its ``running`` rows are
in the journal (one ``write(2)``), before any commit. These tests make the faults real:
the server process is killed with SIGKILL right after the handler started (no commit
ran in between, which the test checks in the file), the journal is ``/dev/full``, a
torn entry is in the file, another process holds the journal's lock.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from gateway.ledger import RESTARTED
from gateway.server import Gateway
from gateway.store import JOURNAL_BYTES, LedgerRow, SqliteStore, StoreDamaged, StoreError
from gateway.store_journal import SUFFIX, Intent, IntentJournal, open_journal
from protocol.errors import ErrorCode
from tests.gateway import ledger_tools as lt
from tests.gateway.test_call_ledger import SERVER_SCRIPT, FailingCommits, wait_until
from tests.support import Peer, peer, running, script_server

SUB = Subprotocol("toolbus.v1")
CHARGE = {"amount": 100}


def journal_call_ids(db: Path) -> list[str]:
    """The call ids of the entries in the store's journal, in order."""
    journal = Path(str(db) + SUFFIX).read_bytes()
    return [orjson.loads(line)[1] for line in journal.split(b"\n") if line]


def committed_ledger(db: Path, call_id: str) -> list[tuple[str, ...]]:
    """The call's ledger rows as committed in the file (state, tool)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT state, tool FROM call_ledger WHERE call_id=?", (call_id,)
        ).fetchall()
    conn.close()
    return rows


async def test_i15_a_call_killed_before_any_commit_comes_back_from_the_journal(
    tmp_path: Path,
) -> None:
    """SPEC I15, D3: the handler starts with its rows only in the journal, and the
    process is SIGKILLed before any commit. The next server puts the rows back: the
    resumed session gets the call's `cancelled`, a re-send from a new session of the
    principal gets the same recorded outcome, and the tool ran once."""
    settings = lt.ledger_settings(tmp_path)
    db = settings.data_dir / "toolbus.db"
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        connect(f"ws://127.0.0.1:{first.port}/", subprotocols=[SUB]) as ws,
    ):
        a = Peer(ws)
        welcome = await a.hello()
        await a.invoke("k1", "crash_charge", CHARGE)
        assert await first.proc.wait() == -9
    assert lt.runs(settings.data_dir) == ["k1 100"]
    # The precondition of this test: nothing of the call was committed, the journal
    # alone holds it.
    assert committed_ledger(db, "k1") == []
    assert journal_call_ids(db) == ["k1"]
    async with running(settings) as gw:
        assert journal_call_ids(db) == []
        async with peer(
            gw,
            session_id=welcome["session_id"],
            resume_token=welcome["resume_token"],
            last_seq=welcome["last_seq"],
        ) as resumed:
            assert resumed.welcome["resumed"] is True
            answer = await resumed.terminal("k1")
            assert (answer["type"], answer["code"], answer["message"]) == (
                "call.error",
                ErrorCode.CANCELLED,
                RESTARTED,
            )
        async with peer(gw) as b:
            await b.invoke("k1", "crash_charge", CHARGE)
            again = await b.terminal("k1")
            assert (again["type"], again["code"]) == ("call.error", ErrorCode.CANCELLED)
    assert lt.runs(settings.data_dir) == ["k1 100"]
    assert committed_ledger(db, "k1") == [("done", "crash_charge")]


async def test_i15_a_journaled_call_runs_once_when_the_next_commit_fails(
    tmp_path: Path,
) -> None:
    """SPEC I15, D6: the store's next commit fails after the handler started on its
    journaled rows; the result is held, not sent, until a commit succeeds, then
    delivered once; the tool ran once."""
    lt.reset()
    settings = lt.ledger_settings(tmp_path)
    store = FailingCommits(SqliteStore(settings.data_dir / "toolbus.db"))
    gw = Gateway(settings, store=store)  # type: ignore[arg-type]
    await gw.start()
    try:
        async with peer(gw) as p:
            store.failing = True
            await p.invoke("j1", "held_async", CHARGE)
            await wait_until(lambda: lt.runs(settings.data_dir) == ["j1 100"], "started")
            lt.GATE.jobs.set()
            await wait_until(lambda: gw.outbox.held > 0, "result held")
            assert committed_ledger(settings.data_dir / "toolbus.db", "j1") == []
            store.failing = False
            answer = await p.terminal("j1")
            assert (answer["type"], answer["result"]) == ("result", {"charged": 100})
    finally:
        lt.GATE.jobs.set()
        await gw.drain()
    assert lt.runs(settings.data_dir) == ["j1 100"]


def test_i15_a_torn_entry_is_skipped_and_whole_ones_are_kept(tmp_path: Path) -> None:
    """A torn append (a full disk mid-write) is a line of its own: skipped on read;
    entries before and after it are read whole."""
    path = tmp_path / ("db" + SUFFIX)
    first = Intent("s1", "c1", '{"tool":"t"}', "", "alice", "t", "h1", 1.0)
    second = Intent("s1", "c2", None, "", "alice", "t", "h2", 2.0)
    journal = IntentJournal(path)
    assert journal.append(first)
    with path.open("ab") as raw:
        raw.write(first.encode()[:20])  # what a short write leaves behind
    assert journal.append(second)
    assert journal.read() == [first, second]
    journal.clear()
    assert journal.size == 0
    assert path.stat().st_size == 0
    journal.close()


def test_i15_a_journal_another_store_holds_is_not_used(tmp_path: Path) -> None:
    """One writer per journal: a second store on the same file gets none (the lock is
    held) and makes a call's rows durable by committing them (`keep_intent` False)."""
    db = tmp_path / "toolbus.db"
    first = SqliteStore(db)
    second = SqliteStore(db)
    try:
        row = LedgerRow("", "alice", "c1", "t", "h", "running", None, 1.0)
        for store in (first, second):
            store.stage_ledger(row)
            store.stage_call("s1", "c1", "running", b'{"tool":"t"}')
        assert first.keep_intent("s1", "c1", ("", "alice", "c1")) is True
        assert second.keep_intent("s1", "c1", ("", "alice", "c1")) is False
    finally:
        first.close()
        second.close()
    # Free again once the holder closed it.
    journal = open_journal(str(db))
    assert journal is not None
    journal.close()


def test_i15_the_lock_is_an_os_lock_other_processes_see(tmp_path: Path) -> None:
    """The journal's lock is ``flock``: a holder in another open of the file (as in
    another process) makes :func:`open_journal` answer ``None``."""
    db = tmp_path / "toolbus.db"
    path = Path(str(db) + SUFFIX)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert open_journal(str(db)) is None
    finally:
        os.close(fd)


def test_i15_a_journaled_call_whose_rows_were_committed_is_not_put_back(tmp_path: Path) -> None:
    """A crash between a commit and the journal's truncate leaves entries of committed
    calls: the next open keeps the committed row (here `done`) as it is, and puts back
    only the call the file lacks."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    store.stage_ledger(LedgerRow("", "alice", "done1", "t", "h", "done", b"{}", 1.0))
    store.commit()
    store.close()
    entries = [
        Intent("s1", "done1", None, "", "alice", "t", "h", 1.0),
        Intent("s1", "new1", '{"tool":"t"}', "", "alice", "t", "h", 2.0),
    ]
    Path(str(db) + SUFFIX).write_bytes(b"".join(e.encode() for e in entries))
    reopened = SqliteStore(db)
    try:
        assert reopened.ledger("", "alice", "done1") == LedgerRow(
            "", "alice", "done1", "t", "h", "done", b"{}", 1.0
        )
        assert reopened.ledger("", "alice", "new1") == LedgerRow(
            "", "alice", "new1", "t", "h", "running", None, 2.0
        )
        # No session s1 in the file: no call row for it.
        assert reopened.call("s1", "new1") is None
    finally:
        reopened.close()
    assert Path(str(db) + SUFFIX).stat().st_size == 0


async def test_i15_a_full_journal_falls_back_to_the_commit(tmp_path: Path) -> None:
    """SPEC I15, D6: the journal is a full disk (``/dev/full``): the append fails, the
    call's rows are committed before its handler instead, and when that commit fails
    too the call ends `unavailable` and the tool does not run."""
    lt.reset()
    settings = lt.ledger_settings(tmp_path)
    db = settings.data_dir / "toolbus.db"
    os.makedirs(db.parent, exist_ok=True)
    os.symlink("/dev/full", str(db) + SUFFIX)
    store = FailingCommits(SqliteStore(db))
    gw = Gateway(settings, store=store)  # type: ignore[arg-type]
    await gw.start()
    try:
        async with peer(gw) as p:
            store.failing = True
            await p.invoke("u1", "held_charge", CHARGE)
            await wait_until(lambda: gw.outbox.held > 0, "terminal held")
            store.failing = False
            answer = await p.terminal("u1")
            assert (answer["type"], answer["code"]) == ("call.error", ErrorCode.UNAVAILABLE)
            assert answer["message"] == "the store cannot commit right now; the tool did not run"
    finally:
        lt.GATE.release.set()
        await gw.drain()
    assert lt.runs(settings.data_dir) == []


def test_i15_a_locked_file_at_open_keeps_the_journal_for_the_next_start(tmp_path: Path) -> None:
    """SPEC D6 at start: another connection holds the file's write lock past the open's
    5 s wait. The open fails with a `StoreError` that says so (not the damage message,
    which advises moving the file away), the journal keeps its entry, and once the
    lock is gone the next open puts the call back."""
    db = tmp_path / "toolbus.db"
    SqliteStore(db).close()
    entry = Intent("s1", "late1", None, "", "alice", "t", "h", 3.0)
    journal_path = Path(str(db) + SUFFIX)
    journal_path.write_bytes(entry.encode())
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreError) as refused:
            SqliteStore(db)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not isinstance(refused.value, StoreDamaged)
    assert str(refused.value) == f"{db}: cannot open the store: database is locked"
    assert journal_path.read_bytes() == entry.encode()
    store = SqliteStore(db)
    try:
        assert store.ledger("", "alice", "late1") == LedgerRow(
            "", "alice", "late1", "t", "h", "running", None, 3.0
        )
    finally:
        store.close()


def test_i15_spent_entries_go_with_a_purge_or_past_the_size_bound(tmp_path: Path) -> None:
    """A commit leaves its calls' entries in the journal (a truncate costs ten appends);
    the journal is emptied by the first commit past `JOURNAL_BYTES`, by every ledger
    purge (so no entry outlives its ledger row) and by a clean close."""
    db = tmp_path / "toolbus.db"
    journal_path = Path(str(db) + SUFFIX)
    store = SqliteStore(db)

    def call(n: int) -> None:
        key = ("", "alice", f"c{n}")
        store.stage_call("s1", key[2], "running", b'{"tool":"t"}')
        store.stage_ledger(LedgerRow(*key, "t", "h", "running", None, 1.0))
        assert store.keep_intent("s1", key[2], key)
        store.commit()

    try:
        call(0)
        assert journal_path.stat().st_size == len(
            Intent("s1", "c0", '{"tool":"t"}', "", "alice", "t", "h", 1.0).encode()
        )
        store.purge_ledger(0.0)  # commits the purge: nothing was that old
        assert journal_path.stat().st_size == 0
        n, before = 0, 0
        while True:  # until a commit empties it
            n += 1
            call(n)
            size = journal_path.stat().st_size
            if size == 0:
                break
            assert size < JOURNAL_BYTES
            before = size
        entry = Intent("s1", f"c{n}", '{"tool":"t"}', "", "alice", "t", "h", 1.0).encode()
        assert before + len(entry) >= JOURNAL_BYTES  # emptied by the commit past the bound
        call(n + 1)
        assert journal_path.stat().st_size > 0
    finally:
        store.close()
    assert journal_path.stat().st_size == 0
