"""Attacks on the surfaces of several nodes on one PostgreSQL store (SPEC N2, N3, S1,
S6, A3, A7, J3): another user's ids presented on another node, resumes that must fail
without side effects, and ids holding U+0000 (PostgreSQL ``TEXT`` cannot hold it)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from protocol import messages as m
from tests.gateway.node_tools import nodes, runs, until
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import (
    WAIT,
    Peer,
    barrier,
    park_signal,
    peer,
    resume_fields,
    running,
    sequenced,
    settings_for,
)

SUB: Any = ["toolbus.v1"]
CONFIRM = {"options": {"confirm_tool_calls": True}}
NUL = "s_x\u0000y"
"""An id holding U+0000: no stored row can have it."""


def _owner(url: str, session_id: str) -> tuple[str, int]:
    with psycopg.connect(url, autocommit=True) as db:
        row = db.execute(
            "SELECT owner_node, owner_epoch FROM sessions WHERE session_id=%s", (session_id,)
        ).fetchone()
    assert row is not None
    return row[0], row[1]


async def _hello(url: str, **fields: Any) -> dict[str, Any]:
    async with connect(url, subprotocols=SUB) as ws:
        p = Peer(ws)
        await p.send({"type": "hello", "profile": "demo", **fields})
        return await p.recv()


async def test_n2_s6_a_refused_resume_leaves_the_session_with_its_owner(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N2, D4, S6, D3: only a resume that succeeds takes a session over. On node B,
    another user's credential with alice's session id and resume token, and alice's own
    credential with a ``last_seq`` she was never sent, each get ``resumed: false`` (a new
    session, as on one node); alice's session stays on node A under the same fencing
    token and her socket there keeps working."""
    async with (
        nodes(tmp_path, pg_url, "a", "b") as (a, b),
        connect(a.url, subprotocols=SUB) as ws_a,
    ):
        alice = Peer(ws_a)
        await alice.hello()
        await barrier(alice)
        sid = alice.welcome["session_id"]
        before = _owner(pg_url, sid)
        assert before[0] == "a"
        other = await _hello(b.url, token="bob-token", **resume_fields(alice, 0))
        assert (other["type"], other["resumed"], other["user"]) == ("welcome", False, "bob")
        assert other["session_id"] != sid
        ahead = await _hello(b.url, token="alice-token", **resume_fields(alice, 999))
        assert (ahead["type"], ahead["resumed"]) == ("welcome", False)
        assert ahead["session_id"] != sid
        assert _owner(pg_url, sid) == before
        await barrier(alice)
        await alice.send({"type": "context.update", "id": "c", "context": {"k": "v"}})
        await alice.expect("context", id="c")


async def test_s1_a7_an_id_holding_nul_answers_like_a_made_up_one(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC S1, A7, J3 (F26's kind): a resume naming a session id with U+0000 gets
    ``resumed: false`` like any made-up id, and ``job.get`` / ``job.cancel`` of such a
    job id answer ``unknown_job`` like a made-up one, never ``unavailable`` (PostgreSQL
    ``TEXT`` cannot bind it; no stored row can have it)."""
    async with nodes(tmp_path, pg_url, "a") as (a,):
        for sid in ("s_made_up", NUL):
            welcome = await _hello(a.url, token="bob-token", session_id=sid,
                                   resume_token="t", last_seq=0)  # fmt: skip
            assert (welcome["type"], welcome["resumed"]) == ("welcome", False), sid
        async with connect(a.url, subprotocols=SUB) as ws:
            bob = Peer(ws)
            await bob.hello(token="bob-token")
            for job_id in ("j_made_up", NUL):
                for kind in ("job.get", "job.cancel"):
                    await bob.send({"type": kind, "id": "q", "job_id": job_id})
                    answer = await bob.expect("error", id="q")
                    assert (answer["code"], answer["message"]) == (
                        "unknown_job",
                        f"no job {job_id!r}",
                    ), kind


async def test_a3_a7_j3_another_users_ids_on_another_node_are_unknown(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC A3, A7, J3, N3: alice's call waits for approval on A and her job runs there;
    bob, on B, confirms her approval id, cancels her call id and her job id: each answer
    is the one a made-up id gets, nothing is routed as authority, her call still waits
    for her own decision, and her job still runs."""
    async with (
        nodes(tmp_path, pg_url, "a", "b") as (a, b),
        connect(a.url, subprotocols=SUB) as ws_a,
    ):
        alice = Peer(ws_a)
        await alice.hello(**CONFIRM)
        await alice.invoke("j1", "gated_job", {"dir": str(tmp_path)})
        start = await alice.expect("tool_start", call_id="j1")
        async with connect(b.url, subprotocols=SUB) as ws_b:
            bob = Peer(ws_b)
            await bob.hello(token="bob-token")
            for ap in (start["approval_id"], "ap_made_up"):
                await bob.send({"type": "tool.confirm", "id": ap, "approval_id": ap,
                                "decision": "allow"})  # fmt: skip
                got = await bob.expect("confirm.result", id=ap)
                assert (got["accepted"], got["reason"]) == (False, "unknown")
            for call_id in ("j1", "c_made_up"):
                await bob.send({"type": "call.cancel", "id": call_id, "call_id": call_id})
                got = await bob.expect("error", id=call_id)
                assert (got["code"], got["message"]) == (
                    "unknown_call",
                    f"no running call {call_id!r}",
                )
            mine = {"approval_id": start["approval_id"], "decision": "allow"}
            await alice.send({"type": "tool.confirm", "id": "k", **mine})
            got = await alice.expect("confirm.result", id="k")
            assert (got["accepted"], got.get("reason")) == (True, None)
            job_id = (await alice.terminal("j1"))["job_id"]
            await until(lambda: runs(tmp_path) == ["j1"], "j1 running on A")
            for jid in (job_id, "j_made_up"):
                await bob.send({"type": "job.cancel", "id": jid, "job_id": jid})
                got = await bob.expect("error", id=jid)
                assert (got["code"], got["message"]) == ("unknown_job", f"no job {jid!r}")
            await barrier(bob)
        (tmp_path / "go-j1").touch()
        done = await alice.expect("job.done", job_id=job_id)
        assert done["ok"] is True


async def test_n6_d5_lifetime_ends_a_socket_whose_client_never_reads(tmp_path: Path) -> None:
    """SPEC N6, D5, S4: a socket reaches its lifetime while its client has stopped reading
    and 4 MB of events wait for it (under ``max_outbound_bytes``). The server does not
    wait for it forever: within the flush grace and the closing handshake's timeout the
    socket is gone and its session parked; a resume replays every event, in order."""
    settings = settings_for(
        tmp_path,
        server={"max_socket_lifetime": 1.0, "max_socket_lifetime_jitter": 0.0,
                "max_outbound_bytes": 64 << 20, "heartbeat_timeout": 2.0},
    )  # fmt: skip
    async with running(settings) as gw:
        parked = park_signal(gw)
        async with peer(gw) as slow:
            await slow.expect("catalog")
            session = gw.sessions.get(slow.welcome["session_id"])
            assert session is not None
            slow.ws.transport.pause_reading()  # a client that never reads
            payload = "x" * (64 * 1024)
            for _ in range(64):
                session.emit(m.JobProgress(job_id="job_flood", tool="report", message=payload))
            began = time.monotonic()
            async with asyncio.timeout(5.0 + 2.0 + 1.0 + WAIT):
                await parked.wait()
            assert time.monotonic() - began < 5.0 + 2.0 + 1.0 + 2.0
            last = session.last_seq
        async with peer(gw, **resume_fields(slow, 1)) as again:
            assert again.welcome["resumed"] is True
            got = await barrier(again)
            assert sequenced(got) == list(range(2, last + 1))


async def _resume_on(url: str, fields: dict[str, Any]) -> tuple[Peer, Any]:
    ws = await connect(url, subprotocols=SUB)
    p = Peer(ws)
    await p.send({"type": "hello", "token": "alice-token", "profile": "demo", **fields})
    first = await p.recv()
    # The resume that lost the race may be refused before its welcome (then closed 4000).
    p.welcome = first if first["type"] == "welcome" else {}
    return p, ws


async def test_n2_d4_two_resumes_racing_on_two_nodes_leave_one_socket(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N2, D4, D1: the same session resumed at once on nodes B and C. Exactly one
    socket keeps it; the other is closed 4000 (after its welcome, or refused before it
    when the other node took the session over while this one was resuming it: never a
    live socket on a session its node does not hold); the survivor's events continue the
    log gap-free, and a later resume from ``last_seq`` 0 replays it whole, in order."""
    async with nodes(tmp_path, pg_url, "a", "b", "c") as (a, b, c):
        async with connect(a.url, subprotocols=SUB) as ws_a:
            alice = Peer(ws_a)
            await alice.hello()
            await barrier(alice)
        fields = resume_fields(alice, 1)
        (p_b, ws_b), (p_c, ws_c) = await asyncio.gather(
            _resume_on(b.url, fields), _resume_on(c.url, fields)
        )
        try:
            codes = []
            for p in (p_b, p_c):
                # A commit of the session (its row): the node that lost it is fenced
                # there at the latest, and closes its socket 4000 (SPEC N2).
                try:
                    await p.send({"type": "context.update", "id": "u", "context": {"k": "v"}})
                    await p.expect("context", id="u")
                    await barrier(p)
                    await barrier(p)
                    codes.append(None)
                except ConnectionClosed as exc:
                    codes.append(exc.rcvd.code if exc.rcvd is not None else None)
            survivors = [p for p, code in zip((p_b, p_c), codes, strict=True) if code is None]
            assert len(survivors) == 1, codes
            assert [code for code in codes if code is not None] == [4000]
            live = survivors[0]
            assert live.welcome["resumed"] is True
            loser = p_c if live is p_b else p_b
            if not loser.welcome:
                refused = loser.seen[0]
                assert (refused["type"], refused["code"]) == ("error", "unavailable")
        finally:
            await ws_b.close()
            await ws_c.close()
        last = max((msg["seq"] for msg in live.seen if "seq" in msg), default=1)
        async with connect(a.url, subprotocols=SUB) as ws_again:
            again = Peer(ws_again)
            welcome = await again.hello(**resume_fields(alice, 0))
            assert welcome["resumed"] is True
            assert sequenced(await barrier(again)) == list(range(1, last + 1))
