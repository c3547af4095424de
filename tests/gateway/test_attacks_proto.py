"""Attacks at the protocol level, one test per fault an attacking helper found (SPEC C3,
I15, E2, D6, A3, A4, J3, S2, E1): a profile that lacks a tool getting that tool's outcome
through the principal's call ledger; re-sends past the rate limit; session changes
answered in a store outage and undone by a crash; repeated headers. Each states the
input, the right behaviour and what was seen before the fix. The two I12/I15 tests pin
the documented limit of attachments across a restart and the client's way through it,
a re-send after the resume (docs/protocol.md).
The replaced socket (D4), a peer that never reads (D5) and pipelined frames (E3) are
tested in ``test_d4_replaced_socket.py`` and ``test_wslib_bounds.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from tests.gateway import ledger_tools as lt
from tests.gateway import proto_tools
from tests.gateway.test_d6_session_changes import _reply
from tests.gateway.test_j6_crash_decided import commits_failing
from tests.support import (
    CONVERT,
    MS,
    WAIT,
    Peer,
    barrier,
    closed,
    gateway_script,
    peer,
    peer_at,
    resume_fields,
    running,
    script_server,
    settings_for,
)

NOTE = {"title": "payroll", "body": "salaries 2027"}
"""Arguments of a demo ``notes_create`` call (capability ``notes.write``)."""


async def _answer(p: Peer, call_id: str) -> dict[str, Any]:
    """The first frame about ``call_id``: its terminal event, or an ``error`` reply
    naming it (``details.call_id``)."""
    async with asyncio.timeout(WAIT):
        while True:
            msg = await p.recv()
            if msg.get("call_id") == call_id and msg["type"] in (
                "result",
                "dispatched",
                "call.error",
            ):
                return msg
            if msg["type"] == "error" and (msg.get("details") or {}).get("call_id") == call_id:
                return msg


@pytest.mark.parametrize("when", ["finished", "running"])
async def test_c3_i15_a_profile_without_the_tool_never_gets_its_outcome(
    tmp_path: Path, when: str
) -> None:
    """SPEC C3, I1, I15: a tool absent from a session's catalog does not exist for it;
    invoking it fails exactly like an unknown tool. Input: alice runs ``notes_create``
    (capability ``notes.write``) in a ``demo`` session under call id ``n1``; her
    ``readonly`` session (no ``notes.write``: the tool is not in its catalog) sends the
    same ``invoke`` (same call id, tool and params), after the call ``finished`` or
    while it is ``running`` (approval pending). Right: ``call.error unknown_tool``, as
    for any call of that tool from this session. Seen: the ledger answers first, and
    the readonly session gets the write tool's recorded ``result`` (or is attached to
    the running call and gets it when it ends)."""
    async with (
        running(settings_for(tmp_path)) as gw,
        peer(gw, options={"confirm_tool_calls": when == "running"}) as demo,
    ):
        await demo.invoke("n1", "notes_create", NOTE)
        if when == "running":
            start = await demo.expect("tool_start", call_id="n1")
            assert start.get("approval_id")
        else:
            assert (await demo.terminal("n1"))["type"] == "result"
        async with peer(gw, profile="readonly") as ro:
            names = {t["name"] for t in (await ro.expect("catalog"))["tools"]}
            assert "notes_create" not in names
            await ro.invoke("n0", "notes_create", NOTE)
            own = await _answer(ro, "n0")
            assert (own["type"], own.get("code")) == ("call.error", "unknown_tool")
            await ro.invoke("n1", "notes_create", NOTE)
            # While n1 still waits for its approval (running), or after it finished.
            reply = await _answer(ro, "n1")
            assert (reply["type"], reply.get("code")) == ("call.error", "unknown_tool"), reply
            if when == "running":
                approval = start["approval_id"]
                await demo.send(
                    {"type": "tool.confirm", "approval_id": approval, "decision": "allow"}
                )
                assert (await demo.terminal("n1"))["type"] == "result"
            assert await barrier(ro) == []  # nothing more about n1 reached ro


async def test_e2_re_sends_of_a_finished_call_are_rate_limited_too(tmp_path: Path) -> None:
    """SPEC E2, I12: the invoke rate per session bounds every ``invoke``. Input:
    ``invoke_rate`` ~0, ``invoke_burst`` 2; call ``c1`` finishes; the client then sends
    the same ``invoke`` 50 times. Right: past the burst, the re-sends are refused
    ``rate_limited`` (typed, nothing recorded; the client retries later). Seen: the
    re-sends bypass the limit (the recorded-outcome path is taken before the rate
    check): every one is answered with the recorded ``result``, each costing the
    server a store flush and read on the event loop, at whatever rate the client sends."""
    settings = settings_for(tmp_path, limits={"invoke_rate": 0.001, "invoke_burst": 2})
    async with running(settings) as gw, peer(gw) as p:
        await p.invoke("c1", "convert_units", CONVERT)
        assert (await p.terminal("c1"))["type"] == "result"
        for _ in range(50):
            await p.invoke("c1", "convert_units", CONVERT)
        answers = [await _answer(p, "c1") for _ in range(50)]
        kinds = [a["type"] if a["type"] != "error" else a["code"] for a in answers]
        # The burst of 2: c1 took one token, the first re-send the other.
        assert kinds == ["result"] + ["rate_limited"] * 49, kinds


async def test_i12_i15_an_attached_session_re_sends_after_a_crash_and_gets_the_terminal(
    tmp_path: Path,
) -> None:
    """SPEC I12, I15, D3: every ``invoke`` gets exactly one terminal reply; a re-send
    from another session of the principal attaches to the running call and gets its
    one terminal reply. Input: alice's session A runs ``held_charge`` as ``r1``; her
    session B sends the same ``invoke`` (attached, nothing answered yet); the server is
    SIGKILLed and restarted; A and B resume (``resumed: true``). The documented limit
    (docs/protocol.md, ``invoke``): the attachment lived in memory, so A gets the
    restart's ``cancelled`` by replay and B's resumed log holds nothing for ``r1``; B,
    as the contract asks, re-sends its waiting invoke and gets that recorded
    ``cancelled``. The tool ran once."""
    settings = lt.ledger_settings(tmp_path)
    script = gateway_script("tests.gateway.ledger_tools:ledger_settings")
    async with script_server(script, str(tmp_path)) as first:
        url = f"ws://127.0.0.1:{first.port}/"
        async with peer_at(url) as a, peer_at(url) as b:
            await a.invoke("r1", "held_charge", {"amount": 100})
            await a.expect("tool_start", call_id="r1")
            async with asyncio.timeout(WAIT):
                while lt.runs(settings.data_dir) != ["r1 100"]:  # noqa: ASYNC110 - a file
                    await asyncio.sleep(10 * MS)
            await b.invoke("r1", "held_charge", {"amount": 100})
            await barrier(b)  # attached: no reply
            await barrier(a)
            await first.crash()
    lt.reset()
    async with running(settings) as gw:
        last = max((msg["seq"] for msg in a.seen if "seq" in msg), default=0)
        async with peer(gw, hello=False) as again:
            await again.hello(**resume_fields(a, last))
            assert again.welcome["resumed"] is True
            mine = await _answer(again, "r1")
        last = max((msg["seq"] for msg in b.seen if "seq" in msg), default=0)
        async with peer(gw, hello=False) as b2:
            await b2.hello(**resume_fields(b, last))
            assert b2.welcome["resumed"] is True
            assert [m for m in await barrier(b2) if m.get("call_id") == "r1"] == []
            await b2.invoke("r1", "held_charge", {"amount": 100})  # the client's re-send
            theirs = await _answer(b2, "r1")
    for reply in (mine, theirs):
        assert (reply["type"], reply["code"], reply["message"]) == (
            "call.error",
            "cancelled",
            "the server restarted while this call ran",
        )
    assert lt.runs(settings.data_dir) == ["r1 100"]


async def test_i12_i15_an_attached_session_re_sends_after_a_deploy_and_gets_the_result(
    tmp_path: Path,
) -> None:
    """SPEC I12, I15, A4, S4: as above without a crash. Input: alice's session A invokes
    the gated ``gated_peek`` as ``g1`` (approval pending); her session B sends the same
    ``invoke`` (attached); the server drains (a deploy: the pending approval is handed to
    the next start) and starts again; A and B resume; A allows ``g1``; the call runs.
    The documented limit (docs/protocol.md, ``invoke``): the attachment did not survive
    the drain, so B's resumed session is not attached; B re-sends its waiting invoke
    (the contract), is attached again, and gets ``g1``'s ``result`` with A."""
    settings = lt.ledger_settings(tmp_path)
    async with running(settings) as gw, peer(gw) as a, peer(gw) as b:
        await a.invoke("g1", "gated_peek", {})
        start = await a.expect("tool_start", call_id="g1")
        await b.invoke("g1", "gated_peek", {})
        await barrier(b)
    async with running(settings) as gw:
        lt.GATE.outbox = gw.outbox  # gated_peek reads it
        last_a = max(msg["seq"] for msg in a.seen if "seq" in msg)
        last_b = max(msg["seq"] for msg in b.seen if "seq" in msg)
        async with peer(gw, hello=False) as a2, peer(gw, hello=False) as b2:
            await a2.hello(**resume_fields(a, last_a))
            await b2.hello(**resume_fields(b, last_b))
            assert (a2.welcome["resumed"], b2.welcome["resumed"]) == (True, True)
            await b2.invoke("g1", "gated_peek", {})  # the client's re-send: attached
            assert [m for m in await barrier(b2) if m.get("call_id") == "g1"] == []
            confirm = {"type": "tool.confirm", "approval_id": start["approval_id"]}
            await a2.send({**confirm, "decision": "allow", "id": "ok"})
            assert (await a2.expect("confirm.result", id="ok"))["accepted"] is True
            mine = await _answer(a2, "g1")
            theirs = await _answer(b2, "g1")
    assert (mine["type"], theirs["type"]) == ("result", "result"), (mine, theirs)
    assert theirs["result"] == mine["result"]


async def test_a3_d6_a_revoked_grant_stays_revoked_after_a_crash_in_a_store_outage(
    tmp_path: Path,
) -> None:
    """SPEC A3, D6, A1: "always allow" grants can be revoked over the socket; a commit
    that fails loses nothing an earlier commit made durable, and what the client was
    told must hold. Input: alice allows ``notes_delete`` always (grant durable); another
    process then holds ``BEGIN IMMEDIATE`` on the SQLite file (commits fail: ``invoke``
    is refused ``unavailable``); alice sends ``grants.revoke notes_delete`` and gets
    ``grants: []``; the server is SIGKILLed; the lock goes; the server starts again and
    alice resumes. Right: the grant stays revoked (the revoke is refused ``unavailable``
    while it cannot be stored, or it is kept): ``grants.list`` is ``[]`` and the next
    ``notes_delete`` waits for approval. Seen: the ``grants`` reply confirmed a revoke
    that was only in memory; after the restart the grant is back and ``notes_delete``
    runs with no approval."""
    script = gateway_script("tests.support:settings_for")
    db = tmp_path / "data" / "toolbus.db"
    async with (
        script_server(script, str(tmp_path)) as srv,
        peer_at(f"ws://127.0.0.1:{srv.port}/") as a,
    ):
        await a.invoke("d1", "notes_delete", {"note_id": 1})
        start = await a.expect("tool_start", call_id="d1")
        decision = {"approval_id": start["approval_id"], "decision": "allow_always"}
        await a.send({"type": "tool.confirm", **decision})
        await _answer(a, "d1")  # durable after the grant (committed with tool.resolved)
        await a.send({"type": "grants.list", "id": "g0"})
        assert (await a.expect("grants", id="g0"))["tools"] == ["notes_delete"]
        async with commits_failing(db, a, srv.port):
            await a.send({"type": "grants.revoke", "id": "rv", "tool": "notes_delete"})
            revoked = await a.expect("grants", id="rv")
            assert revoked["tools"] == []  # the user is told it is revoked: journaled
            await srv.crash()
    last = max(msg["seq"] for msg in a.seen if "seq" in msg)
    async with running(settings_for(tmp_path)) as gw, peer(gw, hello=False) as again:
        await again.hello(**resume_fields(a, last))
        assert again.welcome["resumed"] is True
        await again.send({"type": "grants.list", "id": "g1"})
        grants = await again.expect("grants", id="g1")
        await again.invoke("d2", "notes_delete", {"note_id": 2})
        first = await again.recv()
        while first.get("call_id") != "d2":
            first = await again.recv()
        assert (grants["tools"], first["type"], bool(first.get("approval_id"))) == (
            [],
            "tool_start",
            True,
        ), (grants, first)


async def test_j3_j6_d6_a_job_cancelled_in_a_store_outage_is_answered_and_never_runs(
    tmp_path: Path,
) -> None:
    """SPEC J3, J6, D6: ``job.cancel`` answers with the job's final state once stored
    (or a typed error), and a job reported cancelled never runs. Input: one job slot per
    session; job J1 holds it, J2 (``mark_job``) waits ``queued``; another process locks
    the SQLite file (commits fail: ``invoke`` refused ``unavailable``); alice sends
    ``job.cancel J2``; the server is SIGKILLed, the lock goes, it starts again and alice
    resumes. Right: ``job.cancel`` gets an answer (``job`` cancelled, or ``error``
    ``unavailable``), and a job the client was not told is still pending does not run
    behind its back. Seen: no answer at all (the reply task's store read fails inside a
    background task), and after the restart J2 runs."""
    script = gateway_script("tests.gateway.proto_tools:one_job_at_a_time")
    db = tmp_path / "data" / "toolbus.db"
    async with (
        script_server(script, str(tmp_path)) as srv,
        peer_at(f"ws://127.0.0.1:{srv.port}/") as a,
    ):
        await a.invoke("j1", "hold_job", {})
        await a.invoke("j2", "mark_job", {})
        j2 = (await _answer(a, "j2"))["job_id"]
        await a.send({"type": "job.get", "id": "g", "job_id": j2})
        assert (await a.expect("job", id="g"))["job"]["state"] == "queued"
        async with commits_failing(db, a, srv.port):
            await a.send({"type": "job.cancel", "id": "cx", "job_id": j2})
            reply = await _reply(a, "cx")
            await srv.crash()
    assert (reply["type"], reply.get("code")) == ("error", "unavailable"), reply
    async with (
        running(proto_tools.one_job_at_a_time(tmp_path)) as gw,
        peer(gw, hello=False) as again,
    ):
        last = max(msg["seq"] for msg in a.seen if "seq" in msg)
        await again.hello(**resume_fields(a, last))
        # The cancel was refused, so the job goes on: the restart ends the held job
        # (not idempotent: failed), and j2 gets the slot and runs.
        done = await again.expect("job.done", job_id=j2)
    assert (done["job_id"], proto_tools.runs(tmp_path)) == (j2, ["j2"])


async def test_a4_d6_a_session_ended_by_bye_in_a_store_outage_stays_ended(
    tmp_path: Path,
) -> None:
    """SPEC A4, D2, D6: ``bye`` ends the session for good (close 4001, no resume).
    Input: another process locks the SQLite file (commits fail); alice sends ``bye`` and
    is closed 4001; the server is SIGKILLed, the lock goes, it starts again; the session
    is resumed with its id and resume token. Right: ``resumed: false`` (the ended
    session stays ended; or ``bye`` is refused while it cannot be stored). Seen: the
    deletion was only staged; the restart brings the session back and the resume
    succeeds."""
    script = gateway_script("tests.support:settings_for")
    db = tmp_path / "data" / "toolbus.db"
    async with (
        script_server(script, str(tmp_path)) as srv,
        peer_at(f"ws://127.0.0.1:{srv.port}/") as a,
    ):
        await barrier(a)  # welcome came once the session row was durable
        async with commits_failing(db, a, srv.port):
            await a.send({"type": "bye"})
            code = (await closed(a)).rcvd
            assert code is not None
            assert code.code == 4001  # once the session's end is journaled
            await srv.crash()
    async with running(settings_for(tmp_path)) as gw, peer(gw, hello=False) as again:
        await again.hello(**resume_fields(a, 1))
        assert again.welcome["resumed"] is False, again.welcome


async def test_s2_e1_repeated_credential_or_origin_headers_are_refused_typed(
    tmp_path: Path,
) -> None:
    """SPEC S2, E1: bad input gets a typed answer, never an internal error. Input: (a) an
    upgrade with two ``Authorization: Bearer`` headers (alice's and bob's tokens) and a
    ``hello`` without ``token``; (b) an upgrade with two ``Origin`` headers (one allowed,
    one not). Right: (a) ``error auth_failed`` and close 4003, as for any credential it
    cannot accept; (b) the upgrade refused 403 (or 400) with its reason. Seen: (a) the
    header read raises ``MultipleValuesError`` inside ``hello``: close 1011 and a logged
    traceback; (b) the same exception in the upgrade check: HTTP 500 and a traceback,
    for any unauthenticated client."""
    from websockets.datastructures import Headers
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    async with running(settings_for(tmp_path)) as gw:
        two = Headers()
        two["Authorization"] = "Bearer alice-token"
        two["Authorization"] = "Bearer bob-token"
        async with connect(gw.url, subprotocols=["toolbus.v1"], additional_headers=two) as ws:  # type: ignore[list-item]
            p = Peer(ws)
            await p.send({"type": "hello", "profile": "demo"})
            try:
                first = await p.recv()
            except ConnectionClosed:
                first = {"type": "closed"}
            code = (await closed(p)).rcvd if first["type"] != "closed" else ws.close_code
            sent = code.code if code is not None and hasattr(code, "code") else code
        origins = Headers()
        origins["Origin"] = f"http://127.0.0.1:{gw.port}"
        origins["Origin"] = "https://evil.example"
        try:
            async with connect(gw.url, subprotocols=["toolbus.v1"], additional_headers=origins):  # type: ignore[list-item]
                status = 101
        except InvalidStatus as exc:
            status = exc.response.status_code
        assert (first.get("code"), sent, status in (400, 403)) == ("auth_failed", 4003, True), (
            first,
            sent,
            status,
        )
