"""Review, round 2: edges where toolbus breaks a SPEC promise (I12, I15, J6, D*, E*, A7).

Each test runs a real gateway on 127.0.0.1 and a real websockets client. The handlers
here block on :class:`threading.Event` s the test controls and record each run in
:data:`RUNS`, so no test sleeps to order events.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gateway.context import ToolContext
from gateway.server import Gateway
from tests.gateway import thread_tools
from tests.gateway.thread_tools import HOG_RELEASE, HOG_STARTED, RUNS, wait_thread
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import (
    WAIT,
    Clock,
    barrier,
    closed,
    dropped,
    own_catalog,
    park_signal,
    peer,
    running,
    settings_for,
    signal,
)

TOOLS = (
    thread_tools.TOOLS
    + """
  - name: apromo
    description: An async def handler promoted to a job; waits for the test's release.
    capability: r.basic
    timeout: 0
    promote_after: 0.05
    handler: tests.gateway.test_review_edges:await_release
  - name: pad_job
    description: An async job whose result pads to n characters.
    capability: r.basic
    mode: async
    handler: tests.gateway.test_review_edges:apad
    parameters:
      type: object
      properties:
        n: {type: integer}
  - name: gated_quick
    description: Needs approval, then records its run.
    capability: r.basic
    requires_approval: true
    handler: tests.gateway.thread_tools:mark
  - name: async_quick
    description: A coroutine handler that records its run.
    capability: r.basic
    handler: tests.gateway.thread_tools:amark
  - name: job_quick
    description: An async job that records its run.
    capability: r.basic
    mode: async
    handler: tests.gateway.thread_tools:amark
"""
)

PROFILES = """
safe_default: []
profiles:
  demo:
    capabilities: [r.basic]
  readonly:
    capabilities: [r.basic]
  voice:
    capabilities: [r.basic]
  legacy:
    capabilities: [r.basic]
"""


def _reset() -> None:
    RUNNING.clear()
    PEAK[0] = 0
    RELEASE.clear()
    thread_tools.reset()


RUNNING: set[str] = set()
"""Call ids whose ``await_release`` handler runs now."""
PEAK: list[int] = [0]
RELEASE: dict[str, asyncio.Event] = {}


def _release() -> asyncio.Event:
    if "all" not in RELEASE:
        RELEASE["all"] = asyncio.Event()
    return RELEASE["all"]


async def await_release(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    RUNS.append(ctx.call_id)
    RUNNING.add(ctx.call_id)
    PEAK[0] = max(PEAK[0], len(RUNNING))
    try:
        await _release().wait()
    finally:
        RUNNING.discard(ctx.call_id)
    return {"ran": ctx.call_id}


async def apad(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"pad": "x" * int(params["n"])}


def _settings(tmp: Path, **sections: Any) -> Any:
    return settings_for(tmp, catalog=own_catalog(tmp, TOOLS, PROFILES), **sections)


# -- J6, I14: a promoted call whose plain handler still waits for a worker thread -------


async def test_j6_promoted_call_waiting_for_a_thread_is_not_reported_started(
    tmp_path: Path,
) -> None:
    """SPEC J6, I14, S4: a plain sync handler that waits for a worker thread (its
    session's one thread is held) is promoted to a job at ``promote_after``. Its handler
    has not started, yet the job is reported ``running`` with a ``started_at``; a drain
    then reports it ``failed`` ``interrupted`` ("the server restarted while this job
    ran") though it never ran."""
    _reset()
    one = {"worker_threads": 1, "threads_per_session": 1, "threads_per_user": 1}
    settings = _settings(
        tmp_path,
        calls={**one, "thread_wait": 30.0, "default_timeout": 0},
        server={"port": 0, "heartbeat_interval": 0, "drain_grace": 0},
    )
    gw = Gateway(settings)
    await gw.start()
    try:
        async with peer(gw) as p:
            await p.invoke("h1", "hog", {})
            await wait_thread(HOG_STARTED)
            await p.invoke("c1", "promo_plain", {})
            dispatched = await p.terminal("c1")
            assert dispatched["type"] == "dispatched"
            job_id = dispatched["job_id"]
            await p.send({"type": "job.get", "id": "g1", "job_id": job_id})
            info = (await p.expect("job", id="g1"))["job"]
            assert RUNS == []  # the handler still waits for its thread
            reported = (info["state"], info.get("started_at"))  # omitted when not started
            drain = asyncio.create_task(gw.drain())
            await closed(p)
            await drain
            failed = [m for m in p.seen if m.get("job_id") == job_id and m["type"] == "job.failed"]
            assert RUNS == []
            # What really happened: it never started.
            assert not any(f["error"]["code"] == "interrupted" for f in failed), failed
            assert reported[0] != "running", reported
            assert reported[1] is None, reported
    finally:
        HOG_RELEASE.set()
        await gw.drain()


# -- J1, E2: promoted calls run outside every job and in-flight bound ----------------


async def test_e2_a_promoted_call_counts_in_flight_until_its_handler_returns(
    tmp_path: Path,
) -> None:
    """SPEC E2, I14: ``limits.max_inflight_calls`` 1. A call of a tool promoted to a job
    after 50 ms is `dispatched`; its handler still runs, so the session's next invoke is
    refused `too_many_inflight` until that handler returns. Then the next call runs.
    Before, a promoted call no longer counted: a session ran any number of promoted
    handlers at once (4 with a bound of 1)."""
    _reset()
    async with (
        running(_settings(tmp_path, limits={"max_inflight_calls": 1})) as gw,
        peer(gw) as p,
    ):
        await p.invoke("c0", "apromo", {})
        first = await p.terminal("c0")
        assert first["type"] == "dispatched", first
        await p.invoke("c1", "apromo", {}, id="r1")
        refused = await p.expect("error", id="r1")
        assert (refused["code"], refused["details"]) == ("too_many_inflight", {"call_id": "c1"})
        _release().set()
        await p.expect("job.done", job_id=first["job_id"])
        await p.invoke("c1", "apromo", {})
        assert (await p.terminal("c1"))["type"] == "result"
        assert (PEAK[0], RUNS) == (1, ["c0", "c1"])


# -- I8, I15: a call still waiting for a worker thread when its session expires -------


async def test_i8_expired_session_call_waiting_for_a_thread_never_starts(
    tmp_path: Path,
) -> None:
    """SPEC I8, I15 (Pipeline.end_session: an expired session "cancels only calls whose
    handler has not started"): the session's one worker thread is held; its call `c1`
    passed every gate and waits for a thread. The socket drops and the resume window
    (0.3 s) ends. The handler has not started, yet the call is not cancelled: once the
    thread is free it starts, for a session that is over."""
    _reset()
    one = {"worker_threads": 1, "threads_per_session": 1, "threads_per_user": 1}
    settings = _settings(
        tmp_path,
        calls={**one, "thread_wait": 30.0},
        sessions={"resume_window": 0.3},
    )
    async with running(settings) as gw:
        parked, ended = park_signal(gw), signal(gw, "end")
        try:
            async with peer(gw) as p:
                await p.invoke("h1", "hog", {})
                await wait_thread(HOG_STARTED)
                await p.invoke("c1", "quick", {})
                await p.expect("tool_start", call_id="c1")  # gates passed; waits for the thread
                await dropped(p, parked)
            async with asyncio.timeout(WAIT):
                await ended.wait()
            assert not gw.sessions.sessions
        finally:
            HOG_RELEASE.set()
        async with peer(gw) as q:  # the principal's next session re-sends c1 (I15)
            await q.invoke("c1", "quick", {})
            answer = await q.terminal("c1")
        assert RUNS == [], f"c1's handler ran after its session ended: {answer}"
        assert answer["type"] == "call.error", answer
        assert answer["code"] == "cancelled", answer


# -- I15, N3: the same call id from the principal's session on another node ------------


async def test_i15_resend_on_another_node_while_the_call_runs_gets_its_terminal(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC I15, N3: two nodes on one PostgreSQL store. Session 1 (node A) runs `c1`;
    the principal's session 2 (node B; e.g. its resume failed and the load balancer
    picked B) re-sends `c1` unchanged. It is attached, as on one node: no refusal, and
    once `c1` ends on A, session 2 gets its one terminal event, with A's result.
    Before, B refused `duplicate_call` (which the Python client ignores:
    "the terminal event follows", docs/client.md) and nothing followed."""
    _reset()
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
    settings = [
        _settings(f, store={"url": pg_url}, nodes={"node_id": f"n-{f.name}"}) for f in folders
    ]
    async with (
        running(settings[0]) as a,
        running(settings[1]) as b,
        peer(a) as on_a,
        peer(b) as on_b,
    ):
        try:
            await on_a.invoke("c1", "hog", {})
            await wait_thread(HOG_STARTED)
            await on_b.invoke("c1", "hog", {})
            await barrier(on_b)
        finally:
            HOG_RELEASE.set()
        first = await on_a.terminal("c1")
        answer = await on_b.terminal("c1")
        assert (first["type"], first["result"]) == ("result", {"hog": True})
        assert (answer["type"], answer["call_id"], answer["result"]) == (
            "result",
            "c1",
            {"hog": True},
        )
        assert [m for m in on_b.seen if m["type"] == "error"] == []
        await barrier(on_b)
        assert [m["type"] for m in on_b.seen if m.get("call_id") == "c1"] == ["result"]


# -- I12, I15: a session's own record outlives the ledger's window --------------------


async def test_i15_other_tool_same_call_id_after_the_ledger_purge_is_not_the_old_result(
    tmp_path: Path,
) -> None:
    """SPEC I15, I12: `c1` ran `quick`. The gateway's clock passes
    ``calls.call_id_window`` and the ledger purges `c1`: the id is new again. The same
    session then sends `c1` for another tool (`async_quick`): it runs, as a new call.
    Before, the session's own record answered with `quick`'s old result, as if it were
    the `async_quick` call's outcome."""
    _reset()
    clock = Clock()
    gw = Gateway(_settings(tmp_path, calls={"call_id_window": 60.0}), clock=clock)
    await gw.start()
    try:
        async with peer(gw) as p:
            await p.invoke("c1", "quick", {})
            assert (await p.terminal("c1"))["tool"] == "quick"
            clock.ahead = 61.0
            gw.outbox.flush()
            gw.pipeline.ledger.purge()
            assert gw.store.ledger("", "alice", "c1") is None
            await p.invoke("c1", "async_quick", {})
            answer = await p.terminal("c1")
            assert (answer["type"], answer["tool"], answer["result"]) == (
                "result",
                "async_quick",
                {"ran": "c1"},
            )
            assert RUNS == ["c1", "c1"]
    finally:
        await gw.drain()


# -- S6, A7: a token removed from the token file, the handler starts before the sweep -


async def test_a7_allow_right_after_the_token_is_revoked_does_not_run(tmp_path: Path) -> None:
    """SPEC S6, A7: bob's gated call waits for approval; bob's token is removed from the
    token file (a fresh `hello` with it is refused at once: the server sees the file).
    The allow that follows must end the call ``credential_revoked``: the A7 re-check
    "on the state at that moment". It runs the tool: the re-check only reads a flag the
    periodic sweep (``auth.recheck_interval``, 1 s by default; 30 s here to make the
    window plain) sets later."""
    _reset()
    settings = _settings(tmp_path, auth={"recheck_interval": 30.0})
    tokens = tmp_path / "tokens.yaml"
    async with running(settings) as gw, peer(gw, token="bob-token") as p:
        await p.invoke("c1", "gated_quick", {})
        approval_id = (await p.expect("tool_start", call_id="c1"))["approval_id"]
        kept = [e for e in yaml.safe_load(tokens.read_text())["tokens"] if e["user"] != "bob"]
        tokens.write_text(yaml.safe_dump({"tokens": kept}))
        later = time.time() + 5
        os.utime(tokens, (later, later))
        async with peer(gw, hello=False) as fresh:
            await fresh.send({"type": "hello", "token": "bob-token", "profile": "demo"})
            assert (await fresh.expect("error"))["code"] == "auth_failed"
        await p.send(
            {"type": "tool.confirm", "id": "k", "approval_id": approval_id, "decision": "allow"}
        )
        answer = await p.terminal("c1")
        assert RUNS == [], f"the tool ran on a revoked token: {answer}"
        assert answer.get("code") == "credential_revoked", answer


# -- E2, M3: a mounted MCP server's question is a frame like any other ----------------


async def test_e2_elicit_request_frame_fits_max_message_bytes(tmp_path: Path) -> None:
    """SPEC E2, M3: ``max_message_bytes`` 2048. The mounted `asker` server
    (tests/mcp/elicit_server.py) asks a question that quotes its ``topic`` argument; a
    topic of 1,500 characters fits the call's params, but the question's
    ``elicit.request`` would be larger than the announced limit. It is never sent: the
    MCP server is answered ``cancel`` (its tool then answers "cancel"), and every frame
    the client gets fits. Before, the oversized frame was sent."""
    from tests.mcp.support import asker_mount, mcp_settings

    server = {"port": 0, "heartbeat_interval": 0, "max_message_bytes": 2048}
    settings = mcp_settings(tmp_path, [asker_mount()], server=server)
    async with running(settings) as gw, peer(gw) as p:
        limit = p.welcome["limits"]["max_message_bytes"]
        assert limit == 2048
        async with asyncio.timeout(WAIT):
            while not any(
                m["type"] == "catalog" and any(t["name"] == "asker_ask" for t in m["tools"])
                for m in p.seen
            ):
                await p.recv()
        await p.invoke("e1", "asker_ask", {"topic": "x" * 1500})
        frames: list[tuple[dict[str, Any], int]] = []
        async with asyncio.timeout(WAIT):
            while (
                not frames
                or frames[-1][0].get("call_id") != "e1"
                or frames[-1][0]["type"] not in ("result", "call.error")
            ):
                raw = await p.ws.recv()
                frames.append(
                    (orjson.loads(raw), len(raw.encode() if isinstance(raw, str) else raw))
                )
        assert [f["type"] for f, _ in frames if f["type"] == "elicit.request"] == []
        assert max(size for _, size in frames) <= limit
        assert frames[-1][0]["result"]["text"] == "cancel"


# -- E2: job.done is sized with seq 1 -------------------------------------------------


async def test_e2_job_done_frame_fits_max_message_bytes_at_any_seq(tmp_path: Path) -> None:
    """SPEC E2: a job.done is checked against ``max_message_bytes`` "whole, where the
    job runner encodes it" (gateway/framesize.py), but it is sized with ``seq: 1``
    (`_done_fields`); the frame sent carries the session's real seq. Past seq 99 a
    result sized within 2 bytes of the limit leaves in a frame 1-2 bytes larger than
    the limit the server announced."""
    _reset()
    limit = 4096
    settings = _settings(
        tmp_path,
        server={"port": 0, "heartbeat_interval": 0, "max_message_bytes": limit},
        limits={"invoke_rate": 10000.0, "invoke_burst": 10000},
    )
    async with running(settings) as gw, peer(gw) as p:
        for n in range(60):  # the session's seq past 100
            await p.invoke(f"q{n}", "async_quick", {})
            await p.terminal(f"q{n}")

        async def job_frame(call_id: str, n: int) -> tuple[str, int]:
            await p.invoke(call_id, "pad_job", {"n": n})
            job_id = (await p.terminal(call_id))["job_id"]
            async with asyncio.timeout(WAIT):
                while True:
                    raw = await p.ws.recv()
                    frame = orjson.loads(raw)
                    if frame.get("job_id") == job_id and frame["type"] in (
                        "job.done",
                        "job.failed",
                    ):
                        return frame["type"], len(raw.encode() if isinstance(raw, str) else raw)

        kind, probe = await job_frame("probe", 10)
        assert kind == "job.done"
        target = limit - probe + 10
        sent = []
        for n in range(target - 40, target + 8):
            kind, size = await job_frame(f"p{n}", n)
            if kind == "job.done":
                sent.append(size)
        assert sent, "no job.done near the limit was sent"
        assert max(sent) <= limit, (limit, sorted(sent)[-4:])


# -- J6: a call that never started is not reported as cut off while it ran -------------


async def test_j6_call_waiting_for_a_thread_at_a_drain_is_not_reported_as_run(
    tmp_path: Path,
) -> None:
    """SPEC J6 ("a job or call is reported as what really happened: one that never
    started is never reported as interrupted; after a restart it runs, or says it never
    started"), S4, I15: the session's one worker thread is held; its call `c1` waits
    for a thread when the server drains (grace 0). `c1` never ran. After the restart the
    principal re-sends `c1`: it answers ``cancelled`` "the server restarted while this
    call ran"."""
    _reset()
    one = {"worker_threads": 1, "threads_per_session": 1, "threads_per_user": 1}
    settings = _settings(
        tmp_path,
        calls={**one, "thread_wait": 30.0},
        server={"port": 0, "heartbeat_interval": 0, "drain_grace": 0},
    )
    gw = Gateway(settings)
    await gw.start()
    try:
        async with peer(gw) as p:
            await p.invoke("h1", "hog", {})
            await wait_thread(HOG_STARTED)
            await p.invoke("c1", "quick", {})
            await p.expect("tool_start", call_id="c1")  # gates passed; waits for the thread
            drain = asyncio.create_task(gw.drain())
            await closed(p)
            await drain
    finally:
        HOG_RELEASE.set()
        await gw.drain()
    assert RUNS == []
    async with running(settings) as again, peer(again) as q:
        await q.invoke("c1", "quick", {})
        answer = await q.terminal("c1")
    assert RUNS == [] or RUNS == ["c1"]
    if RUNS == []:
        assert "ran" not in answer.get("message", ""), answer


# -- I12, I15, D6: call ids with odd characters (checked: holds) -----------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_i12_call_ids_with_nul_are_keys_like_any_other(
    tmp_path: Path,
    backend: str,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC I12, I15, D6 (holds): a call id holding U+0000, and one of 128 characters
    of 4 UTF-8 bytes each, run once, a re-send from another session of the principal
    gets the recorded outcome, and the store keeps serving every session."""
    _reset()
    store = {"url": pg_url} if backend == "postgresql" else {}
    settings = _settings(tmp_path, store=store)
    odd = ["a\x00b", "\U0001f600" * 128]
    async with running(settings) as gw:
        async with peer(gw) as p:
            for call_id in odd:
                await p.invoke(call_id, "quick", {})
                assert (await p.terminal(call_id))["type"] == "result"
        async with peer(gw) as q:
            for call_id in odd:
                await q.invoke(call_id, "quick", {})
                assert (await q.terminal(call_id))["result"] == {"ran": call_id}
            await q.invoke("n1", "quick", {})
            assert (await q.terminal("n1"))["type"] == "result"
        assert RUNS.count(odd[0]) == 1
        assert RUNS.count(odd[1]) == 1


# -- M4, E1, F33: /mcp tools/call with a name the wire model refuses -----------------


async def test_m4_mcp_call_of_a_long_tool_name_is_unknown_tool_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    """SPEC M4 ("through the same pipeline"), I1, E1, F33: a ``tools/call`` whose name
    has 200 characters (MCP sets no bound) must end like any unknown tool
    (``unknown_tool: ...``) and keep nothing. `_call_tool` registers the call's waiter
    queue, then builds the ``invoke`` (tool names are at most 128 characters): the
    ``ValidationError`` escapes before the ``try``, the MCP client gets an internal
    error, and the waiter is never removed."""
    from tests.mcp.test_serve import _text, _waiting, mcp_client

    async with running(settings_for(tmp_path)) as gw:
        async with asyncio.timeout(WAIT), mcp_client(gw, "bob-token") as client:
            try:
                answer = await client.call_tool("t" * 200, {})
                text = _text(answer) if answer.is_error else "not an error"
            except Exception as exc:  # the SDK raises on a JSON-RPC error
                text = f"raised {type(exc).__name__}: {exc}"
        leaked = _waiting(gw)
    assert leaked == (0, 0), (leaked, text)
    assert text.startswith("unknown_tool: "), text
