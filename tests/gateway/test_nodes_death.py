"""A node killed with SIGKILL loses nothing durable (SPEC N4): a live node of the same
store claims its work, with the code a restart runs, and the client resumes there."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
from websockets.asyncio.client import connect

from tests.gateway.node_tools import completed, nodes, runs, until
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import WAIT, Peer, barrier, resume_fields, sequenced

UNSTARTED = ("unavailable", "the server restarted before this call started; it did not run")
"""A call a dead node held pending approval never ran (SPEC J6): its code and text."""

SUB: Any = ["toolbus.v1"]


def _nodes(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as db:
        return [row[0] for row in db.execute("SELECT node_id FROM nodes ORDER BY node_id")]


async def _approved_job(p: Peer, call_id: str, tool: str, folder: Path) -> str:
    """Invoke ``tool`` in a session that confirms every call, allow it; its job id."""
    await p.invoke(call_id, tool, {"dir": str(folder)})
    start = await p.expect("tool_start", call_id=call_id)
    await p.send({"type": "tool.confirm", "approval_id": start["approval_id"], "decision": "allow"})
    dispatched = await p.terminal(call_id)
    assert dispatched["type"] == "dispatched"
    job_id: str = dispatched["job_id"]
    return job_id


async def test_n4_killed_node_work_is_taken_over_once(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N4, J5, A4, I12: node A dies by SIGKILL with an idempotent job and another
    job running and a call waiting for approval. Node B claims A's work within its
    lease bounds: the client resumes on B and gets, each once and gap-free, the pending
    approval resolved ``disconnected`` and its call ended ``unavailable`` (it never
    ran, J6), the other job ``failed`` ``interrupted``, and the idempotent job's
    ``job.done`` after B re-ran it; every handler completed once at most."""
    async with nodes(tmp_path, pg_url, "a", "b") as (a, b):
        async with connect(a.url, subprotocols=SUB) as ws_a:
            on_a = Peer(ws_a)
            await on_a.hello(options={"confirm_tool_calls": True})
            idem = await _approved_job(on_a, "j1", "idem_job", tmp_path)
            other = await _approved_job(on_a, "j2", "gated_job", tmp_path)
            await until(lambda: sorted(runs(tmp_path)) == ["j1", "j2"], "both jobs run on A")
            await on_a.invoke("c3", "gated_job", {"dir": str(tmp_path)})
            pending = await on_a.expect("tool_start", call_id="c3")
            last = max(msg["seq"] for msg in on_a.seen if "seq" in msg)
            killed = time.monotonic()
            a.proc.kill()
            await a.proc.wait()
            await until(lambda: _nodes(pg_url) == ["b"], "B claimed A's work")
            takeover = time.monotonic() - killed
            ws_a.transport.abort()
        async with connect(b.url, subprotocols=SUB) as ws_b:
            on_b = Peer(ws_b)
            welcome = await on_b.hello(**resume_fields(on_a, last))
            assert welcome["resumed"] is True
            resolved = await on_b.expect("tool.resolved", call_id="c3")
            assert (resolved["approval_id"], resolved["resolution"], resolved["reason"]) == (
                pending["approval_id"],
                "denied",
                "disconnected",
            )
            ended = await on_b.terminal("c3")
            assert (ended["type"], ended["code"], ended["message"]) == ("call.error", *UNSTARTED)
            failed = await on_b.expect("job.failed", job_id=other)
            assert failed["error"]["code"] == "interrupted"
            await until(lambda: runs(tmp_path).count("j1") == 2, "j1 re-run on B")
            (tmp_path / "go-j1").touch()
            await on_b.expect("job.done", job_id=idem)
            await barrier(on_b)
    seqs = [msg["seq"] for msg in on_b.seen if "seq" in msg]
    assert seqs == list(range(last + 1, last + 1 + len(seqs)))
    kinds = [msg["type"] for msg in on_b.seen if "seq" in msg]
    for kind in ("tool.resolved", "call.error", "job.failed", "job.done"):
        assert kinds.count(kind) == 1, kinds
    assert sorted(runs(tmp_path)) == ["j1", "j1", "j2"]  # j1: cut off on A, re-run on B
    assert completed(tmp_path) == ["j1"]
    print(f"takeover after SIGKILL: {takeover * 1000:.0f} ms")
    assert takeover < 1.0 + 2.0  # nodes.lease_ttl of the test nodes, plus a margin


async def test_n4_node_dying_after_the_session_moved_away_settles_its_work_once(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N4, N3, A4: a call waits for approval and a job runs on A; the client moves
    to B; A is killed. B, which holds the session, settles A's call (resolved
    ``disconnected``, ended ``unavailable``: it never ran, J6) and job (``failed``
    ``interrupted``), each once, live on the client's socket."""
    async with nodes(tmp_path, pg_url, "a", "b") as (a, b):
        async with connect(a.url, subprotocols=SUB) as ws_a:
            on_a = Peer(ws_a)
            await on_a.hello(options={"confirm_tool_calls": True})
            job = await _approved_job(on_a, "j1", "gated_job", tmp_path)
            await until(lambda: runs(tmp_path) == ["j1"], "j1 runs on A")
            await on_a.invoke("c2", "gated_job", {"dir": str(tmp_path)})
            pending = await on_a.expect("tool_start", call_id="c2")
            last = max(msg["seq"] for msg in on_a.seen if "seq" in msg)
        async with connect(b.url, subprotocols=SUB) as ws_b:
            on_b = Peer(ws_b)
            assert (await on_b.hello(**resume_fields(on_a, last)))["resumed"] is True
            await barrier(on_b)
            a.proc.kill()
            await a.proc.wait()
            resolved = await on_b.expect("tool.resolved", call_id="c2")
            assert (resolved["approval_id"], resolved["reason"]) == (
                pending["approval_id"],
                "disconnected",
            )
            ended = await on_b.terminal("c2")
            assert (ended["type"], ended["code"], ended["message"]) == ("call.error", *UNSTARTED)
            failed = await on_b.expect("job.failed", job_id=job)
            assert failed["error"]["code"] == "interrupted"
            await barrier(on_b)
    seqs = [msg["seq"] for msg in on_b.seen if "seq" in msg]
    assert seqs == list(range(last + 1, last + 1 + len(seqs)))
    kinds = [msg["type"] for msg in on_b.seen if "seq" in msg]
    for kind in ("tool.resolved", "call.error", "job.failed"):
        assert kinds.count(kind) == 1, kinds
    assert runs(tmp_path) == ["j1"]
    assert completed(tmp_path) == []


async def test_n4_third_node_settles_the_work_of_a_dead_node_for_a_session_held_elsewhere(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N4, N3: three nodes. The client moved from A to C while A ran two jobs and
    held a pending approval; A is killed and B (the quick one) claims its work. B holds
    none of the session: what it settles (the approval, the call, the interrupted job,
    the idempotent job it re-runs) reaches the client on C through the inbox, each once,
    gap-free."""
    slow = {"nodes": {"node_id": "c", "lease_interval": 30.0, "lease_ttl": 60.0}}
    async with (
        nodes(tmp_path, pg_url, "a", "b") as (a, _),
        nodes(tmp_path, pg_url, "c", **slow) as (c,),
    ):
        async with connect(a.url, subprotocols=SUB) as ws_a:
            on_a = Peer(ws_a)
            await on_a.hello(options={"confirm_tool_calls": True})
            other = await _approved_job(on_a, "j1", "gated_job", tmp_path)
            idem = await _approved_job(on_a, "j2", "idem_job", tmp_path)
            await until(lambda: sorted(runs(tmp_path)) == ["j1", "j2"], "both jobs run on A")
            await on_a.invoke("c3", "gated_job", {"dir": str(tmp_path)})
            await on_a.expect("tool_start", call_id="c3")
            last = max(msg["seq"] for msg in on_a.seen if "seq" in msg)
        async with _resumed_after_a_dies(c.url, on_a, last, a.proc) as on_c:
            resolved = await on_c.expect("tool.resolved", call_id="c3")
            assert resolved["reason"] == "disconnected"
            ended = await on_c.terminal("c3")
            assert (ended["type"], ended["code"], ended["message"]) == ("call.error", *UNSTARTED)
            failed = await on_c.expect("job.failed", job_id=other)
            assert failed["error"]["code"] == "interrupted"
            await until(lambda: runs(tmp_path).count("j2") == 2, "j2 re-run on B")
            (tmp_path / "go-j2").touch()
            await on_c.expect("job.done", job_id=idem)
            await barrier(on_c)
    with psycopg.connect(pg_url, autocommit=True) as db:
        ran = db.execute("SELECT node_id FROM jobs WHERE job_id=%s", (idem,)).fetchone()
        call = db.execute(
            "SELECT state, node_id FROM calls WHERE call_id=convert_to('c3', 'UTF8')"
        ).fetchall()
    assert ran == ("b",)
    assert call == [("done", "c")]  # recorded by the owner, under its seq (SPEC I12)
    seqs = [msg["seq"] for msg in on_c.seen if "seq" in msg]
    assert seqs == list(range(last + 1, last + 1 + len(seqs)))
    kinds = [msg["type"] for msg in on_c.seen if "seq" in msg]
    for kind in ("tool.resolved", "call.error", "job.failed", "job.done"):
        assert kinds.count(kind) == 1, kinds
    assert completed(tmp_path) == ["j2"]


async def test_n4_frozen_node_is_declared_dead_writes_nothing_and_stops(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N4, D1: A is frozen (SIGSTOP) while its job runs; its lease expires (its
    connections, and lock, stay open), B claims its work and the client resumed on B
    gets the job ``failed`` ``interrupted``. When A runs again (SIGCONT) and its handler
    returns, A finds itself declared dead: nothing of it is written or forwarded (the
    job stays failed, no ``job.done`` reaches B) and it stops by itself."""
    async with nodes(tmp_path, pg_url, "a", "b") as (a, b):
        async with connect(a.url, subprotocols=SUB) as ws_a:
            on_a = Peer(ws_a)
            await on_a.hello()
            await on_a.invoke("j1", "gated_job", {"dir": str(tmp_path)})
            job = (await on_a.terminal("j1"))["job_id"]
            await until(lambda: runs(tmp_path) == ["j1"], "j1 runs on A")
            last = max(msg["seq"] for msg in on_a.seen if "seq" in msg)
        a.proc.send_signal(signal.SIGSTOP)
        try:
            await until(lambda: _nodes(pg_url) == ["b"], "B claimed A's work")
            async with connect(b.url, subprotocols=SUB) as ws_b:
                on_b = Peer(ws_b)
                assert (await on_b.hello(**resume_fields(on_a, last)))["resumed"] is True
                failed = await on_b.expect("job.failed", job_id=job)
                assert failed["error"]["code"] == "interrupted"
                (tmp_path / "go-j1").touch()
        finally:
            a.proc.send_signal(signal.SIGCONT)
        async with asyncio.timeout(WAIT):
            assert await a.proc.wait() == 0
        async with connect(b.url, subprotocols=SUB) as ws_b:
            again = Peer(ws_b)
            await again.hello(**resume_fields(on_a, failed["seq"]))
            assert sequenced(await barrier(again)) == []
    with psycopg.connect(pg_url, autocommit=True) as db:
        stored = db.execute("SELECT state, node_id FROM jobs WHERE job_id=%s", (job,)).fetchone()
    assert stored == ("failed", "b")
    assert completed(tmp_path) == ["j1"]  # the handler did return on A: nothing of it landed


@asynccontextmanager
async def _resumed_after_a_dies(
    url: str, on_a: Peer, last: int, a: asyncio.subprocess.Process
) -> AsyncIterator[Peer]:
    """``on_a``'s session resumed (from ``last``) on the node at ``url``, then node A's
    process SIGKILLed (SPEC N4: a live node claims its work); yields the resumed peer."""
    async with connect(url, subprotocols=SUB) as ws:
        resumed = Peer(ws)
        assert (await resumed.hello(**resume_fields(on_a, last)))["resumed"] is True
        await barrier(resumed)
        a.kill()
        await a.wait()
        yield resumed


def _audited(folder: Path, call_id: str) -> list[tuple[str, str, Any]]:
    """``(node, outcome, duration_ms)`` of every audit record of ``call_id`` in the
    nodes' audit files (``data-<node>/audit.jsonl``, SPEC I11)."""
    found = []
    for path in sorted(folder.glob("data-*/audit.jsonl")):
        for line in path.read_bytes().splitlines():
            record = json.loads(line)
            if record["call_id"] == call_id:
                found.append((path.parent.name[5:], record["outcome"], record["duration_ms"]))
    return found


async def test_i11_a_dead_node_call_settled_for_a_session_held_elsewhere_is_audited_once(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC I11, N4, J6: `c3` waits for approval on A; the client moves to C; A is
    killed and B claims its work (it holds none of the session). Over the three nodes'
    audit files `c3` has one record, B's: ``unavailable``, no duration."""
    slow = {"nodes": {"node_id": "c", "lease_interval": 30.0, "lease_ttl": 60.0}}
    async with (
        nodes(tmp_path, pg_url, "a", "b") as (a, _),
        nodes(tmp_path, pg_url, "c", **slow) as (c,),
    ):
        async with connect(a.url, subprotocols=SUB) as ws_a:
            on_a = Peer(ws_a)
            await on_a.hello(options={"confirm_tool_calls": True})
            await on_a.invoke("c3", "gated_job", {"dir": str(tmp_path)})
            await on_a.expect("tool_start", call_id="c3")
            last = max(msg["seq"] for msg in on_a.seen if "seq" in msg)
        async with _resumed_after_a_dies(c.url, on_a, last, a.proc) as on_c:
            ended = await on_c.terminal("c3")
            assert (ended["type"], ended["code"], ended["message"]) == ("call.error", *UNSTARTED)
            await barrier(on_c)
    assert _audited(tmp_path, "c3") == [("b", "unavailable", None)]
