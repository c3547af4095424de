"""The SQLite store's intent journal (SPEC I15, D6; ``gateway/store_journal.py``).

A call of a tool with side effects may start its handler once its ``running`` rows are
in the journal (one ``write(2)``), before any commit, when nothing else must be durable
first (SPEC A3, A6, D6). These tests make the faults real: the server process is killed
with SIGKILL right after the handler started (the test checks what the file holds),
the journal is ``/dev/full`` or ``/dev/null``, a torn or wrongly typed entry is in the
file, another open holds the journal's lock, another connection holds the database's
write lock.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from gateway.ledger import RESTARTED
from gateway.server import Gateway
from gateway.store import (
    JOURNAL_BYTES,
    LedgerRow,
    SessionRow,
    SqliteStore,
    StoreDamaged,
    StoreError,
)
from gateway.store_journal import SUFFIX, Intent, IntentJournal
from protocol.errors import ErrorCode
from tests.gateway import ledger_tools as lt
from tests.gateway.test_call_ledger import SERVER_SCRIPT, FailingCommits, wait_until
from tests.support import Peer, ScriptServer, peer, running, script_server

SUB = Subprotocol("toolbus.v1")
CHARGE = {"amount": 100}
GATED_ONLY = {"tool_start": "gated"}
"""The hello option of a session that gets `tool_start` for gated calls only (SPEC A6):
its calls start on the journal alone."""


@asynccontextmanager
async def own_process(
    tmp_path: Path, **hello: Any
) -> AsyncIterator[tuple[ScriptServer, Peer, dict[str, Any]]]:
    """A gateway in a process of its own on the ledger tools' settings in ``tmp_path``
    (a handler or the test kills it), and a session on it (``hello`` fields): the
    server, the session's peer and its welcome."""
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        connect(f"ws://127.0.0.1:{first.port}/", subprotocols=[SUB]) as ws,
    ):
        a = Peer(ws)
        yield first, a, await a.hello(**hello)


def resumed_on(gw: Gateway, welcome: dict[str, Any], **hello: Any) -> Any:
    """The session of ``welcome`` resumed on ``gw`` from its welcome's `last_seq` (a
    :func:`tests.support.peer` context)."""
    return peer(
        gw,
        session_id=welcome["session_id"],
        resume_token=welcome["resume_token"],
        last_seq=welcome["last_seq"],
        **hello,
    )


async def crash_and_resume(
    tmp_path: Path,
    tool: str,
    options: dict[str, str] | None,
    decide: str | None = None,
    before_restart: Callable[[], None] | None = None,
) -> tuple[list[dict[str, Any]], list[tuple[str, ...]]]:
    """Start ``tool`` (call `x1`) on a server in its own process whose handler SIGKILLs
    it (after ``decide`` on its approval, if given); return the call's events the
    resumed session gets on the next server (a replay from its welcome's `last_seq`), up
    to the terminal one, and the call's ledger rows as the killed process left the file
    (``before_restart`` looks at the files then too)."""
    settings = lt.ledger_settings(tmp_path)
    db = settings.data_dir / "toolbus.db"
    hello: dict[str, Any] = {} if options is None else {"options": options}
    async with own_process(tmp_path, **hello) as (first, a, welcome):
        await a.invoke("x1", tool, CHARGE)
        if decide is not None:
            start = await a.expect("tool_start", call_id="x1")
            await a.send(
                {"type": "tool.confirm", "approval_id": start["approval_id"], "decision": decide}
            )
        assert await first.proc.wait() == -9
    left = committed_ledger(db, "x1")
    if before_restart is not None:
        before_restart()
    seen: list[dict[str, Any]] = []
    async with running(settings) as gw, resumed_on(gw, welcome, **hello) as resumed:
        assert resumed.welcome["resumed"] is True
        await resumed.terminal("x1")
        seen = [m for m in resumed.seen if m.get("call_id") == "x1"]
    assert lt.runs(settings.data_dir) == ["x1 100"]
    return seen, left


@asynccontextmanager
async def failing_gateway(settings: Any, db: Path) -> AsyncIterator[tuple[Gateway, Any]]:
    """A gateway on the store ``db`` whose commits the test fails at will
    (:class:`FailingCommits`); the ledger tools' gates are opened before the drain."""
    store = FailingCommits(SqliteStore(db))
    gw = Gateway(settings, store=store)  # type: ignore[arg-type]
    await gw.start()
    try:
        yield gw, store
    finally:
        lt.GATE.release.set()
        lt.GATE.jobs.set()
        await gw.drain()


def journal_call_ids(db: Path) -> list[str]:
    """The call ids of the intent entries in the store's journal, in order (batch
    entries, objects, are left out)."""
    journal = Path(str(db) + SUFFIX).read_bytes()
    entries = [orjson.loads(line) for line in journal.split(b"\n") if line]
    return [entry[1] for entry in entries if isinstance(entry, list)]


def journaled_writes(db: Path) -> list[list[Any]]:
    """The writes of the batch entries in the store's journal (flushes journaled instead
    of committed, SPEC D1), in order."""
    journal = Path(str(db) + SUFFIX).read_bytes()
    entries = [orjson.loads(line) for line in journal.split(b"\n") if line]
    return [write for entry in entries if isinstance(entry, dict) for write in entry["writes"]]


def leave_journal(db: Path, entries: list[Intent]) -> None:
    """A store's file ``db`` (created if missing) and a journal holding ``entries``, as a
    killed process leaves them."""
    SqliteStore(db).close()
    Path(str(db) + SUFFIX).write_bytes(b"".join(entry.encode() for entry in entries))


def put_back(db: Path, call_id: str, created_at: float) -> bool:
    """Whether a store opened on ``db`` has alice's ``call_id`` (tool `t`, created at
    ``created_at``) as a `running` ledger row: put back from the journal."""
    store = SqliteStore(db)
    try:
        row = store.ledger("", "alice", call_id)
    finally:
        store.close()
    return row == LedgerRow("", "alice", call_id, "t", "h", "running", None, created_at)


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
    """SPEC I15, D3: in a session that asked for `tool_start: gated`, the handler starts
    with its rows only in the journal, and the process is SIGKILLed before any commit.
    The next server puts the rows back: the resumed session gets the call's
    `cancelled`, a re-send from a new session of the principal gets the same recorded
    outcome, and the tool ran once."""
    settings = lt.ledger_settings(tmp_path)
    db = settings.data_dir / "toolbus.db"
    async with own_process(tmp_path, options=GATED_ONLY) as (first, a, welcome):
        await a.invoke("k1", "crash_charge", CHARGE)
        assert await first.proc.wait() == -9
    assert lt.runs(settings.data_dir) == ["k1 100"]
    # The precondition of this test: nothing of the call was committed, the journal
    # alone holds it.
    assert committed_ledger(db, "k1") == []
    assert journal_call_ids(db) == ["k1"]
    async with running(settings) as gw:
        assert journal_call_ids(db) == []
        async with resumed_on(gw, welcome) as resumed:
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
    db = settings.data_dir / "toolbus.db"
    async with failing_gateway(settings, db) as (gw, store), peer(gw, options=GATED_ONLY) as p:
        store.failing = True
        await p.invoke("j1", "held_async", CHARGE)
        await wait_until(lambda: lt.runs(settings.data_dir) == ["j1 100"], "started")
        lt.GATE.jobs.set()
        await wait_until(lambda: gw.outbox.held > 0, "result held")
        assert committed_ledger(db, "j1") == []
        store.failing = False
        answer = await p.terminal("j1")
        assert (answer["type"], answer["result"]) == ("result", {"charged": 100})
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


def test_i15_a_second_store_on_the_file_is_refused(tmp_path: Path) -> None:
    """One store writes a SQLite file (review of issue 13's change): the first store's
    `running` rows may be only in its journal, so a second store on the same file could
    not see a call running there and would run a re-send again (SPEC I15). The second
    open fails with a `StoreError` that says so; once the first closed, the file opens."""
    db = tmp_path / "toolbus.db"
    first = SqliteStore(db)
    try:
        with pytest.raises(StoreError) as refused:
            SqliteStore(db)
    finally:
        first.close()
    assert str(refused.value) == (
        f"{db}: in use by another store (it holds toolbus.db-intent); "
        "one store may write a SQLite file"
    )
    SqliteStore(db).close()


HOLDER = """
import sys
from gateway.store import SqliteStore
store = SqliteStore(sys.argv[1])
print("open", flush=True)
sys.stdin.read()
store.close()
"""


def test_i15_a_store_in_another_process_holds_the_file(tmp_path: Path) -> None:
    """The journal's lock is ``flock``, which other processes see: while a server
    process has the store open, a store here is refused; once that process exited (its
    lock went with it), the file opens."""
    db = tmp_path / "toolbus.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db)],
        cwd=Path(__file__).resolve().parents[2],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"open\n"
        with pytest.raises(StoreError, match="in use by another store"):
            SqliteStore(db)
    finally:
        holder.communicate(b"", timeout=30)
    assert holder.returncode == 0
    SqliteStore(db).close()


def test_i15_a_journaled_call_whose_rows_were_committed_is_not_put_back(tmp_path: Path) -> None:
    """A crash between a commit and the journal's truncate leaves entries of committed
    calls: the next open keeps the committed row (here `done`) as it is, and puts back
    only the call the file lacks."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    store.stage_ledger(LedgerRow("", "alice", "done1", "t", "h", "done", b"{}", 1.0))
    store.commit()
    store.close()
    leave_journal(
        db,
        [
            Intent("s1", "done1", None, "", "alice", "t", "h", 1.0),
            Intent("s1", "new1", '{"tool":"t"}', "", "alice", "t", "h", 2.0),
        ],
    )
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
    """SPEC I15, D6: the journal is a device (``/dev/full``), not a file: the store
    opens none, the call's rows are committed before its handler instead, and when that
    commit fails the call ends `unavailable` and the tool does not run."""
    lt.reset()
    settings = lt.ledger_settings(tmp_path)
    db = settings.data_dir / "toolbus.db"
    os.makedirs(db.parent, exist_ok=True)
    os.symlink("/dev/full", str(db) + SUFFIX)
    async with failing_gateway(settings, db) as (gw, store), peer(gw, options=GATED_ONLY) as p:
        store.failing = True
        await p.invoke("u1", "held_charge", CHARGE)
        await wait_until(lambda: gw.outbox.held > 0, "terminal held")
        store.failing = False
        answer = await p.terminal("u1")
        assert (answer["type"], answer["code"]) == ("call.error", ErrorCode.UNAVAILABLE)
        assert answer["message"] == "the store cannot commit right now; the tool did not run"
    assert lt.runs(settings.data_dir) == []


async def test_j6_a_job_start_whose_group_commit_fails_does_not_run(tmp_path: Path) -> None:
    """SPEC J5, J6, D6: where a flush is a commit (no journal: here a device, as on
    PostgreSQL), a job's `running` row waits for the turn's group commit before its
    handler starts; when that commit fails the job ends `failed` `unavailable` and its
    handler never ran."""
    gate = lt.reset()
    settings = lt.ledger_settings(tmp_path)
    db = settings.data_dir / "toolbus.db"
    os.makedirs(db.parent, exist_ok=True)
    os.symlink("/dev/full", str(db) + SUFFIX)
    async with failing_gateway(settings, db) as (gw, store), peer(gw, options=GATED_ONLY) as p:
        gate.outbox = gw.outbox
        assert not gw.store.journals
        store.failing = True
        await p.invoke("j1", "held_job")
        await wait_until(lambda: gw.outbox.held > 0, "dispatched held")
        store.failing = False
        job_id = (await p.expect("dispatched", call_id="j1"))["job_id"]
        failed = await p.expect("job.failed", job_id=job_id)
    assert failed["error"] == {
        "code": "unavailable",
        "message": "the store cannot commit right now; the tool did not run",
    }
    assert gate.queued == []


def test_i15_a_locked_file_at_open_keeps_the_journal_for_the_next_start(tmp_path: Path) -> None:
    """SPEC D6 at start: another connection holds the file's write lock past the open's
    5 s wait. The open fails with a `StoreError` that says so (not the damage message,
    which advises moving the file away), the journal keeps its entry, and once the
    lock is gone the next open puts the call back."""
    db = tmp_path / "toolbus.db"
    entry = Intent("s1", "late1", None, "", "alice", "t", "h", 3.0)
    leave_journal(db, [entry])
    journal_path = Path(str(db) + SUFFIX)
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
    assert put_back(db, "late1", 3.0)


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


async def test_a6_a_session_with_ungated_tool_start_finds_it_after_a_crash(
    tmp_path: Path,
) -> None:
    """SPEC A6, I15, D1: a session that gets every `tool_start` has it durable before
    the handler, with the call's `running` rows (no intent entry for its calls: the
    flush that sends the `tool_start` journals them all in one batch entry): killed
    right after the start, the file has no row of the call, and the resumed session
    gets the `tool_start`, then the restart's `cancelled`."""
    db = lt.ledger_settings(tmp_path).data_dir / "toolbus.db"
    journaled: list[list[Any]] = []
    seen, left = await crash_and_resume(
        tmp_path,
        "crash_charge",
        None,
        before_restart=lambda: journaled.extend(journaled_writes(db)),
    )
    assert left == []
    assert [(w[4], w[6]) for w in journaled if w[0] == "l" and w[3] == "x1"] == [
        ("crash_charge", "running")
    ]
    events = [orjson.loads(w[3]) for w in journaled if w[0] == "e"]
    assert [(e["type"], e["call_id"]) for e in events if e.get("call_id")] == [("tool_start", "x1")]
    assert [(m["type"], m.get("call_id")) for m in seen] == [
        ("tool_start", "x1"),
        ("call.error", "x1"),
    ]
    assert (seen[1]["code"], seen[1]["message"]) == (ErrorCode.CANCELLED, RESTARTED)


async def _allowed_then_killed(tmp_path: Path, tool: str) -> list[tuple[str, ...]]:
    """Call the gated ``tool`` (its handler SIGKILLs the server), allow it, resume on the
    next server: the session gets `tool_start`, `tool.resolved` `allowed` by the user,
    then `cancelled`. Returns the call's ledger rows the killed process committed."""
    seen, left = await crash_and_resume(tmp_path, tool, GATED_ONLY, decide="allow")
    kinds = [(m["type"], m.get("resolution"), m.get("reason")) for m in seen]
    assert kinds == [
        ("tool_start", None, None),
        ("tool.resolved", "allowed", "user"),
        ("call.error", None, None),
    ]
    assert (seen[2]["code"], seen[2]["message"]) == (ErrorCode.CANCELLED, RESTARTED)
    return left


async def test_a3_an_allowed_call_killed_in_its_handler_stays_allowed(tmp_path: Path) -> None:
    """SPEC A3, A6, I15: a gated call's ledger row went to the journal at admission
    and its `tool_start` was committed before it was sent; after the user's `allow` its
    handler starts only once the approval's outcome is committed too, so the process
    killed in the handler leaves `allowed` by the user, and the resumed session gets
    that `tool.resolved`, then `cancelled`; never `denied`."""
    left = await _allowed_then_killed(tmp_path, "crash_gated")
    assert left == []  # the journal alone kept the ledger row


async def test_a3_an_allowed_idempotent_call_killed_in_its_handler_stays_allowed(
    tmp_path: Path,
) -> None:
    """SPEC A3, A6 (found in review): a tool declared idempotent needs no ledger row
    before its handler, but the user's decision still is committed first: killed in
    the handler, the resumed session gets `tool.resolved` `allowed` by the user, then
    `cancelled`."""
    await _allowed_then_killed(tmp_path, "crash_gated_idempotent")


def test_i15_a_key_used_again_after_its_window_is_put_back_over_the_old_row(
    tmp_path: Path,
) -> None:
    """SPEC I15: a call id used again after its window, before the purge deleted the
    old row, runs anew; killed before its commit, the journal puts the new run back over
    the old row, so a re-send finds it (and recovery ends it) instead of running it a
    second time."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    store.stage_ledger(LedgerRow("", "alice", "X", "t", "h", "done", b"{}", 1000.0))
    store.commit()
    store.close()
    leave_journal(db, [Intent("s2", "X", '{"tool":"t"}', "", "alice", "t", "h", 1000.0 + 86_430)])
    reopened = SqliteStore(db)
    try:
        assert reopened.ledger("", "alice", "X") == LedgerRow(
            "", "alice", "X", "t", "h", "running", None, 1000.0 + 86_430
        )
        assert reopened.running_ledger() == [reopened.ledger("", "alice", "X")]
    finally:
        reopened.close()


def test_i15_a_journal_that_is_not_a_file_is_not_used(tmp_path: Path) -> None:
    """A device is no journal: `/dev/null` would take every append and keep nothing.
    The store opens none and commits a call's rows before its handler."""
    db = tmp_path / "toolbus.db"
    os.symlink("/dev/null", str(db) + SUFFIX)
    store = SqliteStore(db)
    try:
        store.stage_call("s1", "c1", "running", b'{"tool":"t"}')
        store.stage_ledger(LedgerRow("", "alice", "c1", "t", "h", "running", None, 1.0))
        assert store.keep_intent("s1", "c1", ("", "alice", "c1")) is False
    finally:
        store.close()


def test_i15_a_failed_append_answers_false_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The kernel refuses the write (`/dev/full`: ENOSPC): `append` answers False, so
    the caller commits instead; the failure is logged once, not per call."""
    journal = IntentJournal(Path("/dev/full"))
    entry = Intent("s1", "c1", None, "", "alice", "t", "h", 1.0)
    try:
        with caplog.at_level("WARNING", logger="gateway.store"):
            assert journal.append(entry) is False
            assert journal.append(entry) is False
    finally:
        journal.close()
    failures = [r.getMessage() for r in caplog.records if "append failed" in r.getMessage()]
    refused = "[Errno 28] No space left on device"
    assert failures == [f"/dev/full: intent journal append failed (commits instead): {refused}"]


def test_i15_a_line_of_the_wrong_shape_is_skipped(tmp_path: Path) -> None:
    """A line that parses as JSON with the wrong field types (a damaged or foreign file)
    is skipped like a torn one, not a crash at start."""
    path = tmp_path / ("db" + SUFFIX)
    whole = Intent("s1", "c1", None, "", "alice", "t", "h", 1.0)
    path.write_bytes(
        b'\n["s1","c0",7,"","alice","t","h",1.0]\n'
        + b'\n["s1","c0",null,"","alice","t","h",true]\n'
        + whole.encode()
    )
    journal = IntentJournal(path)
    try:
        assert journal.read() == [whole]
    finally:
        journal.close()


def test_d6_no_call_starts_on_the_journal_after_a_failed_commit(tmp_path: Path) -> None:
    """SPEC D6: another connection holds the write lock, so a commit (here the purge's)
    fails; until a commit succeeds again, a call's rows are not journaled (the caller
    commits first, and that commit fails: the handler does not start)."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        store.stage_call("s1", "c1", "running", b'{"tool":"t"}')
        store.stage_ledger(LedgerRow("", "alice", "c1", "t", "h", "running", None, 1.0))
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError, match="database is locked"):
            store.commit()
        assert store.keep_intent("s1", "c1", ("", "alice", "c1")) is False
        holder.execute("ROLLBACK")
        store.commit()
        store.stage_call("s1", "c2", "running", b'{"tool":"t"}')
        store.stage_ledger(LedgerRow("", "alice", "c2", "t", "h", "running", None, 2.0))
        assert store.keep_intent("s1", "c2", ("", "alice", "c2")) is True
    finally:
        holder.close()
        store.close()


def committed_call(db: Path, session_id: str, call_id: str) -> list[tuple[str, ...]]:
    """The session's committed call rows of ``call_id`` (state)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT state FROM calls WHERE session_id=? AND call_id=?", (session_id, call_id)
        ).fetchall()
    conn.close()
    return rows


def session_row(session_id: str) -> SessionRow:
    return SessionRow(session_id, "h", "alice", None, "demo", {}, {}, [], 0, 0, 0, 1.0, None, None)


def journaled(store: SqliteStore, session_id: str, call_id: str, created_at: float) -> None:
    """Admit ``call_id`` as the gateway does (running rows staged) and journal it."""
    key = ("", "alice", call_id)
    store.stage_call(session_id, call_id, "running", b'{"tool":"t"}')
    store.stage_ledger(LedgerRow(*key, "t", "h", "running", None, created_at))
    assert store.keep_intent(session_id, call_id, key) is True


def test_i15_a_journaled_running_row_is_written_only_when_the_journal_is_emptied(
    tmp_path: Path,
) -> None:
    """SPEC I15 (issue 13): the journal holds a call's `running` rows, so ordinary
    commits leave them out. A call that ends first writes only its ended rows; one
    still running when a commit empties the journal (here a ledger purge's) has its
    `running` rows written by that commit, before the truncate. The store's own reads
    see the held row all along."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    try:
        store.stage_session(session_row("s1"))
        journaled(store, "s1", "ends", 1.0)
        journaled(store, "s1", "runs", 2.0)
        store.commit()
        assert (committed_ledger(db, "ends"), committed_ledger(db, "runs")) == ([], [])
        assert committed_call(db, "s1", "runs") == []
        held = LedgerRow("", "alice", "runs", "t", "h", "running", None, 2.0)
        assert store.ledger("", "alice", "runs") == held
        store.stage_ledger(LedgerRow("", "alice", "ends", "t", "h", "done", b"{}", 1.0))
        store.stage_call("s1", "ends", "done", b"{}")
        store.commit()
        assert committed_ledger(db, "ends") == [("done", "t")]
        assert journal_call_ids(db) == ["ends", "runs"]
        store.purge_ledger(0.0)
        assert committed_ledger(db, "runs") == [("running", "t")]
        assert committed_call(db, "s1", "runs") == [("running",)]
        assert journal_call_ids(db) == []
    finally:
        store.close()


def test_i15_a_held_call_row_of_an_ended_session_is_never_written(tmp_path: Path) -> None:
    """SPEC D2, I15: the session of a journaled call ends while the call runs; the
    commit that empties the journal writes the call's ledger row (the principal's
    key outlives the session) but not the ended session's call row."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    try:
        store.stage_session(session_row("s1"))
        store.commit()
        journaled(store, "s1", "c1", 1.0)
        store.delete_session("s1")
        store.commit()
        store.purge_ledger(0.0)
        assert committed_ledger(db, "c1") == [("running", "t")]
        assert committed_call(db, "s1", "c1") == []
    finally:
        store.close()


def test_d6_a_failed_commit_that_would_empty_the_journal_keeps_it(tmp_path: Path) -> None:
    """SPEC D6, I15: the commit that would write the held rows and empty the journal
    (here at close) fails on another connection's write lock: the journal keeps its
    entry, and the next open puts the call back."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    journaled(store, "s1", "c1", 1.0)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        store.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert journal_call_ids(db) == ["c1"]
    assert committed_ledger(db, "c1") == []
    assert put_back(db, "c1", 1.0)


async def test_i15_a_call_running_across_other_commits_comes_back_from_the_journal(
    tmp_path: Path,
) -> None:
    """SPEC I15, D1 (issue 13): a call journaled at admission keeps running while
    another call of the session ends (its terminal event reached the client, so it was
    journaled or committed after the first call's entry), then the server is
    SIGKILLed: the running call is in the journal or committed `running`, the next
    server ends it `cancelled` for the resumed session and has the other call's ended
    row; the tool ran once."""
    settings = lt.ledger_settings(tmp_path)
    db = settings.data_dir / "toolbus.db"
    async with own_process(tmp_path, options=GATED_ONLY) as (first, a, welcome):
        await a.invoke("h1", "held_async", CHARGE)
        await wait_until(lambda: lt.runs(settings.data_dir) == ["h1 100"], "started")
        await a.invoke("q1", "bad_value", {"kind": "no such kind"})
        ended = await a.terminal("q1")
        assert (ended["type"], ended["code"]) == ("call.error", ErrorCode.HANDLER_ERROR)
        await first.crash()
    # Either the file has q1's ended rows (the commit that owed them ran, SPEC D1) and
    # h1's `running` rows, or the journal still holds both: nothing of either is lost.
    assert "h1" in journal_call_ids(db) or committed_ledger(db, "h1") == [("running", "held_async")]
    async with running(settings) as gw, resumed_on(gw, welcome) as resumed:
        answer = await resumed.terminal("h1")
        assert (answer["type"], answer["code"], answer["message"]) == (
            "call.error",
            ErrorCode.CANCELLED,
            RESTARTED,
        )
    assert committed_ledger(db, "q1") == [("done", "bad_value")]
    assert lt.runs(settings.data_dir) == ["h1 100"]


def test_i15_running_durable_says_yes_only_for_a_journaled_or_committed_row(
    tmp_path: Path,
) -> None:
    """SPEC I15, D6: a handler may start without a commit when its `running` ledger row
    is journaled or was written by a commit since it was staged; not while the row is
    only staged, not while the last commit failed (here on another connection's write
    lock), and never on a store without a journal (`:memory:`)."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    holder = sqlite3.connect(db, isolation_level=None)

    def stage(call_id: str) -> tuple[str, str, str]:
        key = ("", "alice", call_id)
        store.stage_call("s1", call_id, "running", b'{"tool":"t"}')
        store.stage_ledger(LedgerRow(*key, "t", "h", "running", None, 1.0))
        return key

    try:
        holder.execute("BEGIN IMMEDIATE")
        c1 = stage("c1")
        with pytest.raises(StoreError, match="database is locked"):
            store.commit()
        assert store.keep_intent("s1", "c1", c1) is False
        assert store.running_durable(c1) is False
        holder.execute("ROLLBACK")
        store.commit()
        assert committed_ledger(db, "c1") == [("running", "t")]
        assert store.running_durable(c1) is True
        c2 = stage("c2")
        assert store.running_durable(c2) is False
        assert store.keep_intent("s1", "c2", c2) is True
        assert store.running_durable(c2) is True
        c3 = stage("c3")  # never journaled: a session that gets ungated tool_start
        assert store.running_durable(c3) is False
    finally:
        holder.close()
        store.close()
    memory = SqliteStore(":memory:")
    try:
        key = ("", "alice", "m1")
        memory.stage_ledger(LedgerRow(*key, "t", "h", "running", None, 1.0))
        memory.commit()
        assert memory.running_durable(key) is False
    finally:
        memory.close()


def test_i15_an_entry_older_than_the_window_is_not_put_back(tmp_path: Path) -> None:
    """SPEC I15, I12 (review of issue 13's change): an entry can outlive its call's
    ledger row (a truncate failed, then a ledger purge deleted the row). At open, an
    entry older than the ledger's window is skipped: its call id is new again, and
    putting it back would bring a long-finished call back `running` and end it a second
    time for its session. A fresh entry is still put back."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    store.stage_session(session_row("s1"))
    store.commit()
    store.close()
    now = time.time()
    old = Intent("s1", "old1", '{"tool":"t"}', "", "alice", "t", "h", now - 7200)
    new = Intent("s1", "new1", '{"tool":"t"}', "", "alice", "t", "h", now - 60)
    leave_journal(db, [old, new])
    reopened = SqliteStore(db, ledger_window=3600)
    try:
        assert (reopened.ledger("", "alice", "old1"), reopened.call("s1", "old1")) == (None, None)
        assert reopened.ledger("", "alice", "new1") == LedgerRow(
            "", "alice", "new1", "t", "h", "running", None, now - 60
        )
        assert reopened.call("s1", "new1") == ("running", b'{"tool":"t"}')
    finally:
        reopened.close()


async def test_i15_the_server_replays_within_its_call_id_window(tmp_path: Path) -> None:
    """The gateway opens its store with `calls.call_id_window`: a leftover entry two
    days old (the default window is one day) is not put back, so a new call may use its
    id and runs."""
    lt.reset()
    settings = lt.ledger_settings(tmp_path)
    db = settings.data_dir / "toolbus.db"
    leave_journal(
        db, [Intent("s-gone", "w1", None, "", "alice", "held_async", "h", time.time() - 172_800)]
    )
    async with running(settings) as gw, peer(gw, options=GATED_ONLY) as p:
        assert committed_ledger(db, "w1") == []
        lt.GATE.jobs.set()
        await p.invoke("w1", "held_async", CHARGE)
        answer = await p.terminal("w1")
        assert (answer["type"], answer["result"]) == ("result", {"charged": 100})
    assert lt.runs(settings.data_dir) == ["w1 100"]
