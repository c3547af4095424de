"""Several `toolbus serve` processes on one PostgreSQL store as one gateway (SPEC N2, N3,
N5): a resume on any node takes the session over, the old node is fenced, and what it
still produces reaches the client on the new node once, through the inbox."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg
from websockets.asyncio.client import connect

from tests.gateway.node_tools import nodes, runs, until
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import WAIT, Peer, barrier, closed, resume_fields

SUB: Any = ["toolbus.v1"]


async def _dispatched(p: Peer, call_id: str, folder: Path) -> dict[str, Any]:
    """Invoke the gated job ``call_id``; its ``dispatched`` reply, once its handler runs."""
    await p.invoke(call_id, "gated_job", {"dir": str(folder)})
    reply = await p.terminal(call_id)
    assert reply["type"] == "dispatched"
    await until(lambda: call_id in runs(folder), f"{call_id} started")
    return reply


def _last_seq(p: Peer) -> int:
    return max(msg["seq"] for msg in p.seen if "seq" in msg)


def _log(url: str, session_id: str) -> list[tuple[int, str]]:
    """The stored log of a session: ``(seq, type)`` in order."""
    with psycopg.connect(url, autocommit=True) as db:
        rows = db.execute(
            "SELECT seq, convert_from(body, 'UTF8')::json->>'type' FROM events "
            "WHERE session_id=%s ORDER BY seq",
            (session_id,),
        ).fetchall()
    return [(int(seq), kind) for seq, kind in rows]


def _inbox(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as db:
        row = db.execute("SELECT count(*) FROM inbox").fetchone()
    assert row is not None
    return int(row[0])


async def test_n2_resume_on_another_node_fences_the_old_one(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N2, N3, D4: a resume on node B closes the socket on A with 4000, replays and
    goes live with seq gap-free; the job that then ends on A cannot append to the log:
    its job.done reaches B's client once, under B's next seq, through the inbox."""
    async with nodes(tmp_path, pg_url, "a", "b") as (a, b):
        async with connect(a.url, subprotocols=SUB) as ws_a:
            on_a = Peer(ws_a)
            await on_a.hello()
            job = (await _dispatched(on_a, "c1", tmp_path))["job_id"]
            seen_on_a = _last_seq(on_a)
            async with connect(b.url, subprotocols=SUB) as ws_b:
                on_b = Peer(ws_b)
                welcome = await on_b.hello(**resume_fields(on_a, 1))
                assert (welcome["resumed"], welcome["last_seq"]) == (True, seen_on_a)
                gone = await closed(on_a)
                assert gone.rcvd is not None
                assert (gone.rcvd.code, gone.rcvd.reason) == (
                    4000,
                    "session resumed on another node",
                )
                replayed = await barrier(on_b)
                seqs = [msg["seq"] for msg in replayed if "seq" in msg]
                assert seqs[: seen_on_a - 1] == list(range(2, seen_on_a + 1))
                (tmp_path / "go-c1").touch()
                done = await on_b.expect("job.done", job_id=job)
                rest = await barrier(on_b)
        all_seqs = [msg["seq"] for msg in on_b.seen if "seq" in msg]
        assert all_seqs == list(range(2, all_seqs[-1] + 1))
        assert done["seq"] > seen_on_a  # B's seq, after what A had sent
        assert [m["type"] for m in on_b.seen].count("job.done") == 1
        assert not [m for m in rest if m["type"] == "job.done"]
        log = _log(pg_url, welcome["session_id"])
        assert [seq for seq, _ in log] == list(range(1, log[-1][0] + 1))
        assert [kind for _, kind in log].count("job.done") == 1
        assert _inbox(pg_url) == 0
        assert runs(tmp_path) == ["c1"]


async def test_n3_job_ending_on_a_reaches_the_client_on_b_once(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N3: jobs started on A, the client gone from A and resumed on B: each job's
    done event arrives on B once, in order, gap-free; the cross-node push latency (the
    handler's end to the client's receipt) is measured."""
    calls = [f"j{i}" for i in range(5)]
    async with nodes(tmp_path, pg_url, "a", "b") as (a, b):
        async with connect(a.url, subprotocols=SUB) as ws_a:
            on_a = Peer(ws_a)
            await on_a.hello()
            jobs = {c: (await _dispatched(on_a, c, tmp_path))["job_id"] for c in calls}
            last = _last_seq(on_a)
        async with connect(b.url, subprotocols=SUB) as ws_b:
            on_b = Peer(ws_b)
            welcome = await on_b.hello(**resume_fields(on_a, last))
            assert welcome["resumed"] is True
            await barrier(on_b)
            latencies = []
            for call in calls:
                (tmp_path / f"go-{call}").touch()
                done = await on_b.expect("job.done", job_id=jobs[call])
                received = time.time()
                ended = float((tmp_path / f"ended-{call}").read_text())
                latencies.append(received - ended)
                assert done["call_id"] == call
            await barrier(on_b)
        seqs = [msg["seq"] for msg in on_b.seen if "seq" in msg]
        assert seqs == list(range(last + 1, last + 1 + len(seqs)))
        assert [m["job_id"] for m in on_b.seen if m["type"] == "job.done"] == list(jobs.values())
        assert runs(tmp_path) == calls
        assert _inbox(pg_url) == 0
    latencies.sort()
    median, worst = latencies[2] * 1000, latencies[-1] * 1000
    print(f"cross-node push latency: median {median:.1f} ms, max {worst:.1f} ms")
    assert latencies[-1] < WAIT


async def test_n5_sessions_per_user_are_counted_gateway_wide(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N5, E2: with ``limits.max_sessions_per_user`` 1, a user holding a session on
    node A is refused a second one on node B."""
    limits = {"max_sessions_per_user": 1}
    async with (
        nodes(tmp_path, pg_url, "a", "b", limits=limits) as (a, b),
        connect(a.url, subprotocols=SUB) as ws_a,
    ):
        await Peer(ws_a).hello()
        async with connect(b.url, subprotocols=SUB) as ws_b:
            on_b = Peer(ws_b)
            await on_b.send({"type": "hello", "token": "alice-token", "profile": "demo"})
            error = await on_b.expect("error")
            assert (error["code"], error["message"]) == (
                "too_many_sessions",
                "too many sessions for this user",
            )
            async with asyncio.timeout(WAIT):
                other = await closed(on_b)
            assert other.rcvd is not None
            assert other.rcvd.code == 1013


async def test_n2_resume_on_the_same_node_keeps_the_session_and_closes_the_old_socket(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N2, D4: with several nodes, a resume on the node that holds the session takes
    the same path (a new token) and keeps its memory; the old socket is closed 4000 as a
    same-node take-over; the log stays gap-free."""
    async with nodes(tmp_path, pg_url, "a", "b") as (a, _):
        async with connect(a.url, subprotocols=SUB) as first:
            old = Peer(first)
            await old.hello()
            async with connect(a.url, subprotocols=SUB) as second:
                new = Peer(second)
                welcome = await new.hello(**resume_fields(old, 1))
                assert (welcome["resumed"], welcome["last_seq"]) == (True, 1)
                gone = await closed(old)
                assert gone.rcvd is not None
                assert (gone.rcvd.code, gone.rcvd.reason) == (
                    4000,
                    "session resumed on another connection",
                )
                await _dispatched(new, "c1", tmp_path)
                (tmp_path / "go-c1").touch()
                await new.expect("job.done")
        log = _log(pg_url, welcome["session_id"])
        assert [seq for seq, _ in log] == list(range(1, log[-1][0] + 1))
        assert _inbox(pg_url) == 0
