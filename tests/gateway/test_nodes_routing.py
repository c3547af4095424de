"""Decisions and cancels reach the node where the call or job runs (SPEC N3, A3, I8, J3):
the client moved to node B, the call waits or the job runs on node A."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

from tests.gateway.node_tools import nodes, runs, until
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import Peer, barrier, resume_fields

SUB: Any = ["toolbus.v1"]
CONFIRM = {"options": {"confirm_tool_calls": True}}


def _last_seq(p: Peer) -> int:
    return max(msg["seq"] for msg in p.seen if "seq" in msg)


def _types(p: Peer) -> list[str]:
    return [msg["type"] for msg in p.seen]


async def _moved(a_url: str, b_url: str, folder: Path, call_id: str) -> tuple[Peer, Any, str]:
    """Open a session on A that asks approval for every call, invoke the gated job
    ``call_id``, wait for its ``tool_start``; returns the peer on A (closed), and the
    open socket and approval id for resuming on B."""
    async with connect(a_url, subprotocols=SUB) as ws_a:
        on_a = Peer(ws_a)
        await on_a.hello(**CONFIRM)
        await on_a.invoke(call_id, "gated_job", {"dir": str(folder)})
        start = await on_a.expect("tool_start", call_id=call_id)
    return on_a, start, start["approval_id"]


async def test_n3_approval_decided_on_b_runs_the_call_on_a_once(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N3, A3: a call waits for approval on A; the client resumes on B, where the
    replayed tool_start is confirmed. The decision reaches A, the job runs once there,
    and its resolution, dispatch and completion arrive on B in order, gap-free."""
    async with nodes(tmp_path, pg_url, "a", "b") as (a, b):
        on_a, _, approval_id = await _moved(a.url, b.url, tmp_path, "c1")
        async with connect(b.url, subprotocols=SUB) as ws_b:
            on_b = Peer(ws_b)
            welcome = await on_b.hello(**resume_fields(on_a, 1))
            assert welcome["resumed"] is True
            start = await on_b.expect("tool_start", call_id="c1")
            assert start["approval_id"] == approval_id
            await on_b.send({"type": "tool.confirm", "id": "k", "approval_id": approval_id,
                             "decision": "allow"})  # fmt: skip
            result = await on_b.expect("confirm.result", id="k")
            assert (result["accepted"], result.get("reason")) == (True, None)
            resolved = await on_b.expect("tool.resolved", call_id="c1")
            assert (resolved["resolution"], resolved["reason"]) == ("allowed", "user")
            dispatched = await on_b.terminal("c1")
            assert dispatched["type"] == "dispatched"
            await until(lambda: runs(tmp_path) == ["c1"], "c1 ran on A")
            (tmp_path / "go-c1").touch()
            await on_b.expect("job.done", job_id=dispatched["job_id"])
            await barrier(on_b)
        seqs = [msg["seq"] for msg in on_b.seen if "seq" in msg]
        assert seqs == list(range(2, seqs[-1] + 1))
        for kind in ("tool.resolved", "dispatched", "job.done"):
            assert _types(on_b).count(kind) == 1
        assert runs(tmp_path) == ["c1"]


async def test_n3_a3_a_second_decision_routed_from_b_is_not_accepted(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N3, A3: the call waits for approval on A; on B the client sends `allow`,
    then `deny`, for the same approval. The first decision wins (the job runs once), so
    the second is not accepted (`already_decided`), as a second `elicit.answer` routed
    from B is. Before, B answered both `accepted`: A had not yet applied the first."""
    async with nodes(tmp_path, pg_url, "a", "b") as (a, b):
        on_a, _, approval_id = await _moved(a.url, b.url, tmp_path, "c1")
        async with connect(b.url, subprotocols=SUB) as ws_b:
            on_b = Peer(ws_b)
            assert (await on_b.hello(**resume_fields(on_a, 1)))["resumed"] is True
            for rid, decision in (("k1", "allow"), ("k2", "deny")):
                await on_b.send({"type": "tool.confirm", "id": rid,
                                 "approval_id": approval_id, "decision": decision})  # fmt: skip
            first = await on_b.expect("confirm.result", id="k1")
            second = await on_b.expect("confirm.result", id="k2")
            assert (first["accepted"], first.get("reason")) == (True, None)
            assert (second["accepted"], second.get("reason")) == (False, "already_decided")
            resolved = await on_b.expect("tool.resolved", call_id="c1")
            assert (resolved["resolution"], resolved["reason"]) == ("allowed", "user")
            await until(lambda: runs(tmp_path) == ["c1"], "c1 ran on A")
            (tmp_path / "go-c1").touch()
            await barrier(on_b)
        assert runs(tmp_path) == ["c1"]


async def test_n3_cancels_on_b_reach_the_call_and_the_job_on_a(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N3, I8, J3: ``call.cancel`` on B ends a call waiting for approval on A
    (resolved ``cancelled``, ``call.error`` ``cancelled``), and ``job.cancel`` on B
    cancels a job running on A, answered with its final state; each event once."""
    async with nodes(tmp_path, pg_url, "a", "b") as (a, b):
        on_a, _, approval_id = await _moved(a.url, b.url, tmp_path, "c1")
        async with connect(b.url, subprotocols=SUB) as ws_b:
            on_b = Peer(ws_b)
            await on_b.hello(**resume_fields(on_a, _last_seq(on_a)))
            await on_b.send({"type": "call.cancel", "id": "x", "call_id": "c1"})
            resolved = await on_b.expect("tool.resolved", call_id="c1")
            assert (resolved["approval_id"], resolved["resolution"], resolved["reason"]) == (
                approval_id,
                "denied",
                "cancelled",
            )
            ended = await on_b.terminal("c1")
            assert (ended["type"], ended["code"]) == ("call.error", "cancelled")
        assert runs(tmp_path) == []
        # A job running on A, cancelled from B.
        async with connect(a.url, subprotocols=SUB) as ws_a:
            on_a = Peer(ws_a)
            await on_a.hello()
            await on_a.invoke("j1", "gated_job", {"dir": str(tmp_path)})
            job_id = (await on_a.terminal("j1"))["job_id"]
            await until(lambda: runs(tmp_path) == ["j1"], "j1 running on A")
            last = _last_seq(on_a)
        async with connect(b.url, subprotocols=SUB) as ws_b:
            on_b = Peer(ws_b)
            await on_b.hello(**resume_fields(on_a, last))
            await on_b.send({"type": "job.cancel", "id": "jc", "job_id": job_id})
            cancelled = await on_b.expect("job.cancelled", job_id=job_id)
            # The answer follows the stored final state; the event may come before or after.
            answers = [msg for msg in on_b.seen if msg["type"] == "job"]
            answer = answers[0] if answers else await on_b.expect("job", id="jc")
            assert answer["job"]["state"] == "cancelled"
            await barrier(on_b)
            (tmp_path / "go-j1").touch()
        seqs = [msg["seq"] for msg in on_b.seen if "seq" in msg]
        assert seqs == list(range(last + 1, last + 1 + len(seqs)))
        assert cancelled["seq"] in seqs
        assert _types(on_b).count("job.cancelled") == 1


async def test_n3_allow_always_decided_on_b_for_a_call_on_a_is_a_grant_of_the_session_on_b(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N3, A3: ``allow_always`` for a call waiting on A, decided on B where the
    session now lives, becomes the session's grant on B: ``grants.list`` names the
    tool, and the next call of it on B runs without asking."""
    async with nodes(tmp_path, pg_url, "a", "b") as (a, b):
        on_a, _, approval_id = await _moved(a.url, b.url, tmp_path, "c1")
        async with connect(b.url, subprotocols=SUB) as ws_b:
            on_b = Peer(ws_b)
            await on_b.hello(**resume_fields(on_a, 1))
            await on_b.expect("tool_start", call_id="c1")
            await on_b.send({"type": "tool.confirm", "id": "k", "approval_id": approval_id,
                             "decision": "allow_always"})  # fmt: skip
            resolved = await on_b.expect("tool.resolved", call_id="c1")
            assert (resolved["resolution"], resolved["always"]) == ("allowed", True)
            await on_b.terminal("c1")
            await on_b.send({"type": "grants.list", "id": "g"})
            assert (await on_b.expect("grants", id="g"))["tools"] == ["gated_job"]
            await on_b.invoke("c2", "gated_job", {"dir": str(tmp_path)})
            second = await on_b.terminal("c2")
            assert second["type"] == "dispatched"
            assert not [
                msg for msg in on_b.seen if msg["type"] == "tool_start" and msg["call_id"] == "c2"
                and msg.get("approval_id")
            ]  # fmt: skip
            await until(lambda: sorted(runs(tmp_path)) == ["c1", "c2"], "c1 and c2 ran")
            (tmp_path / "go-c1").touch()
            (tmp_path / "go-c2").touch()
            await barrier(on_b)
