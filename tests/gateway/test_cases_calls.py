"""Field failure cases about calls and approvals (cases F01-F05, F10, F11).

Each test docstring states the case's input and the outcome it pins.

F08 and F09 live in ``test_pipeline.py``; the job half of F11 in ``test_jobs.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tests.gateway.tools_for_tests as tt
from catalog.errors import CatalogError
from gateway.server import Gateway
from tests.gateway.tools_for_tests import first_terminal, serve, wait_thread_event
from tests.support import MS, WAIT, Peer, peer, settings_for


async def gated_start(
    p: Peer, call_id: str, tool: str = "gated", params: dict[str, Any] | None = None
) -> str:
    await p.invoke(call_id, tool, params if params is not None else {})
    return str((await p.expect("tool_start", call_id=call_id))["approval_id"])


async def confirm(p: Peer, approval_id: str, decision: str, rid: str) -> dict[str, Any]:
    await p.send(
        {"type": "tool.confirm", "id": rid, "approval_id": approval_id, "decision": decision}
    )
    reply = await p.expect("confirm.result", id=rid)
    return {k: v for k, v in reply.items() if k in ("accepted", "reason")}


ACCEPTED = {"accepted": True}


async def test_case_f01_waiter_giving_up_does_not_deny(tmp_path: Path) -> None:
    """Case F01 / SPEC A4: waiters that time out leave it pending; a later allow runs."""
    async with serve(tmp_path, calls={"approval_timeout": 300.0}) as gw, peer(gw) as p:
        approval_id = await gated_start(p, "c1")
        approval = gw.approvals.pending[approval_id]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(approval.wait(), 10 * MS)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(approval.decided.wait(), 10 * MS)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(10 * MS):
                await approval.wait()
        assert gw.approvals.pending == {approval_id: approval}
        assert approval.outcome is None
        assert tt.STATE.calls == {}
        assert await confirm(p, approval_id, "allow", "r1") == ACCEPTED
        resolved = await p.expect("tool.resolved", call_id="c1")
        assert (resolved["resolution"], resolved["reason"]) == ("allowed", "user")
        result = await p.terminal("c1")
        assert result["type"] == "result"
        assert result["declined"] is False
        assert tt.STATE.calls == {"gated": 1}


async def test_case_f02_parallel_gated_calls_bound_to_their_own_arguments(tmp_path: Path) -> None:
    """Case F02 / SPEC A2: parallel delete_file calls: distinct ids; allowing one allows only it."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("ca", "delete_file", {"path": "a"})
        await p.invoke("cb", "delete_file", {"path": "b"})
        start_a = await p.expect("tool_start", call_id="ca")
        start_b = await p.expect("tool_start", call_id="cb")
        assert start_a["approval_id"] != start_b["approval_id"]
        assert (start_a["params"], start_b["params"]) == ({"path": "a"}, {"path": "b"})
        pending_b = gw.approvals.pending[start_b["approval_id"]]
        assert (pending_b.call_id, pending_b.params) == ("cb", {"path": "b"})
        assert await confirm(p, start_a["approval_id"], "allow", "r1") == ACCEPTED
        result = await p.terminal("ca")
        assert result["result"]["params"] == {"path": "a"}
        assert start_b["approval_id"] in gw.approvals.pending
        assert [c["call_id"] for c in tt.STATE.contexts] == ["ca"]
        assert await confirm(p, start_b["approval_id"], "deny", "r2") == ACCEPTED
        assert (await p.terminal("cb"))["declined"] is True
        assert tt.STATE.calls == {"delete_file": 1}


async def test_case_f03_a_decision_is_used_once(tmp_path: Path) -> None:
    """Case F03 / SPEC A3: after allowing A1, a later A2 waits for its own decision."""
    async with serve(tmp_path, calls={"approval_timeout": 300 * MS}) as gw, peer(gw) as p:
        first = await gated_start(p, "c1")
        assert await confirm(p, first, "allow", "r1") == ACCEPTED
        await p.terminal("c1")
        second = await gated_start(p, "c2")
        assert second != first
        assert second in gw.approvals.pending
        assert tt.STATE.calls == {"gated": 1}
        resolved = await p.expect("tool.resolved", call_id="c2")
        assert (resolved["resolution"], resolved["reason"]) == ("denied", "timeout")
        result = await p.terminal("c2")
        assert result["declined"] is True
        assert result["result"]["reason"] == "timeout"
        assert tt.STATE.calls == {"gated": 1}
        await p.send({"type": "grants.list", "id": "g1"})
        assert (await p.expect("grants", id="g1"))["tools"] == []


async def test_case_f04_reallow_after_drop_and_resent_invoke(tmp_path: Path) -> None:
    """Case F04 / SPEC A3, I12, D3: one run, result by replay, repeats change nothing."""
    async with serve(tmp_path) as gw:
        async with peer(gw) as p:
            approval_id = await gated_start(p, "c1", "gated_block")
            assert await confirm(p, approval_id, "allow", "r1") == ACCEPTED
            resolved = await p.expect("tool.resolved", call_id="c1")
            await wait_thread_event(tt.STATE.started)
            welcome = p.welcome
            session = gw.sessions.get(welcome["session_id"])
            assert session is not None
            task = session.inflight["c1"]
            p.ws.transport.abort()
        tt.STATE.release.set()
        async with asyncio.timeout(WAIT):
            await asyncio.shield(task)  # the result is in the session's log now
        resume = {
            "session_id": welcome["session_id"],
            "resume_token": welcome["resume_token"],
            "last_seq": resolved["seq"],
        }
        async with peer(gw, **resume) as p2:
            assert p2.welcome["resumed"] is True
            result = await p2.expect("result", call_id="c1")
            assert (result["seq"], result["result"]) == (
                resolved["seq"] + 1,
                {"late": True, "tool": "gated_block"},
            )
            assert await confirm(p2, approval_id, "allow", "r2") == {
                "accepted": False,
                "reason": "already_decided",
            }
            await p2.invoke("c1", "gated_block")
            assert await p2.terminal("c1") == result
            assert [m["type"] for m in p2.seen if m.get("call_id") == "c1"] == ["result", "result"]
        assert tt.STATE.calls == {"gated_block": 1}


async def test_case_f05_confirms_for_unissued_or_ungated_ids(tmp_path: Path) -> None:
    """Case F05 / SPEC A3: an id never issued, and one for an ungated call, are not accepted."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        never = "ap_" + "Q" * 32
        assert await confirm(p, never, "allow", "r1") == {"accepted": False, "reason": "unknown"}
        await p.invoke("c1", "echo", {})
        start = await p.expect("tool_start", call_id="c1")
        assert "approval_id" not in start
        await first_terminal(p, "c1")
        assert await confirm(p, "c1", "allow", "r2") == {"accepted": False, "reason": "unknown"}
        assert await confirm(p, never, "allow_always", "r3") == {
            "accepted": False,
            "reason": "unknown",
        }
        await p.send({"type": "grants.list", "id": "g1"})
        assert (await p.expect("grants", id="g1"))["tools"] == []
        assert tt.STATE.calls == {"echo": 1}
        assert [m["type"] for m in p.seen if "seq" in m] == ["catalog", "tool_start", "result"]


def test_case_f10_duplicate_tool_in_two_files_refuses_to_start(tmp_path: Path) -> None:
    """Case F10 / SPEC C1: send_email in two catalog files fails the load naming both files."""
    tool = """
tools:
  - name: send_email
    description: Send an email.
    capability: t.basic
    handler: tests.gateway.tools_for_tests:echo
"""
    first, second = tmp_path / "mail_a.yaml", tmp_path / "mail_b.yaml"
    first.write_text(tool)
    second.write_text(tool)
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("profiles:\n  demo: {capabilities: [t.basic]}\n")
    settings = settings_for(tmp_path, catalog={"tools": [first, second], "profiles": [profiles]})
    with pytest.raises(CatalogError) as caught:
        Gateway(settings)
    messages = [issue.message for issue in caught.value.issues]
    assert messages == [f"duplicate tool name 'send_email': in {first} and in {second}"]
    assert str(first) in str(caught.value)
    assert str(second) in str(caught.value)


async def test_case_f11_cancel_call_waiting_for_approval(tmp_path: Path) -> None:
    """Case F11 / SPEC I8, A4: cancel while pending: approval denied, one terminal."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        approval_id = await gated_start(p, "c1")
        await p.send({"type": "call.cancel", "call_id": "c1"})
        err = await p.terminal("c1")
        assert (err["code"], err["message"]) == ("cancelled", "the call was cancelled")
        assert await confirm(p, approval_id, "allow", "r1") == {
            "accepted": False,
            "reason": "already_decided",
        }
        await p.invoke("c2", "scalar")  # a sentinel: anything late for c1 would come first
        await p.terminal("c2")
        events = [m for m in p.seen if m.get("call_id") == "c1"]
        assert [(m["type"], m.get("reason")) for m in events] == [
            ("tool_start", None),
            ("tool.resolved", "cancelled"),
            ("call.error", None),
        ]
        assert tt.STATE.calls == {"scalar": 1}
        assert gw.approvals.pending == {}


async def test_case_f11_cancel_running_call_drops_late_result(tmp_path: Path) -> None:
    """Case F11 / SPEC I8: a cancelled running call ends once; its late value is dropped."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "blocking")
        await wait_thread_event(tt.STATE.started)
        await p.send({"type": "call.cancel", "call_id": "c1"})
        assert (await p.terminal("c1"))["code"] == "cancelled"
        tt.STATE.release.set()
        await wait_thread_event(tt.STATE.returned)
        await p.invoke("c2", "scalar")
        await p.terminal("c2")
        assert [m["type"] for m in p.seen if m.get("call_id") == "c1"] == [
            "tool_start",
            "call.error",
        ]
        assert gw.pipeline._call_state == {}
