"""Faults found by adversarial probing, each pinned with its whole kind (SPEC S1, S2, S5, D3,
D5, E1, E2, O2)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.server import Gateway
from tests.gateway import tools_for_tests as tt
from tests.support import WAIT, closed, peer, resume_fields, running, sequenced, settings_for


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("garbage", "malformed_json"),
        ('{"type":"hello","a":NaN}', "nan_not_allowed"),
        ('{"type":"hello","type":"hello"}', "duplicate_key"),
        ('{"type":"hello","x":' + "[" * 1000 + "]" * 1000 + "}", "too_deep"),
        ('{"type":"hello","token":123}', "wrong_type"),
        ('{"type":"hello","context":{"a":1}}', "wrong_type"),
        ('{"type":"hello","last_seq":-1}', "invalid_value"),
        ('{"type":"hello","profile":""}', "invalid_value"),
        ('{"type":"hello","extra":1}', "extra_field"),
    ],
    ids=["garbage", "nan", "dup", "deep", "token-int", "ctx-int", "seq", "profile", "extra"],
)
async def test_bad_first_frame_closes_1008_with_its_code(
    gateway: Gateway, frame: str, code: str
) -> None:
    """SPEC S1/E1: a first frame that is not a valid hello gets its typed error, then 1008
    (never 1011 with a traceback)."""
    async with peer(gateway, hello=False) as p:
        await p.send(frame)
        error = await p.expect("error")
        assert error["code"] == code
        assert (await closed(p)).rcvd.code == 1008


async def test_deep_nesting_after_hello_keeps_the_connection(gateway: Gateway) -> None:
    """SPEC E1: a thousand levels of nesting is too_deep; the session goes on."""
    async with peer(gateway) as p:
        await p.send('{"type":"ack","seq":0,"x":' + "[" * 1000 + "]" * 1000 + "}")
        assert (await p.expect("error"))["code"] == "too_deep"
        await p.invoke("c1", "clock_now", {"timezone": "UTC"})
        assert (await p.terminal("c1"))["type"] == "result"


async def test_nul_byte_in_http_path_is_404(gateway: Gateway) -> None:
    """SPEC O2/K2: odd request paths never reach the filesystem: 404, no 500."""
    for path in (b"/\x00", b"/..%2f..%2fetc/passwd", b"/static/../server.py"):
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(WAIT):
            status = await reader.readline()
        writer.close()
        assert status.startswith(b"HTTP/1.1 404"), (path, status)


async def test_resume_needs_the_same_tenant(gateway: Gateway) -> None:
    """SPEC S2/D3: the same user name in another tenant cannot resume the session."""
    async with peer(gateway) as owner:
        welcome = owner.welcome
        async with peer(
            gateway,
            token="alice-t2-token",
            session_id=welcome["session_id"],
            resume_token=welcome["resume_token"],
            last_seq=0,
        ) as other:
            assert other.welcome["resumed"] is False
            assert other.welcome["session_id"] != welcome["session_id"]
        await owner.invoke("c1", "clock_now", {"timezone": "UTC"})
        assert (await owner.terminal("c1"))["type"] == "result"


async def test_tool_data_is_per_tenant(gateway: Gateway) -> None:
    """SPEC I5/S2: ctx.principal separates tenants; alice of t2 never sees alice's notes."""
    async with peer(gateway) as alice:
        await alice.invoke("n1", "notes_create", {"title": "secret", "body": "pw=hunter2"})
        assert (await alice.terminal("n1"))["type"] == "result"
    async with peer(gateway, token="alice-t2-token") as other:
        await other.invoke("s1", "notes_search", {"query": "secret"})
        found = await other.terminal("s1")
        assert "hunter2" not in str(found["result"])
        assert found["result"]["notes"] == []


async def test_session_limit_counts_per_tenant(tmp_path: Path) -> None:
    """SPEC E2: max_sessions_per_user counts (tenant, user); another tenant's alice is apart."""
    settings = settings_for(tmp_path, limits={"max_sessions_per_user": 1})
    async with running(settings) as gw, peer(gw), peer(gw, token="alice-t2-token") as other:
        assert other.welcome["user"] == "alice"


async def test_one_large_result_is_not_a_slow_consumer(tmp_path: Path) -> None:
    """SPEC D5: a single frame larger than the outbound bound reaches a reading client;
    only a backlog behind it counts against the bound."""
    settings = settings_for(tmp_path, server={"max_outbound_bytes": 4096})
    async with running(settings) as gw, peer(gw) as p:
        body = "x" * 3000
        for i in range(3):
            await p.invoke(f"n{i}", "notes_create", {"title": f"t{i}", "body": body})
            await p.terminal(f"n{i}")
        await p.invoke("all", "notes_list", {"limit": 10})
        listed = await p.terminal("all")
        assert listed["type"] == "result"
        assert len(listed["result"]["notes"]) == 3


async def test_context_size_is_bounded(tmp_path: Path) -> None:
    """SPEC S5/E2: a context past max_context_bytes is refused and nothing changes; an
    oversized context in hello closes 1008."""
    settings = settings_for(tmp_path, limits={"max_context_bytes": 200})
    async with running(settings) as gw:
        async with peer(gw, context={"project_id": "p1"}) as p:
            await p.send({"type": "context.update", "id": "u1", "context": {"big": "y" * 300}})
            error = await p.expect("error", id="u1")
            assert error["code"] == "context_too_large"
            await p.send({"type": "context.update", "id": "u2", "context": {"k": "v"}})
            assert (await p.expect("context", id="u2"))["context"] == {"project_id": "p1", "k": "v"}
            assert p.welcome["limits"]["max_context_bytes"] == 200
        async with peer(gw, hello=False) as q:
            await q.send(
                {
                    "type": "hello",
                    "token": "alice-token",
                    "profile": "demo",
                    "context": {"big": "y" * 300},
                }
            )
            assert (await q.expect("error"))["code"] == "context_too_large"
            assert (await closed(q)).rcvd.code == 1008


async def test_bad_last_seq_leaves_the_session_alone(gateway: Gateway) -> None:
    """SPEC D3: a resume with a last_seq the log cannot serve answers resumed false and
    leaves the old session (and its pending approval) resumable."""
    async with peer(gateway) as p:
        await p.invoke("d1", "notes_delete", {"note_id": 1})
        start = await p.expect("tool_start", call_id="d1")
        welcome = p.welcome
        p.ws.transport.abort()
    ids = {"session_id": welcome["session_id"], "resume_token": welcome["resume_token"]}
    async with peer(gateway, last_seq=10**9, **ids) as wrong:
        assert wrong.welcome["resumed"] is False
    async with peer(gateway, last_seq=start["seq"], **ids) as right:
        assert right.welcome["resumed"] is True
        assert gateway.approvals.pending.keys() == {start["approval_id"]}


async def test_cancel_then_confirm_in_one_write_cannot_allow(tmp_path: Path) -> None:
    """SPEC A4/A3: call.cancel settles the approval at once (cancelled); a confirm in the
    same batch of frames is not accepted, and the call ends cancelled."""
    async with tt.serve(tmp_path) as gw, peer(gw, options={"confirm_tool_calls": True}) as p:
        await p.invoke("c1", "echo", {"note": "x"})
        start = await p.expect("tool_start", call_id="c1")
        cancel = {"type": "call.cancel", "id": "k", "call_id": "c1"}
        confirm = {
            "type": "tool.confirm",
            "id": "y",
            "approval_id": start["approval_id"],
            "decision": "allow",
        }
        # Two frames in one TCP write: the server reads both in the same loop turn.
        p.ws.protocol.send_text(orjson.dumps(cancel))
        p.ws.protocol.send_text(orjson.dumps(confirm))
        p.ws.send_data()
        answer = await p.expect("confirm.result", id="y")
        assert (answer["accepted"], answer["reason"]) == (False, "already_decided")
        resolved = await p.expect("tool.resolved", call_id="c1")
        assert (resolved["resolution"], resolved["reason"]) == ("denied", "cancelled")
        assert (await p.terminal("c1"))["code"] == "cancelled"
        assert tt.STATE.calls["echo"] == 0


async def test_restart_does_not_resolve_an_allowed_approval_twice(tmp_path: Path) -> None:
    """SPEC A3/A6: an approval allowed before a restart keeps its one resolution; the call
    that was running ends cancelled without a second, contradictory tool.resolved."""
    tt.reset()
    # No drain grace (SPEC J6): the restart cuts the running handler off.
    settings = settings_for(tmp_path, catalog=tt.write_catalog(tmp_path), server={"drain_grace": 0})
    async with running(settings) as gw, peer(gw, options={"confirm_tool_calls": True}) as p:
        await p.invoke("b1", "blocking", {})
        start = await p.expect("tool_start", call_id="b1")
        await p.send(
            {"type": "tool.confirm", "approval_id": start["approval_id"], "decision": "allow"}
        )
        allowed = await p.expect("tool.resolved", call_id="b1")
        await tt.wait_thread_event(tt.STATE.started)
        fields = resume_fields(p, allowed["seq"])
    tt.STATE.release.set()
    async with running(settings) as gw, peer(gw, **fields) as q:
        assert q.welcome["resumed"] is True
        ended = await q.terminal("b1")
        assert (ended["type"], ended["code"]) == ("call.error", "cancelled")
        assert [m for m in q.seen if m["type"] == "tool.resolved"] == []


async def test_drain_during_replay_keeps_order(tmp_path: Path) -> None:
    """SPEC S4/D1/D3: a drain while a long replay is still being written sends the rest of
    the replay, then the live events, then reconnect, then 1012: gap-free, nothing skipped."""
    settings = settings_for(tmp_path, limits={"invoke_rate": 1e6, "invoke_burst": 10**6})
    async with running(settings) as gw:
        async with peer(gw) as p:
            # More events than one replay page (256), so the writer is still inside the
            # replay, between pages, when the drain comes.
            for i in range(300):
                await p.invoke(f"n{i}", "notes_create", {"title": f"t{i}", "body": "z" * 40_000})
                await p.terminal(f"n{i}")
            fields = resume_fields(p, 1)
            p.ws.transport.abort()
        finished = asyncio.Event()
        finish = gw.pipeline.end.finish

        def finishing(call: Any, *args: Any, **kwargs: Any) -> None:
            finish(call, *args, **kwargs)
            if call.call_id == "live2":
                finished.set()

        gw.pipeline.end.finish = finishing  # type: ignore[method-assign]
        async with peer(gw, **fields) as q:
            q.ws.transport.pause_reading()  # the replay backs up in the server's writer
            for i in range(3):
                await q.invoke(f"live{i}", "clock_now", {"timezone": "UTC"})
            async with asyncio.timeout(WAIT):
                await finished.wait()  # live results now queue behind the replay
            [handler] = [h for h in gw.handlers if h.session is not None]
            reached = asyncio.Event()
            flush_and_close = handler.link.flush_and_close

            async def flushing(*args: Any, **kwargs: Any) -> None:
                reached.set()
                await flush_and_close(*args, **kwargs)

            handler.link.flush_and_close = flushing  # type: ignore[method-assign]
            draining = asyncio.ensure_future(gw.drain())
            async with asyncio.timeout(WAIT):
                await reached.wait()
            q.ws.transport.resume_reading()
            exc = await closed(q)
            await draining
    assert exc.rcvd is not None
    assert exc.rcvd.code == 1012
    kinds = [m["type"] for m in q.seen]
    assert kinds[-1] == "reconnect"
    seqs = sequenced(q.seen)
    assert seqs == list(range(2, seqs[-1] + 1))
    live = [m for m in q.seen if m["type"] == "result" and m["call_id"].startswith("live")]
    assert len(live) == 3


async def test_invalid_params_reply_is_bounded(gateway: Gateway) -> None:
    """SPEC I4/E2: thousands of violations give one bounded invalid_params reply that still
    counts them all; a violation naming thousands of keys is cut short."""
    async with peer(gateway) as p:
        bad_tags = {"title": "t", "body": "b", "tags": list(range(2000))}
        await p.invoke("c1", "notes_create", bad_tags)
        error = await p.terminal("c1")
        assert error["code"] == "invalid_params"
        assert len(error["violations"]) == 50
        assert error["message"] == "2001 parameter problem(s), first 50 listed"
        await p.invoke("c2", "clock_now", {"timezone": "UTC", **{f"k{i}": i for i in range(2000)}})
        [violation] = (await p.terminal("c2"))["violations"]
        assert violation["keyword"] == "additionalProperties"
        assert len(violation["message"]) == 300
