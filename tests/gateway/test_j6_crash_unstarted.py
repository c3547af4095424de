"""A sync call still waiting for a worker thread when the server process is killed
never ran, and after the restart it says so; one whose handler started is reported
cut off while it ran (SPEC J6, I12, I15, D3).

The server runs in a process of its own (``SERVER_SCRIPT``) with one worker thread for
calls, and is killed with SIGKILL, as ``test_restart.py`` does; the next server starts
in this process on the same data folder (SQLite) or the same schema (PostgreSQL). Each
run of a handler appends its call id to a file in the data folder (the count survives
the kill); a handler holds its thread until the ``let_go`` tool releases it, so no test
sleeps to order events. The kill comes once the store holds the waiting call as not
started (polled: the SQLite file and its journal, or the PostgreSQL table), which is
the durable record a restart reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sqlite3
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import psycopg

from gateway.context import ToolContext
from gateway.server import Gateway
from gateway.store_journal import SUFFIX
from gateway.store_pg_batch import cid
from protocol.errors import ErrorCode
from tests.gateway.store_faults import until
from tests.pg_support import store_backend  # noqa: F401 (fixture: SQLite, PostgreSQL)
from tests.support import (
    MS,
    WAIT,
    Peer,
    barrier,
    peer,
    peer_at,
    resume_fields,
    running,
    script_server,
    settings_for,
)

HOLD_TOOLS = """
  - name: hold
    description: A plain handler that notes its run, then holds its worker thread until
      let_go releases it.
    capability: t.crash
    timeout: 0
    handler: tests.gateway.test_j6_crash_unstarted:hold
  - name: let_go
    description: Releases the hold of the call named by call_id.
    capability: t.crash
    handler: tests.gateway.test_j6_crash_unstarted:let_go
    parameters:
      type: object
      properties:
        call_id: {type: string}
      required: [call_id]
"""
"""Catalog entries of the thread-holding handler and its release, shared with
``tests/gateway/test_j6_crash_promoted.py``."""

TOOLS = (
    "\ntools:"
    + HOLD_TOOLS
    + """  - name: die_at_start
    description: A plain handler that notes its run, then kills its own process with
      SIGKILL before anything else (no commit can run between its start and the kill).
    capability: t.crash
    handler: tests.gateway.test_j6_crash_unstarted:die_at_start
  - name: hold_fifo
    description: A plain handler that notes its run, then holds its worker thread until
      the test writes to the FIFO release-<call id> in the data folder.
    capability: t.crash
    timeout: 0
    handler: tests.gateway.test_j6_crash_unstarted:hold_fifo
  - name: gated_hold
    description: hold, behind the user's approval.
    capability: t.crash
    requires_approval: true
    timeout: 0
    handler: tests.gateway.test_j6_crash_unstarted:hold
  - name: gated_die
    description: die_at_start, behind the user's approval.
    capability: t.crash
    requires_approval: true
    handler: tests.gateway.test_j6_crash_unstarted:die_at_start
  - name: gated_job_die
    description: An idempotent job behind the user's approval whose handler kills its
      process at its first start (a re-run after the restart, SPEC J5, just ends).
    capability: t.crash
    mode: async
    idempotent: true
    requires_approval: true
    handler: tests.gateway.test_j6_crash_unstarted:die_once
"""
)
PROFILES = "profiles:\n  demo:\n    capabilities: [t.crash]\n"

RESTARTED = "the server restarted while this call ran"
UNSTARTED = "the server restarted before this call started; it did not run"
"""The wire texts a restart answers (SPEC J6): the call's handler had started, or not."""

_HOLDS: dict[str, threading.Event] = {}
"""The server process's holds, by call id (``let_go`` sets one)."""


def _hold(call_id: str) -> threading.Event:
    return _HOLDS.setdefault(call_id, threading.Event())


def _note(ctx: ToolContext) -> None:
    folder = Path(ctx.data_dir)
    folder.mkdir(parents=True, exist_ok=True)  # a PostgreSQL store makes none
    with (folder / "runs.txt").open("a") as f:
        f.write(ctx.call_id + "\n")


def hold(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    _note(ctx)
    _hold(ctx.call_id).wait(WAIT * 6)
    return {"held": ctx.call_id}


def hold_fifo(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    _note(ctx)
    (Path(ctx.data_dir) / f"release-{ctx.call_id}").read_text()  # until the test writes
    return {"held": ctx.call_id}


def die_at_start(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    _note(ctx)
    os.kill(os.getpid(), signal.SIGKILL)
    return {"survived": ctx.call_id}


def die_once(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    _note(ctx)
    marker = Path(ctx.data_dir) / f"died-{ctx.call_id}"
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return {"survived": ctx.call_id}


async def let_go(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    _hold(params["call_id"]).set()
    return {"released": params["call_id"]}


def crash_settings(tmp: Path, tools: str = TOOLS, **sections: Any) -> Any:
    """The same settings for the killed server and the next one: one worker thread for
    calls (a call waits while another holds it, up to a minute), data in ``tmp``; the
    store is SQLite, or PostgreSQL when ``TOOLBUS_STORE__URL`` says so."""
    return settings_for(
        tmp,
        catalog={
            "tools": [_written(tmp / "tools.yaml", tools)],
            "profiles": [_written(tmp / "profiles.yaml", PROFILES)],
            "hot_reload": False,
        },
        calls={
            "worker_threads": 1,
            "threads_per_session": 1,
            "threads_per_user": 1,
            "thread_wait": WAIT * 6,
            "default_timeout": 0,
        },
        **sections,
    )


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# A server in its own process, so that it can be killed without any chance to clean up.
SERVER_SCRIPT = """
import asyncio, sys
from asyncio.subprocess import PIPE
from pathlib import Path
from gateway.server import Gateway
from tests.gateway.test_j6_crash_unstarted import crash_settings

async def main():
    extra = {"sessions": {"resume_window": float(sys.argv[2])}} if sys.argv[2:] else {}
    gateway = Gateway(crash_settings(Path(sys.argv[1]), **extra))
    await gateway.start()
    print(gateway.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def runs(data_dir: Path) -> list[str]:
    """The call id of every handler run, in order, over both servers."""
    path = data_dir / "runs.txt"
    return path.read_text().splitlines() if path.exists() else []


class DurableLedger:
    """alice's ledger row of a call id as a restart would find it (SPEC I15): in the
    PostgreSQL table, or in the SQLite file and the writes its journal holds (the
    journal's are newer: the next open writes them first)."""

    def __init__(self, data_dir: Path, backend: str) -> None:
        self._db = data_dir / "toolbus.db"
        self._pg = None if backend == "sqlite" else psycopg.connect(backend, autocommit=True)

    def row(self, call_id: str) -> tuple[str, bytes | None] | None:
        """``(state, outcome)`` of the row, or ``None`` when nothing durable has it."""
        if self._pg is not None:
            found = self._pg.execute(
                "SELECT state, outcome FROM call_ledger WHERE call_id=%s", (cid(call_id),)
            ).fetchone()
            return None if found is None else (found[0], found[1] and bytes(found[1]))
        journaled = [
            (write[6], None if write[7] is None else write[7].encode())
            for write in self._journaled()
            if write[0] == "l" and write[3] == call_id
        ]
        if journaled:
            return journaled[-1]
        if not self._db.exists():
            return None
        with sqlite3.connect(self._db) as conn:
            found = conn.execute(
                "SELECT state, outcome FROM call_ledger WHERE call_id=?", (call_id,)
            ).fetchone()
        conn.close()
        return None if found is None else (found[0], found[1])

    def _journaled(self) -> list[list[Any]]:
        journal = Path(str(self._db) + SUFFIX)
        lines = journal.read_bytes().split(b"\n") if journal.exists() else []
        entries = []
        for line in lines:
            try:
                entries.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue  # empty, or an entry being appended right now
        return [w for entry in entries if isinstance(entry, dict) for w in entry["writes"]]

    def owed(self) -> bool:
        """Whether the SQLite journal holds writes whose commit is still owed (its
        ``settle_after`` timer runs); never on PostgreSQL."""
        return self._pg is None and bool(self._journaled())

    def unstarted(self, call_id: str) -> bool:
        """Whether the durable row says the call's handler has not started (SPEC J6)."""
        row = self.row(call_id)
        if row is None or row[0] != "running" or row[1] is None:
            return False
        outcome = orjson.loads(row[1])
        return bool(outcome["message"] == UNSTARTED)

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()


async def _decided_then_gone(
    tmp_path: Path, tool: str, decision: str
) -> tuple[Peer, dict[str, Any], dict[str, Any] | None]:
    """On a server process of its own, invoke the gated ``tool`` as `g1` and answer its
    approval ``decision``. ``allow``: the tool's handler kills the process at its start
    (waited for); ``deny``: the declined ``result`` is read, then the process is killed.
    Returns the peer, the `tool_start` and the declined result (``None`` for allow)."""
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        peer_at(f"ws://127.0.0.1:{first.port}/") as p,
    ):
        await p.invoke("g1", tool, {})
        start = await p.expect("tool_start", call_id="g1")
        confirm = {"type": "tool.confirm", "id": "r1", "approval_id": start["approval_id"]}
        await p.send({**confirm, "decision": decision})
        declined = None
        if decision == "deny":
            declined = await p.terminal("g1")
            await first.crash()
        async with asyncio.timeout(WAIT):
            await first.proc.wait()  # the handler killed it, or crash() did
    assert first.proc.returncode == -9
    return p, start, declined


def _error(message: dict[str, Any]) -> tuple[str, str, str]:
    return message["type"], message.get("code", ""), message.get("message", "")


async def test_j6_a_call_waiting_for_a_thread_at_a_crash_says_it_did_not_run(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, I12, I15, D3: `h1` holds the one worker thread and `c1` waits for it
    when the server is SIGKILLed. After the restart the resumed session gets, for `c1`,
    ``call.error`` ``unavailable`` "the server restarted before this call started; it
    did not run" (not the restart's ``cancelled`` "while this call ran"), and for `h1`,
    whose handler did start, that ``cancelled``; a re-send of each from a new session of
    the principal gets the same answer; neither runs again, and `c1` never ran."""
    settings = crash_settings(tmp_path)
    ledger = DurableLedger(settings.data_dir, store_backend)
    try:
        async with (
            script_server(SERVER_SCRIPT, str(tmp_path)) as first,
            peer_at(f"ws://127.0.0.1:{first.port}/") as p,
        ):
            await p.invoke("h1", "hold", {})
            await until(lambda: runs(settings.data_dir) == ["h1"], "h1 to hold the one thread")
            await p.invoke("c1", "hold", {})
            start = await p.expect("tool_start", call_id="c1")  # gates passed; waits
            await until(lambda: ledger.unstarted("c1"), "c1's wait recorded durably")
            await first.crash()
        assert first.proc.returncode == -9
    finally:
        ledger.close()
    assert runs(settings.data_dir) == ["h1"]
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, start["seq"])) as again:
            assert again.welcome["resumed"] is True
            ends = {m["call_id"]: m for m in [await again.terminal(c) for c in ("h1", "c1")]}
        assert _error(ends["c1"]) == ("call.error", ErrorCode.UNAVAILABLE, UNSTARTED)
        assert _error(ends["h1"]) == ("call.error", ErrorCode.CANCELLED, RESTARTED)
        async with peer(gw) as other:
            for call_id in ("c1", "h1"):
                await other.invoke(call_id, "hold", {})
                answer = await other.terminal(call_id)
                assert _error(answer) == _error(ends[call_id]), answer
    assert runs(settings.data_dir) == ["h1"]


async def test_j6_a_call_that_waited_then_started_is_reported_cut_off_while_it_ran(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, I15: `c1` waits for the thread `h1` holds (recorded as not started),
    then `h1` is let go; `c1` gets the thread and its handler kills the server at its
    very start. The handler ran, so the record that it started was durable before it
    did: after the restart `c1` answers ``cancelled`` "the server restarted while this
    call ran", to the resumed session and to a re-send, and it does not run again."""
    settings = crash_settings(tmp_path)
    ledger = DurableLedger(settings.data_dir, store_backend)
    try:
        async with (
            script_server(SERVER_SCRIPT, str(tmp_path)) as first,
            peer_at(f"ws://127.0.0.1:{first.port}/") as p,
        ):
            await p.invoke("h1", "hold", {})
            await until(lambda: runs(settings.data_dir) == ["h1"], "h1 to hold the one thread")
            await p.invoke("c1", "die_at_start", {})
            start = await p.expect("tool_start", call_id="c1")
            await until(lambda: ledger.unstarted("c1"), "c1's wait recorded durably")
            await p.invoke("r1", "let_go", {"call_id": "h1"})
            async with asyncio.timeout(WAIT):
                await first.proc.wait()  # c1's handler killed it
        assert first.proc.returncode == -9
    finally:
        ledger.close()
    assert runs(settings.data_dir) == ["h1", "c1"]
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, start["seq"])) as again:
            assert again.welcome["resumed"] is True
            answer = await again.terminal("c1")
        assert _error(answer) == ("call.error", ErrorCode.CANCELLED, RESTARTED)
        async with peer(gw) as other:
            await other.invoke("c1", "die_at_start", {})
            assert _error(await other.terminal("c1")) == _error(answer)
    assert runs(settings.data_dir) == ["h1", "c1"]


def _thread_waiters(port: int) -> int:
    """The calls lane's waiters now, from the server's ``/metrics`` (SPEC O2)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as answer:
        text = answer.read().decode()
    found = re.search(r'toolbus_tracked\{kind="calls_thread_waiters"\} (\S+)', text)
    assert found is not None, "the waiters gauge"
    return int(float(found.group(1)))


async def test_j6_a_quiet_call_waiting_for_a_thread_is_recorded_durably(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, I12: a session that gets ``tool_start`` only for gated calls sends
    nothing when `c1` starts waiting for the thread `h1` holds, and nothing else happens
    on the server: the record that `c1` has not started still becomes durable at once,
    and after a SIGKILL the resumed session gets `c1` ``unavailable`` "did not run" (not
    ``cancelled`` "while this call ran", which it never did) and `h1` ``cancelled``."""
    settings = crash_settings(tmp_path)
    ledger = DurableLedger(settings.data_dir, store_backend)
    gated = {"options": {"tool_start": "gated"}}
    try:
        async with (
            script_server(SERVER_SCRIPT, str(tmp_path)) as first,
            peer_at(f"ws://127.0.0.1:{first.port}/", **gated) as p,
        ):
            await p.invoke("h1", "hold", {})
            await until(lambda: runs(settings.data_dir) == ["h1"], "h1 to hold the one thread")
            # SQLite: no commit the journal owes is pending (none would come by chance).
            await until(lambda: not ledger.owed(), "the journal's owed commit")
            await p.invoke("c1", "hold", {})
            async with asyncio.timeout(WAIT):  # another process's state: polled
                while await asyncio.to_thread(_thread_waiters, first.port) != 1:  # noqa: ASYNC110
                    await asyncio.sleep(MS)
            await until(lambda: ledger.unstarted("c1"), "c1's wait recorded durably")
            await first.crash()
        assert first.proc.returncode == -9
    finally:
        ledger.close()
    assert runs(settings.data_dir) == ["h1"]
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, 0), **gated) as again:
            assert again.welcome["resumed"] is True
            seen = await barrier(again)
        ends = {m["call_id"]: _error(m) for m in seen if m["type"] == "call.error"}
        assert ends == {
            "c1": ("call.error", ErrorCode.UNAVAILABLE, UNSTARTED),
            "h1": ("call.error", ErrorCode.CANCELLED, RESTARTED),
        }
    assert runs(settings.data_dir) == ["h1"]


async def test_j6_a_journaled_call_that_waited_then_started_gets_its_end_after_a_crash(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, I12, D3: in a session that gets ``tool_start`` only for gated calls (on
    SQLite its calls are journaled at admission), `c1` waits for the thread `h1` holds,
    gets it (`h1` let go, it ends) and kills the server at its handler's start. The
    resumed session gets, with no re-send, `c1`'s ``cancelled`` "while this call ran"."""
    settings = crash_settings(tmp_path)
    ledger = DurableLedger(settings.data_dir, store_backend)
    gated = {"options": {"tool_start": "gated"}}
    try:
        async with (
            script_server(SERVER_SCRIPT, str(tmp_path)) as first,
            peer_at(f"ws://127.0.0.1:{first.port}/", **gated) as p,
        ):
            await p.invoke("h1", "hold", {})
            await until(lambda: runs(settings.data_dir) == ["h1"], "h1 to hold the one thread")
            await p.invoke("c1", "die_at_start", {})
            await until(lambda: ledger.unstarted("c1"), "c1's wait recorded durably")
            await p.invoke("r1", "let_go", {"call_id": "h1"})
            async with asyncio.timeout(WAIT):
                await first.proc.wait()  # c1's handler killed it
        assert first.proc.returncode == -9
    finally:
        ledger.close()
    assert runs(settings.data_dir) == ["h1", "c1"]
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, 0), **gated) as again:
            assert again.welcome["resumed"] is True
            seen = await barrier(again)
        ends = {m["call_id"]: _error(m) for m in seen if m["type"] in ("call.error", "result")}
        assert ends["c1"] == ("call.error", ErrorCode.CANCELLED, RESTARTED)
        assert ends["h1"] == ("result", "", "")  # let go before c1 started
    assert runs(settings.data_dir) == ["h1", "c1"]


async def test_j6_a_call_waiting_for_its_approval_at_a_crash_says_it_did_not_run(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, A4, I12, I15: `g1` waits for its approval when the server is SIGKILLed
    (its `tool_start` was sent, so its pending note was durable: D1). Its handler never
    started, so after the restart the resumed session gets `tool.resolved` ``denied``
    ``disconnected``, then ``call.error`` ``unavailable`` "the server restarted before
    this call started; it did not run" (not the ``cancelled`` "while this call ran" of a
    call whose handler started); a re-send from the same session and from a new session
    of the principal gets that answer, and `g1` never runs."""
    settings = crash_settings(tmp_path)
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        peer_at(f"ws://127.0.0.1:{first.port}/") as p,
    ):
        await p.invoke("g1", "gated_hold", {})
        start = await p.expect("tool_start", call_id="g1")
        assert start["approval_id"]
        await first.crash()
    assert first.proc.returncode == -9
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, start["seq"])) as again:
            assert again.welcome["resumed"] is True
            seen = await barrier(again)
            await again.invoke("g1", "gated_hold", {})
            resent = await again.terminal("g1")
        assert [(m["type"], m.get("call_id")) for m in seen if "seq" in m] == [
            ("tool.resolved", "g1"),
            ("call.error", "g1"),
        ]
        resolved, ended = (m for m in seen if "seq" in m)
        assert (resolved["approval_id"], resolved["resolution"], resolved["reason"]) == (
            start["approval_id"],
            "denied",
            "disconnected",
        )
        assert _error(ended) == ("call.error", ErrorCode.UNAVAILABLE, UNSTARTED)
        assert _error(resent) == _error(ended)
        async with peer(gw) as other:
            await other.invoke("g1", "gated_hold", {})
            assert _error(await other.terminal("g1")) == _error(ended)
    assert runs(settings.data_dir) == []


async def test_j6_an_approved_call_whose_handler_started_at_a_crash_says_it_ran(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, A3, I15: `g1` waits for its approval; the user allows it and its handler
    kills the server at its very start. It ran: after the restart the resumed session
    and a re-send from another session of the principal get ``cancelled`` "the server
    restarted while this call ran", never "it did not run", and it does not run again."""
    settings = crash_settings(tmp_path)
    p, start, _ = await _decided_then_gone(tmp_path, "gated_die", "allow")
    assert runs(settings.data_dir) == ["g1"]
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, start["seq"])) as again:
            assert again.welcome["resumed"] is True
            answer = await again.terminal("g1")
            await again.invoke("g1", "gated_die", {})
            resent = await again.terminal("g1")
        assert _error(answer) == ("call.error", ErrorCode.CANCELLED, RESTARTED)
        assert _error(resent) == _error(answer)
        async with peer(gw) as other:
            await other.invoke("g1", "gated_die", {})
            assert _error(await other.terminal("g1")) == _error(answer)
    assert runs(settings.data_dir) == ["g1"]


async def test_j6_an_approved_job_whose_handler_started_at_a_crash_is_not_said_unstarted(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, A3: `g1`, an idempotent job behind approval, is allowed; its handler
    kills the server at its start. After the restart nothing may say `g1` "did not run"."""
    settings = crash_settings(tmp_path)
    p, start, _ = await _decided_then_gone(tmp_path, "gated_job_die", "allow")
    assert runs(settings.data_dir) == ["g1"]
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, start["seq"])) as again:
            assert again.welcome["resumed"] is True
            seen = await barrier(again)
            await again.invoke("g1", "gated_job_die", {})
            resent = await again.terminal("g1")
        assert all(m.get("message") != UNSTARTED for m in [*seen, resent]), [*seen, resent]


async def test_j6_a_denied_call_at_a_crash_keeps_its_declined_result(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, A5, I15: `g1` is denied just before the kill; after the restart a re-send
    from the session and from another of the principal gets the declined result."""
    settings = crash_settings(tmp_path)
    p, _, declined = await _decided_then_gone(tmp_path, "gated_hold", "deny")
    assert declined is not None
    assert declined["type"] == "result", declined
    assert declined["result"]["declined"], declined
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, declined["seq"])) as again:
            await again.invoke("g1", "gated_hold", {})
            resent = await again.terminal("g1")
        async with peer(gw) as other:
            await other.invoke("g1", "gated_hold", {})
            elsewhere = await other.terminal("g1")
    assert resent["result"] == declined["result"] == elsewhere["result"]
    assert runs(settings.data_dir) == []


async def test_j6_several_pending_approvals_at_a_crash_all_say_they_did_not_run(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, A4, I15: three calls wait for their approvals at the kill; each ends
    ``unavailable`` "did not run"; bob re-sending the same call id is not answered
    with alice's record (his own call runs: he has no approval for it, so it waits)."""
    settings = crash_settings(tmp_path)
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        peer_at(f"ws://127.0.0.1:{first.port}/") as p,
    ):
        for call_id in ("g1", "g2", "g3"):
            await p.invoke(call_id, "gated_hold", {})
            last = await p.expect("tool_start", call_id=call_id)
        await first.crash()
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, last["seq"])) as again:
            seen = await barrier(again)
        ends = {m["call_id"]: _error(m) for m in seen if m["type"] == "call.error"}
        assert ends == {
            c: ("call.error", ErrorCode.UNAVAILABLE, UNSTARTED) for c in ("g1", "g2", "g3")
        }
        async with peer(gw, token="bob-token") as bob:
            await bob.invoke("g2", "gated_hold", {})
            start = await bob.expect("tool_start", call_id="g2")
            assert start["approval_id"]
    assert runs(settings.data_dir) == []


def _durable_expiry(data_dir: Path, backend: str, session_id: str) -> float | None:
    """The ``expires_at`` of a session's row as a restart would read it."""
    if backend != "sqlite":
        with psycopg.connect(backend, autocommit=True) as db:
            found = db.execute(
                "SELECT expires_at FROM sessions WHERE session_id=%s", (session_id,)
            ).fetchone()
        return None if found is None else found[0]
    journaled = [
        w[13]
        for w in DurableLedger(data_dir, backend)._journaled()
        if w[0] == "s" and w[1] == session_id
    ]
    if journaled:
        return journaled[-1]
    db_file = data_dir / "toolbus.db"
    if not db_file.exists():
        return None
    with sqlite3.connect(db_file) as conn:
        found = conn.execute(
            "SELECT expires_at FROM sessions WHERE session_id=?", (session_id,)
        ).fetchone()
    conn.close()
    return None if found is None else found[0]


async def test_j6_a_call_waiting_for_approval_of_a_session_expired_at_the_restart(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, A4, I15: `g1` waits for its approval; its client goes away (the session
    is parked, resume window 1 s) and the server is SIGKILLed before the window ends.
    The next server starts after it ended: the session is gone, and a re-send of `g1`
    from the principal's next session gets ``unavailable`` "did not run" (its handler
    never started), not ``cancelled`` "while this call ran". SPEC I11: the restart
    writes `g1`'s one audit record, naming the expired session; the re-send, answered
    from the ledger, writes none."""
    from tests.gateway.tools_for_tests import audit_records

    window = 1.0
    settings = crash_settings(tmp_path, sessions={"resume_window": window})
    async with script_server(SERVER_SCRIPT, str(tmp_path), str(window)) as first:
        async with peer_at(f"ws://127.0.0.1:{first.port}/") as p:
            await p.invoke("g1", "gated_hold", {})
            await p.expect("tool_start", call_id="g1")
        sid = p.welcome["session_id"]
        # The park is staged; a commit for another session's call makes it durable.
        async with peer_at(f"ws://127.0.0.1:{first.port}/", token="bob-token") as q:
            async with asyncio.timeout(WAIT):
                n = 0
                while _durable_expiry(settings.data_dir, store_backend, sid) is None:
                    n += 1
                    await q.invoke(f"b{n}", "let_go", {"call_id": "none"})
                    await q.terminal(f"b{n}")
        await first.crash()
    expiry = _durable_expiry(settings.data_dir, store_backend, sid)
    assert expiry is not None
    async with asyncio.timeout(WAIT):
        while time.time() <= expiry:  # noqa: ASYNC110 - wall time must pass the expiry
            await asyncio.sleep(0.05)
    with audit_records() as records:
        async with running(settings) as gw:
            assert sid not in gw.sessions.sessions
            async with peer(gw) as other:
                await other.invoke("g1", "gated_hold", {})
                answer = await other.terminal("g1")
    assert _error(answer) == ("call.error", ErrorCode.UNAVAILABLE, UNSTARTED), answer
    assert runs(settings.data_dir) == []
    [record] = [r for r in records if r["call_id"] == "g1"]
    approval = record.pop("approval")
    assert (approval["resolution"], approval["reason"], approval["by"]) == (
        "denied",
        "disconnected",
        "server",
    )
    assert {k: v for k, v in record.items() if k != "ts"} == {
        "tool": "gated_hold",
        "outcome": "unavailable",
        "profile": "demo",
        "user": "alice",
        "session": sid,
        "call_id": "g1",
        "duration_ms": None,
        "params": None,
        "job_id": None,
        "code": "unavailable",
    }


# The crash server with its audit file (``data_dir/audit.jsonl``), as ``toolbus serve``.
AUDIT_SERVER_SCRIPT = """
import asyncio, sys
from asyncio.subprocess import PIPE
from pathlib import Path
from gateway import logs
from gateway.server import Gateway
from tests.gateway.test_j6_crash_unstarted import crash_settings

async def main():
    settings = crash_settings(Path(sys.argv[1]))
    logs.setup("warning", False, settings.data_dir / "audit.jsonl")
    gateway = Gateway(settings)
    await gateway.start()
    print(gateway.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _file_records(data_dir: Path) -> list[dict[str, Any]]:
    """The audit records a server process wrote to ``data_dir/audit.jsonl``."""
    path = data_dir / "audit.jsonl"
    lines = path.read_bytes().splitlines() if path.exists() else []
    return [orjson.loads(line) for line in lines if line.strip()]


async def test_i11_a_call_ended_while_commits_failed_is_audited_once_after_a_crash(
    tmp_path: Path,
) -> None:
    """SPEC I11, I12, D6: `h1`'s handler runs; the SQLite file is locked by another
    process and a commit fails; `h1` ends while commits fail, so its result is held
    (never sent unstored) and its end is not durable. The process is SIGKILLed after
    it wrote `h1`'s audit record; the restart ends `h1` ``cancelled``. The audit has
    exactly one record of `h1` over both processes, not the killed process's ``ok``
    and the restart's ``cancelled``."""
    from tests.gateway.test_j6_crash_decided import commits_failing, metric_above_zero
    from tests.gateway.tools_for_tests import audit_records

    settings = crash_settings(tmp_path)
    data_dir = settings.data_dir
    db = data_dir / "toolbus.db"
    release = data_dir / "release-h1"
    async with (
        script_server(AUDIT_SERVER_SCRIPT, str(tmp_path)) as first,
        peer_at(f"ws://127.0.0.1:{first.port}/") as p,
    ):
        os.mkfifo(release)
        await p.invoke("h1", "hold_fifo", {})
        start = await p.expect("tool_start", call_id="h1")
        await until(lambda: runs(data_dir) == ["h1"], "h1's handler to run")
        async with commits_failing(db, p, first.port):
            await asyncio.to_thread(release.write_text, "go")
            await metric_above_zero(first.port, 'toolbus_invocations_total{outcome="ok"}')
            # h1 ended there. An audit line it wrote would reach the file one batch
            # (BatchHandler.DELAY, 20 ms) later: give it ample time, then kill.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    while not any(r["call_id"] == "h1" for r in _file_records(data_dir)):  # noqa: ASYNC110
                        await asyncio.sleep(MS)
            seen = await barrier(p)
            assert not [m for m in seen if m.get("call_id") == "h1"], "h1's end was held"
            await first.crash()
    before = [r for r in _file_records(data_dir) if r["call_id"] == "h1"]
    with audit_records() as records:
        async with (
            running(settings) as gw,
            peer(gw, **resume_fields(p, start["seq"])) as again,
        ):
            assert again.welcome["resumed"] is True
            answer = await again.terminal("h1")
    after = [r for r in records if r["call_id"] == "h1"]
    assert _error(answer) == ("call.error", ErrorCode.CANCELLED, RESTARTED)
    outcomes = [r["outcome"] for r in before + after]
    assert len(outcomes) == 1, outcomes


async def test_i11_a_call_a_drain_cut_off_is_audited_once(tmp_path: Path) -> None:
    """SPEC I11, S4, J6: `drained1`'s handler holds its thread past
    ``server.drain_grace``; the drain closes the store with the call still running (its
    row stays ``running``), and the next start ends it ``cancelled``. One audit record
    of the call over both servers, the restart's (the drain's own ``cancelled``, its
    task's end after the store closed, was a second)."""
    from tests.gateway.tools_for_tests import audit_records

    settings = crash_settings(tmp_path)
    settings = settings.model_copy(
        update={"server": settings.server.model_copy(update={"drain_grace": 0.0})}
    )
    with audit_records() as records:
        gw = Gateway(settings)
        await gw.start()
        try:
            async with peer(gw) as p:
                await p.invoke("drained1", "hold", {})
                start = await p.expect("tool_start", call_id="drained1")
                await until(lambda: runs(settings.data_dir) == ["drained1"], "its handler to run")
                await gw.drain()
        finally:
            await gw.drain()
            _HOLDS.pop("drained1", threading.Event()).set()
        drained = [r["outcome"] for r in records if r["call_id"] == "drained1"]
        async with (
            running(settings) as gw2,
            peer(gw2, **resume_fields(p, start["seq"])) as again,
        ):
            assert again.welcome["resumed"] is True
            answer = await again.terminal("drained1")
    assert _error(answer) == ("call.error", ErrorCode.CANCELLED, RESTARTED)
    outcomes = [r["outcome"] for r in records if r["call_id"] == "drained1"]
    assert outcomes == ["cancelled"], (drained, outcomes)
