"""Approvals over real sockets (SPEC A1-A6, I7) and their races."""

from __future__ import annotations

import asyncio
import base64
import re
import time
from pathlib import Path
from typing import Any

import pytest

import tests.gateway.tools_for_tests as tt
from gateway.server import Gateway
from gateway.session import Session
from protocol import messages as m
from tests.gateway.tools_for_tests import audit_records, first_terminal, serve
from tests.support import MS, Clock, Peer, peer, settings_for

APPROVAL_ID = re.compile(r"ap_[A-Za-z0-9_-]{32}")
"""``ap_`` + 24 random bytes in base64url: 192 bits (SPEC A2 asks for at least 128)."""


async def gated_start(
    p: Peer, call_id: str, tool: str = "gated", params: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Invoke a gated tool and return its ``tool_start``."""
    await p.invoke(call_id, tool, params if params is not None else {})
    start = await p.expect("tool_start", call_id=call_id)
    assert APPROVAL_ID.fullmatch(start["approval_id"])
    return start


async def confirm(p: Peer, approval_id: str, decision: str, rid: str) -> dict[str, Any]:
    """Send ``tool.confirm`` and return its ``confirm.result``."""
    await p.send(
        {"type": "tool.confirm", "id": rid, "approval_id": approval_id, "decision": decision}
    )
    return await p.expect("confirm.result", id=rid)


def not_accepted(rid: str, approval_id: str, reason: str) -> dict[str, Any]:
    return {
        "type": "confirm.result",
        "id": rid,
        "approval_id": approval_id,
        "accepted": False,
        "reason": reason,
    }


def accepted(rid: str, approval_id: str) -> dict[str, Any]:
    return {"type": "confirm.result", "id": rid, "approval_id": approval_id, "accepted": True}


# -- A1 when a call needs approval -------------------------------------------------------


async def test_a1_requires_approval_gates_the_call(tmp_path: Path) -> None:
    """SPEC I7, A1, A2, A6: a requires_approval call waits at the gate; tool_start has
    approval_id, expires_at."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        before = time.time()
        start = await gated_start(p, "c1")
        assert set(start) == {
            "type",
            "seq",
            "call_id",
            "tool",
            "params",
            "approval_id",
            "expires_at",
        }
        assert (start["seq"], start["tool"], start["params"]) == (2, "gated", {})
        assert before + 300.0 <= start["expires_at"] <= time.time() + 300.0
        assert tt.STATE.calls == {}  # nothing ran while the approval is pending
        assert list(gw.approvals.pending) == [start["approval_id"]]
        assert await confirm(p, start["approval_id"], "allow", "r1") == accepted(
            "r1", start["approval_id"]
        )
        result = await p.terminal("c1")
        assert result["seq"] == 4
        assert tt.STATE.calls == {"gated": 1}
        assert gw.approvals.pending == {}


async def test_a1_confirm_tool_calls_option_gates_every_call(tmp_path: Path) -> None:
    """SPEC A1: with options.confirm_tool_calls an ordinary tool needs approval too."""
    async with serve(tmp_path) as gw:
        async with peer(gw, options={"confirm_tool_calls": True}) as p:
            start = await gated_start(p, "c1", "echo")
            await confirm(p, start["approval_id"], "allow", "r1")
            assert (await p.terminal("c1"))["type"] == "result"
        async with peer(gw) as p:  # without the option, the same tool is not gated
            await p.invoke("c2", "echo", {})  # a new id: "c1" is the user's key (SPEC I15)
            start = await p.expect("tool_start", call_id="c2")
            assert "approval_id" not in start
            assert "expires_at" not in start
            assert (await p.terminal("c2"))["type"] == "result"


async def test_a1_demo_voice_profile_auto_approves_clock_now(gateway: Gateway) -> None:
    """SPEC A1: the voice profile auto-approves clock_now even with confirm_tool_calls."""
    async with peer(gateway, profile="voice", options={"confirm_tool_calls": True}) as p:
        await p.invoke("c1", "clock_now", {"timezone": "UTC"})
        start = await p.expect("tool_start", call_id="c1")
        assert "approval_id" not in start
        assert (await p.terminal("c1"))["type"] == "result"
        await p.invoke("c2", "convert_units", {"value": 1, "from_unit": "m", "to_unit": "cm"})
        start = await p.expect("tool_start", call_id="c2")  # not auto-approved: gated
        await confirm(p, start["approval_id"], "deny", "r2")
        assert (await p.terminal("c2"))["declined"] is True


async def test_a1_profile_auto_approve_beats_requires_approval(tmp_path: Path) -> None:
    """SPEC A1: a requires_approval tool the profile auto-approves runs without tool.confirm."""
    async with serve(tmp_path) as gw, peer(gw, profile="voice") as p:
        await p.invoke("c1", "gated", {})
        assert "approval_id" not in await p.expect("tool_start", call_id="c1")
        assert (await p.terminal("c1"))["type"] == "result"
        assert tt.STATE.calls == {"gated": 1}


# -- A2 ids and the instant-confirm race -------------------------------------------------


async def test_a2_parallel_gated_calls_get_distinct_unguessable_ids(tmp_path: Path) -> None:
    """SPEC A2: each gated call gets its own id of at least 128 random bits."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        for i in range(12):
            await p.invoke(f"c{i}", "gated", {"note": str(i)})
        starts = [await p.expect("tool_start", call_id=f"c{i}") for i in range(12)]
        ids = [s["approval_id"] for s in starts]
        assert len(set(ids)) == 12
        assert all(APPROVAL_ID.fullmatch(i) for i in ids)
        assert all(
            len(base64.urlsafe_b64decode(i[3:] + "=" * (-len(i[3:]) % 4))) * 8 >= 128 for i in ids
        )
        assert [gw.approvals.pending[i].call_id for i in ids] == [f"c{i}" for i in range(12)]
        for i in ids:
            gw.approvals.settle(i, m.Resolution.DENIED, m.ResolutionReason.USER)


async def test_a2_confirm_sent_the_instant_tool_start_arrives(tmp_path: Path) -> None:
    """SPEC A2: a confirm written in the same burst as tool_start's arrival is never lost."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "gated", {})
        while (msg := await p.recv())["type"] != "tool_start":
            pass
        frame = {
            "type": "tool.confirm",
            "id": "r1",
            "approval_id": msg["approval_id"],
            "decision": "allow",
        }
        await p.send(frame)  # before reading anything else
        assert await p.expect("confirm.result", id="r1") == accepted("r1", msg["approval_id"])
        assert (await p.terminal("c1"))["type"] == "result"


async def test_a2_approval_registered_before_tool_start_is_emitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC A2: confirming inside the very emit of tool_start (before it is logged) is accepted."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        verdicts: list[m.NotAcceptedReason | None] = []
        original = Session.emit

        def emit(self: Session, event: m.DurableEvent) -> bytes:
            if isinstance(event, m.ToolStart) and event.approval_id:
                verdicts.append(
                    gw.approvals.confirm(self.id, self.user, event.approval_id, m.Decision.ALLOW)
                )
            return original(self, event)

        monkeypatch.setattr(Session, "emit", emit)
        await p.invoke("c1", "gated", {})
        result = await p.terminal("c1")
        assert verdicts == [None]
        assert result["type"] == "result"
        assert tt.STATE.calls == {"gated": 1}
        resolved = await_seen(p, "tool.resolved")
        assert (resolved["resolution"], resolved["reason"]) == ("allowed", "user")


def await_seen(p: Peer, type_: str) -> dict[str, Any]:
    found = [msg for msg in p.seen if msg["type"] == type_]
    assert len(found) == 1
    return found[0]


async def test_a2_registry_accepts_a_confirm_before_anything_awaits() -> None:
    """SPEC A2: Approvals.open registers at once; an immediate confirm settles the decision."""
    from gateway.approvals import Approvals

    approvals = Approvals(300.0, time.time)
    approval = approvals.open("s1", "alice", "c1", "gated", {"x": 1})
    assert approvals.confirm("s1", "alice", approval.approval_id, m.Decision.ALLOW) is None
    outcome = await asyncio.wait_for(approval.wait(), 1.0)
    assert (outcome.resolution, outcome.reason, outcome.always) == (
        m.Resolution.ALLOWED,
        m.ResolutionReason.USER,
        False,
    )
    assert approvals.pending == {}
    assert (
        approvals.confirm("s1", "alice", approval.approval_id, m.Decision.DENY)
        is m.NotAcceptedReason.ALREADY_DECIDED
    )


async def test_a3_hundred_concurrent_confirms_exactly_one_wins(tmp_path: Path) -> None:
    """SPEC A3: 100 confirms for one id at once: one accepted, 99 already_decided, one run."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        approval_id = (await gated_start(p, "c1"))["approval_id"]
        await asyncio.gather(
            *(
                p.send(
                    {
                        "type": "tool.confirm",
                        "id": f"r{i}",
                        "approval_id": approval_id,
                        "decision": "allow",
                    }
                )
                for i in range(100)
            )
        )
        results = [await p.expect("confirm.result", id=f"r{i}") for i in range(100)]
        assert sum(r["accepted"] for r in results) == 1
        assert sorted(r.get("reason", "") for r in results) == [""] + ["already_decided"] * 99
        await first_terminal(p, "c1")
        assert tt.STATE.calls == {"gated": 1}
        assert [msg["type"] for msg in p.seen if msg.get("call_id") == "c1"] == [
            "tool_start",
            "tool.resolved",
            "result",
        ]


# -- A3 decisions, grants, refusals ------------------------------------------------------


async def test_a3_allow_runs_and_deny_declines(tmp_path: Path) -> None:
    """SPEC A3, A5, A6: allow runs the tool; deny ends with a declined result, not an error."""
    async with serve(tmp_path, calls={"declined_message": "User said no."}) as gw, peer(gw) as p:
        first = await gated_start(p, "c1")
        await confirm(p, first["approval_id"], "allow", "r1")
        resolved = await p.expect("tool.resolved", call_id="c1")
        assert resolved == {
            "type": "tool.resolved",
            "seq": 3,
            "call_id": "c1",
            "approval_id": first["approval_id"],
            "tool": "gated",
            "resolution": "allowed",
            "reason": "user",
            "always": False,
        }
        assert (await p.terminal("c1"))["seq"] == 4
        second = await gated_start(p, "c2")
        await confirm(p, second["approval_id"], "deny", "r2")
        resolved = await p.expect("tool.resolved", call_id="c2")
        assert (resolved["resolution"], resolved["reason"]) == ("denied", "user")
        result = await p.terminal("c2")
        assert result == {
            "type": "result",
            "seq": 7,
            "call_id": "c2",
            "tool": "gated",
            "declined": True,
            "replaced": False,
            "result": {"declined": True, "reason": "user", "message": "User said no."},
        }
        assert tt.STATE.calls == {"gated": 1}


async def test_a3_allow_always_grant_listed_revoked_then_gated_again(tmp_path: Path) -> None:
    """SPEC A3: allow_always skips later approvals; listed; revoke restores the gate."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        start = await gated_start(p, "c1")
        await confirm(p, start["approval_id"], "allow_always", "r1")
        assert (await p.expect("tool.resolved", call_id="c1"))["always"] is True
        await p.terminal("c1")
        await p.send({"type": "grants.list", "id": "g1"})
        assert await p.expect("grants", id="g1") == {
            "type": "grants",
            "id": "g1",
            "tools": ["gated"],
        }
        await p.invoke("c2", "gated", {})
        assert "approval_id" not in await p.expect("tool_start", call_id="c2")
        await p.terminal("c2")
        await p.send({"type": "grants.revoke", "id": "g2", "tool": "gated"})
        assert await p.expect("grants", id="g2") == {"type": "grants", "id": "g2", "tools": []}
        await p.send({"type": "grants.revoke", "id": "g3", "tool": "gated"})
        assert (await p.expect("error", id="g3"))["code"] == "unknown_grant"
        third = await gated_start(p, "c3")
        await confirm(p, third["approval_id"], "deny", "r3")
        assert (await p.terminal("c3"))["declined"] is True
        assert tt.STATE.calls == {"gated": 2}


async def test_a3_duplicate_unknown_forged_and_foreign_confirms_are_refused(tmp_path: Path) -> None:
    """SPEC A3, A7: duplicate, unknown, forged, cross-session ids: not accepted, no change;
    another session's id is ``unknown`` like a forged one (F26)."""
    async with (
        serve(tmp_path) as gw,
        peer(gw) as alice,
        peer(gw) as alice2,
        peer(gw, token="bob-token") as bob,
    ):
        approval_id = (await gated_start(alice, "c1"))["approval_id"]
        forged = approval_id[:-1] + ("A" if approval_id[-1] != "A" else "B")
        assert await confirm(alice, forged, "allow", "f1") == not_accepted("f1", forged, "unknown")
        assert await confirm(alice, "ap_never_issued", "allow", "f2") == not_accepted(
            "f2", "ap_never_issued", "unknown"
        )
        assert await confirm(bob, approval_id, "allow", "b1") == not_accepted(
            "b1", approval_id, "unknown"
        )
        assert await confirm(alice2, approval_id, "deny", "a2") == not_accepted(
            "a2", approval_id, "unknown"
        )
        assert approval_id in gw.approvals.pending
        assert tt.STATE.calls == {}
        assert await confirm(alice, approval_id, "allow", "a1") == accepted("a1", approval_id)
        assert (await alice.terminal("c1"))["declined"] is False
        assert await confirm(alice, approval_id, "deny", "a3") == not_accepted(
            "a3", approval_id, "already_decided"
        )
        assert await confirm(bob, approval_id, "allow", "b2") == not_accepted(
            "b2", approval_id, "unknown"
        )
        assert tt.STATE.calls == {"gated": 1}


# -- A4 timeout, cancel, end of session, reconnect ---------------------------------------


async def test_a4_timeout_denies_and_late_confirm_is_expired(tmp_path: Path) -> None:
    """SPEC A4: no decision within approval_timeout -> denied (timeout); a late allow is expired."""
    with audit_records() as records:
        async with serve(tmp_path, calls={"approval_timeout": 300 * MS}) as gw, peer(gw) as p:
            approval_id = (await gated_start(p, "c1"))["approval_id"]
            resolved = await p.expect("tool.resolved", call_id="c1")
            assert (resolved["resolution"], resolved["reason"]) == ("denied", "timeout")
            result = await p.terminal("c1")
            assert result["declined"] is True
            assert result["result"]["reason"] == "timeout"
            assert await confirm(p, approval_id, "allow", "r1") == not_accepted(
                "r1", approval_id, "expired"
            )
            assert tt.STATE.calls == {}
            assert gw.approvals.pending == {}
            assert gw.metrics.pending_approvals._value.get() == 0
    assert [(r["outcome"], r["approval"]["reason"], r["approval"]["by"]) for r in records] == [
        ("approval_timeout", "timeout", "server"),
    ]


async def test_a4_a_confirm_past_expires_at_is_expired_before_the_timer_fires(
    tmp_path: Path,
) -> None:
    """SPEC A4, A3: the deadline is the `expires_at` tool_start announced, on the
    gateway's clock. The clock passes it while the approval's timer (real time, 300 s)
    has not fired: an allow then is not accepted (`expired`), the call is denied
    `timeout` and its tool never runs. Before, the allow was accepted and the tool ran
    past the announced deadline."""
    tt.reset()
    calls = {**tt.HOOKS, "approval_timeout": 300.0, "default_timeout": 5.0}
    clock = Clock()
    gw = Gateway(
        settings_for(tmp_path, catalog=tt.write_catalog(tmp_path), calls=calls), clock=clock
    )
    await gw.start()
    try:
        async with peer(gw) as p:
            start = await gated_start(p, "c1")
            clock.ahead = 301.0
            assert await confirm(p, start["approval_id"], "allow", "r1") == not_accepted(
                "r1", start["approval_id"], "expired"
            )
            result = await p.terminal("c1")
            resolved = [msg for msg in p.seen if msg["type"] == "tool.resolved"]
            assert [(r["resolution"], r["reason"]) for r in resolved] == [("denied", "timeout")]
            assert (result["declined"], result["result"]["reason"]) == (True, "timeout")
            assert tt.STATE.calls == {}
            assert gw.approvals.pending == {}
    finally:
        tt.STATE.release.set()
        await gw.drain()


async def test_a4_cancel_while_pending_denies_and_ends_cancelled(tmp_path: Path) -> None:
    """SPEC A4, I8: cancel while pending: tool.resolved cancelled, then call.error."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        approval_id = (await gated_start(p, "c1"))["approval_id"]
        await p.send({"type": "call.cancel", "call_id": "c1"})
        resolved = await p.expect("tool.resolved", call_id="c1")
        assert (resolved["resolution"], resolved["reason"], resolved["seq"]) == (
            "denied",
            "cancelled",
            3,
        )
        err = await p.terminal("c1")
        assert (err["type"], err["code"], err["seq"]) == ("call.error", "cancelled", 4)
        assert await confirm(p, approval_id, "allow", "r1") == not_accepted(
            "r1", approval_id, "already_decided"
        )
        assert tt.STATE.calls == {}
        assert gw.approvals.pending == {}
        assert gw.pipeline._call_state == {}


async def test_a4_bye_denies_pending_approvals_disconnected(tmp_path: Path) -> None:
    """SPEC A4: bye denies the pending approvals with reason disconnected."""
    with audit_records() as records:
        async with serve(tmp_path) as gw:
            async with peer(gw) as p:
                approval_id = (await gated_start(p, "c1"))["approval_id"]
                await p.send({"type": "bye"})
                async with asyncio.timeout(10):
                    await p.ws.wait_closed()
                assert p.ws.close_code == 4001 or p.ws.close_code == 1000
            assert gw.approvals.pending == {}
            assert gw.pipeline._call_state == {}
            assert gw.approvals._refusal("other", approval_id) is m.NotAcceptedReason.UNKNOWN
    assert len(records) == 1
    assert records[0]["outcome"] == "cancelled"
    assert (records[0]["approval"]["resolution"], records[0]["approval"]["reason"]) == (
        "denied",
        "disconnected",
    )
    assert tt.STATE.calls == {}


async def test_a4_pending_approval_survives_reconnect(tmp_path: Path) -> None:
    """SPEC A4, D3: a drop inside the resume window keeps the approval; replay resends."""
    async with serve(tmp_path) as gw:
        async with peer(gw) as p:
            start = await gated_start(p, "c1")
            welcome = p.welcome
            p.ws.transport.abort()
        assert start["approval_id"] in gw.approvals.pending
        async with peer(
            gw, session_id=welcome["session_id"], resume_token=welcome["resume_token"], last_seq=1
        ) as p2:
            assert p2.welcome["resumed"] is True
            replayed = await p2.expect("tool_start", call_id="c1")
            assert replayed == start
            assert await confirm(p2, start["approval_id"], "allow", "r1") == accepted(
                "r1", start["approval_id"]
            )
            result = await p2.terminal("c1")
            assert result["seq"] == 4
            assert tt.STATE.calls == {"gated": 1}
        assert gw.approvals.pending == {}


# -- A6 audit ----------------------------------------------------------------------------


async def test_a6_audit_records_decision_by_and_at(tmp_path: Path) -> None:
    """SPEC A6: the audit record of a gated call holds the decision, who made it and when."""
    with audit_records() as records:
        async with serve(tmp_path) as gw, peer(gw) as p:
            approval_id = (await gated_start(p, "c1"))["approval_id"]
            before = time.time()
            await confirm(p, approval_id, "deny", "r1")
            await p.terminal("c1")
            await p.invoke("c2", "echo", {})
            assert "approval_id" not in await p.expect("tool_start", call_id="c2")
            await p.terminal("c2")
    gated, plain = records
    assert gated["outcome"] == "rejected_by_user"
    approval = gated["approval"]
    assert {k: approval[k] for k in ("approval_id", "resolution", "reason", "always", "by")} == {
        "approval_id": approval_id,
        "resolution": "denied",
        "reason": "user",
        "always": False,
        "by": "alice",
    }
    assert before <= approval["at"] <= time.time()
    assert plain["approval"] is None
    assert plain["outcome"] == "ok"
