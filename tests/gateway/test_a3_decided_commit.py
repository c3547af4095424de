"""A call whose approval was just decided commits at once and runs in the same loop
turn, so its ``result`` leaves in one write with ``confirm.result`` and
``tool.resolved`` (SPEC A3, A6, D1, I15; issue 13, P7).

Before, the decided call waited for the tick's flush: that flush sent ``confirm.result``
and ``tool.resolved`` alone, the handler ran one turn later and its ``result`` went in a
second write, a second wake-up of the client. The decision is still committed before
the handler starts (``test_a3_an_allowed_call_killed_in_its_handler_stays_allowed``
kills the process in the handler). Checked on a real gateway: the handler notes how
many frames wait in the outbox when it starts.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from protocol.errors import ErrorCode
from tests.gateway import ledger_tools as lt
from tests.gateway import test_j6_crash_promoted as cp
from tests.gateway import test_j6_crash_unstarted as cu
from tests.gateway.store_faults import until
from tests.pg_support import fresh_schema
from tests.support import peer, peer_at, resume_fields, running, script_server


async def _decided(tmp_path: Path, decision: str) -> tuple[list[int], list[str], str]:
    """Invoke ``gated_peek`` and answer its approval; return what the handler saw
    queued, the types of the frames that followed the decision, and the store."""
    gate = lt.reset()
    settings = lt.ledger_settings(tmp_path)
    async with running(settings) as gw, peer(gw, options={"tool_start": "gated"}) as p:
        gate.outbox = gw.outbox
        await p.invoke("g1", "gated_peek")
        start = await p.expect("tool_start", call_id="g1")
        confirm = {"type": "tool.confirm", "approval_id": start["approval_id"]}
        await p.send({**confirm, "id": "r1", "decision": decision})
        await p.terminal("g1")
        after = p.seen[p.seen.index(start) + 1 :]
        store = type(gw.store).__name__
    return gate.queued, [m["type"] for m in after], store


async def test_a3_an_allowed_calls_result_leaves_with_its_resolution(tmp_path: Path) -> None:
    """The handler starts with `confirm.result` and `tool.resolved` still queued: the
    commit that made the decision durable did not send them, the flush after the
    handler sends all three."""
    queued, after, store = await _decided(tmp_path, "allow")
    assert store == "SqliteStore"
    assert queued == [2]
    assert after == ["confirm.result", "tool.resolved", "result"]


async def test_a3_on_postgresql_too_the_decided_commit_is_made_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on PostgreSQL, where the commit at once is a real commit before the
    handler (SPEC A3)."""
    with fresh_schema() as url:
        monkeypatch.setenv("TOOLBUS_STORE__URL", url)
        queued, after, store = await _decided(tmp_path, "allow")
    assert store == "PgStore"
    assert queued == [2]
    assert after == ["confirm.result", "tool.resolved", "result"]


async def test_a5_a_denied_call_never_starts_its_handler(tmp_path: Path) -> None:
    """A denied call ends with its declined `result`; the handler never ran."""
    queued, after, _ = await _decided(tmp_path, "deny")
    assert queued == []
    assert after == ["confirm.result", "tool.resolved", "result"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a3_an_allowed_call_waiting_for_a_thread_at_a_crash_says_it_did_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """SPEC A3, J6, I15: gated `c1` is allowed while the one worker thread is held by
    `h1`, so its handler waits for the thread; the server is SIGKILLed once the wait is
    durable. After the restart the resumed session gets `c1`'s `tool.resolved`
    `allowed` by the user (the decision was durable before the handler), then
    ``unavailable`` "did not run"; a second `allow` is not accepted, a re-send answers
    the same, and `c1` never ran."""
    with contextlib.ExitStack() as stack:
        if backend == "postgresql":
            monkeypatch.setenv("TOOLBUS_STORE__URL", stack.enter_context(fresh_schema()))
            backend = os.environ["TOOLBUS_STORE__URL"]
        else:
            monkeypatch.delenv("TOOLBUS_STORE__URL", raising=False)
        await _allowed_waiting_then_killed(tmp_path, backend)


async def _allowed_waiting_then_killed(tmp_path: Path, backend: str) -> None:
    settings = cp.promoted_settings(tmp_path)
    ledger = cu.DurableLedger(settings.data_dir, backend)
    try:
        async with (
            script_server(cp.SERVER_SCRIPT, str(tmp_path)) as first,
            peer_at(f"ws://127.0.0.1:{first.port}/") as p,
        ):
            await p.invoke("h1", "hold", {})
            await until(lambda: cu.runs(settings.data_dir) == ["h1"], "h1 to hold the thread")
            await p.invoke("c1", "gated_note", {})
            start = await p.expect("tool_start", call_id="c1")
            confirm = {"type": "tool.confirm", "approval_id": start["approval_id"]}
            await p.send({**confirm, "id": "r1", "decision": "allow"})
            await p.expect("confirm.result", id="r1")
            await until(lambda: ledger.unstarted("c1"), "c1's wait recorded durably")
            await first.crash()
        assert first.proc.returncode == -9
    finally:
        ledger.close()
    assert cu.runs(settings.data_dir) == ["h1"]
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, start["seq"])) as again:
            assert again.welcome["resumed"] is True
            end = await again.terminal("c1")
            seen = again.seen[: again.seen.index(end)]
            resolved = [m for m in seen if m["type"] == "tool.resolved" and m["call_id"] == "c1"]
            assert [(m["resolution"], m["reason"]) for m in resolved] == [("allowed", "user")]
            assert (end["type"], end["code"], end["message"]) == (
                "call.error",
                ErrorCode.UNAVAILABLE,
                cu.UNSTARTED,
            ), end
            await again.send({**confirm, "id": "r2", "decision": "allow"})
            late = await again.expect("confirm.result", id="r2")
            assert late["accepted"] is False, late
        async with peer(gw) as other:
            await other.invoke("c1", "gated_note", {})
            resent = await other.terminal("c1")
            assert (resent["type"], resent.get("code")) == ("call.error", ErrorCode.UNAVAILABLE)
    assert cu.runs(settings.data_dir) == ["h1"]
