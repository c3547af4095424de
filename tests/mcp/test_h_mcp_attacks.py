"""Attacks on the MCP parts (SPEC M1-M4) found by an attacking helper: real gateways on
127.0.0.1, real MCP servers (stdio and Streamable HTTP), the SDK's own client on
``/mcp``. Each test states what SPEC says should happen and what was seen before its
fix. Three faults the helper found are not fixed and have no test here; docs/mcp.md
("Not yet") says what happens: no per-user cap of ``/mcp`` sessions, a reused JSON-RPC
id in flight, and a question not asked of a session that attached to its call."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

import toolbus
from gateway.demo import handlers
from protocol import messages as m
from tests.mcp.support import (
    asker_mount,
    client,
    eventually,
    free_port,
    has_tools,
    mcp_settings,
)
from tests.mcp.test_serve import _waiting, mcp_client
from tests.support import WAIT, running, settings_for

ATTEMPTS = 50
HOSTILE_SERVER = Path(__file__).resolve().parent / "hostile_server.py"


def hostile_mount(tmp: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": "h",
        "command": sys.executable,
        "args": [str(HOSTILE_SERVER)],
        "env": {"FAULT_DIR": str(tmp)},
        "capability": "hostile",
        **extra,
    }


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


# -- M4 + M3: a /mcp client calls a mounted tool that asks its user ----------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_h_m4_m3_mounted_elicitation_from_an_mcp_call_is_not_left_hanging(
    tmp_path: Path, mode: str
) -> None:
    """SPEC M4 ("through the same pipeline"), M3 (an elicitation during a call reaches the
    caller as a typed request and its answer goes back), A4 (never silent).

    An MCP host calls, at ``/mcp``, a mounted tool whose server asks an
    ``elicitation/create`` mid-call. The host declared elicitation. Either the question
    should reach the host (its elicitation callback), or, if toolbus cannot forward it,
    the server should be answered at once (decline/cancel) so the call ends.

    What happens: the question becomes an ``elicit.request`` in the internal session's
    log; ``McpEndpoint._on_frame`` ignores that frame kind, nobody can answer it, and the
    host's ``tools/call`` hangs until ``calls.approval_timeout`` (3600 s by default; 6 s
    here), then ends with the server's "cancel"."""
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(
            action="accept", content={"name": "Ada", "email": "ada@example.org", "age": 36}
        )

    settings = mcp_settings(tmp_path, [asker_mount()], calls={"approval_timeout": 6})
    async with (
        running(settings) as gw,
        mcp_client(gw, "alice-token", "demo", elicitation_callback=elicit, mode=mode) as host,
    ):
        async with asyncio.timeout(WAIT):
            while "asker_ask" not in {t.name for t in (await host.list_tools()).tools}:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # the mount connects after the gateway starts
        started = time.monotonic()
        answer = await asyncio.wait_for(host.call_tool("asker_ask", {"topic": "lunch"}), WAIT)
        took = time.monotonic() - started
    assert took < 3, (took, asked, answer)
    assert asked, "the host's elicitation callback was never asked"


# -- M4 + M3 + J3: cancelling the MCP request of an async tool ---------------------------


async def test_h_m4_cancelled_mcp_request_of_an_async_tool_cancels_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC M4 (jobs via progress), M3 (``call.cancel``/``job.cancel`` map to MCP
    cancellation), I8 (cancellation is never swallowed).

    At ``/mcp`` an async tool's ``tools/call`` waits for its job; the host is given no
    job id, so cancelling that request is its only way to stop the work. The host
    cancels (``notifications/cancelled``) after the dispatch progress. The job should
    end ``cancelled``. What happens: ``_call_tool`` calls ``pipeline.cancel`` on the
    call id, but the call already ended ``dispatched``; the job runs on to ``done``."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", 0.7)
    dispatched = asyncio.Event()

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        dispatched.set()

    settings = settings_for(tmp_path, jobs={"progress_interval": 0})
    async with running(settings) as gw, mcp_client(gw, "bob-token", mode="legacy") as host:
        call = asyncio.create_task(
            host.call_tool("report", {"topic": "x"}, progress_callback=progress)
        )
        await asyncio.wait_for(dispatched.wait(), WAIT)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call

        def ended() -> bool:
            rows = gw.store.jobs("bob", None, None, 10)
            return bool(rows) and rows[0].state in ("done", "failed", "cancelled")

        await eventually(ended, "the job ended")
        [row] = gw.store.jobs("bob", None, None, 10)
    assert row.state == "cancelled", row.state


# -- M4 + E1 + I16: arguments the WebSocket codec would refuse ---------------------------


async def test_h_m4_e1_an_integer_wider_than_64_bits_gets_a_typed_error(tmp_path: Path) -> None:
    """SPEC M4 (the same pipeline), E1 (bad input gets a typed error, the server never
    crashes), I12 (exactly one terminal reply), F33 (nothing kept).

    A WebSocket ``invoke`` with a 2**70 integer is refused by the codec with a typed
    error. At ``/mcp`` the SDK parses it and toolbus hands it to ``pipeline.accept``,
    whose I15 ledger hashes the params with orjson: ``TypeError: Integer exceeds 64-bit
    range`` escapes ``McpEndpoint._call_tool`` after it registered the call's waiter. The
    host gets a bare JSON-RPC "Internal server error" and the waiter queue is never
    removed (one leaked entry per such request). Expected: a typed error result
    (``invalid_params``), nothing kept."""
    args = {"value": 2**70, "from_unit": "m", "to_unit": "cm"}
    async with running(settings_for(tmp_path)) as gw, mcp_client(gw, "bob-token") as host:
        try:
            answer = await asyncio.wait_for(host.call_tool("convert_units", args), WAIT)
            outcome = ("result", answer.is_error, _text(answer)[:200])
        except Exception as exc:  # the SDK raises on a JSON-RPC error
            outcome = ("raised", type(exc).__name__, str(exc)[:200])
        leaked = _waiting(gw)
        ok = await host.call_tool("convert_units", {"value": 1, "from_unit": "m", "to_unit": "cm"})
    assert leaked == (0, 0), (leaked, outcome)
    assert outcome[:2] == ("result", True), outcome
    assert outcome[2].startswith("invalid_params"), outcome
    assert ok.is_error is False


# -- M2: list_changed that changes a tool's annotations only -----------------------------


async def test_h_m2_list_changed_of_annotations_reaches_the_catalog(tmp_path: Path) -> None:
    """SPEC M2 (``list_changed`` reloads the catalog), M1 (idempotent and read-only
    defaults come from the annotations), J5 (idempotent decides re-runs and whether a
    start is made durable first).

    The server re-registers ``charge`` as not idempotent, not read-only, with a new
    title, and sends ``list_changed``. toolbus re-lists, but ``_watch_loop`` republishes
    only when name, description, parameters, dangerous or requires_approval changed
    (``_shape``), so the catalog keeps ``idempotent: true`` / ``read_only: true`` and the
    old title: a job of it skips its durable ``running`` row and is re-run after a crash
    as if it were idempotent, and ``/mcp`` hosts keep seeing ``idempotentHint: true``."""
    async with (
        running(mcp_settings(tmp_path, [hostile_mount(tmp_path)])) as gw,
        client(gw) as bus,
    ):
        await has_tools(bus, "h_charge", "h_flip")
        tool = gw.catalog.current.tools["h_charge"]
        assert (tool.idempotent, tool.read_only, tool.title) == (True, True, "Charge v1")
        out = await bus.invoke("h_flip", {})
        assert isinstance(out, m.Result)
        server = gw.mcp.servers["h"]
        await eventually(lambda: server.tools["h_charge"].title == "Charge v2", "toolbus re-listed")
        await eventually(
            lambda: gw.catalog.current.tools["h_charge"].title == "Charge v2",
            "the catalog republished the re-listed tool",
        )
        tool = gw.catalog.current.tools["h_charge"]
    assert (tool.idempotent, tool.read_only, tool.title) == (False, False, "Charge v2")


# -- M2: a Streamable HTTP server that restarts ------------------------------------------


@contextlib.asynccontextmanager
async def _everything_http(port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    from tests.mcp.support import everything_entry

    process = await asyncio.create_subprocess_exec(
        "node",
        str(everything_entry()),
        "streamableHttp",
        env={**os.environ, "PORT": str(port)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    try:
        async with asyncio.timeout(WAIT):
            while b"listening on port" not in await process.stderr.readline():
                pass
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()


async def test_h_m2_http_server_restart_is_unavailable_and_reconnected(tmp_path: Path) -> None:
    """SPEC M2: "A server that dies or cannot be reached makes its tools answer a typed
    ``unavailable`` ... and is reconnected or restarted with backoff."

    The reference server "everything" over Streamable HTTP (it keeps MCP sessions) is
    restarted on the same port. toolbus's MCP session id is unknown to the new process.
    Calls should answer ``unavailable`` (at most) and toolbus should reconnect without
    waiting for the next probe. What happens: the SDK answers each call with a JSON-RPC
    error (the new process refuses the old session id), ``call_tool`` maps it to
    ``handler_error`` "MCP error -32603: Server returned an error response" (untyped:
    the model is told the tool failed), nothing marks the connection lost, and so it
    goes on until the next health probe (``health_interval``, 15 s by default) fails and
    reconnects: about 30 failed calls at 2 per second in this test."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    mount = {"name": "ev", "url": url, "capability": "everything", "include": ["echo"]}
    settings = mcp_settings(tmp_path, [mount])
    async with _everything_http(port) as first, running(settings) as gw, client(gw) as bus:
        await has_tools(bus, "ev_echo")
        out = await bus.invoke("ev_echo", {"message": "one"})
        assert isinstance(out, m.Result)
        first.terminate()
        await first.wait()
        async with _everything_http(port):
            errors: list[str] = []
            for attempt in range(ATTEMPTS):
                try:
                    out = await bus.invoke("ev_echo", {"message": f"again {attempt}"})
                    break
                except toolbus.CallFailed as exc:
                    errors.append(f"{exc.event.code}: {exc.event.message}")
                    await asyncio.sleep(0.5)
            else:
                out = None
    assert all(e.startswith("unavailable") for e in errors), (
        len(errors),
        isinstance(out, m.Result),
        errors[:1],
    )
    assert isinstance(out, m.Result), errors


# -- M4 + M1: one mounted tool the MCP export cannot carry -------------------------------


async def test_h_m4_one_unexportable_mounted_tool_does_not_break_tools_list(
    tmp_path: Path,
) -> None:
    """SPEC M4 (each profile's catalog served at ``/mcp``), M1, C4, E1 (never crashes;
    other sessions never notice).

    A mounted server lists ``pick``, whose ``inputSchema`` has a root ``oneOf`` that
    bounds a property. MCP allows that and toolbus mounts it (it validates calls against
    it; the WebSocket catalog carries it). But ``McpEndpoint._list_tools`` exports the
    whole visible catalog with ``to_mcp``, which raises ``ExportError`` for a root
    combinator it cannot drop, uncaught: every ``tools/list`` of every host on this
    profile fails, so none of the profile's tools (the demo's too) can be used over MCP.
    Expected: the one tool left out (as the Realtime bridge drops what its export cannot
    carry), the rest listed."""
    settings = mcp_settings(tmp_path, [hostile_mount(tmp_path)])
    async with running(settings) as gw:
        async with client(gw) as bus:
            await has_tools(bus, "h_pick", "h_slow")
        async with mcp_client(gw, "alice-token", "demo") as host:
            try:
                names = {t.name for t in (await host.list_tools()).tools}
                outcome = "listed"
            except Exception as exc:  # the SDK raises on a JSON-RPC error
                names, outcome = set(), f"raised {type(exc).__name__}: {exc}"
    assert outcome == "listed", outcome
    assert {"h_slow", "h_charge"} <= names, names


# -- M4 + A4 + E2: a host whose elicitation answer is an error ----------------------------


async def test_h_m4_a4_an_elicitation_error_from_the_host_leaves_no_pending_approval(
    tmp_path: Path,
) -> None:
    """SPEC M4 (approvals via MCP elicitation), A4 ("pending slots never leak"; the call
    cancelled -> deny), E2 (``max_pending_approvals``), I12.

    A host negotiated the initialize handshake and declared elicitation; toolbus asks it
    the approval with ``elicitation/create``. The host answers that request with a
    JSON-RPC error (its UI failed). ``ApprovalAsker.ask`` raises ``MCPError``;
    ``McpEndpoint._call_tool`` only cancels the toolbus call on ``CancelledError``, so
    the host's ``tools/call`` fails while the toolbus call keeps waiting for its approval
    (``approval_timeout``, an hour by default), holding a pending-approval and an
    in-flight slot of the internal session that every MCP host of this user and profile
    shares. Two such failures (``max_pending_approvals: 2`` here) and a third host, whose
    UI works, cannot get a gated call asked any more.

    Expected: a failed question ends the call (denied/cancelled) and frees its slots."""

    async def broken(context: Any, params: types.ElicitRequestParams) -> types.ErrorData:
        return types.ErrorData(code=types.INTERNAL_ERROR, message="approval UI crashed")

    asked: list[str] = []

    async def working(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    settings = settings_for(tmp_path, limits={"max_pending_approvals": 2})
    async with running(settings) as gw:
        for note in (1, 2):
            async with mcp_client(
                gw, "bob-token", elicitation_callback=broken, mode="legacy"
            ) as host:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(host.call_tool("notes_delete", {"note_id": note}), WAIT)
        await eventually(lambda: not gw.pipeline.in_flight(), "the failed approvals settled")
        stuck = [(c.call_id, c.approval_id is not None) for c in gw.pipeline.in_flight()]
        async with mcp_client(gw, "bob-token", elicitation_callback=working, mode="legacy") as host:
            made = await host.call_tool("notes_create", {"title": "t", "body": "b"})
            assert isinstance(made.structured_content, dict)
            note_id = made.structured_content["note_id"]
            third = await asyncio.wait_for(
                host.call_tool("notes_delete", {"note_id": note_id}), WAIT
            )
    assert stuck == [], stuck
    assert asked, _text(third)
    assert third.is_error is False, _text(third)


# -- M2: one failed re-list while calls run ----------------------------------------------


async def test_h_m2_one_failed_relist_does_not_kill_the_calls_in_flight(tmp_path: Path) -> None:
    """SPEC M2 (``list_changed`` reloads the catalog; a server that *dies or cannot be
    reached* is reconnected), I12/J6 (states tell the truth).

    A call of ``h_slow`` runs on the server. The server announces ``list_changed`` and
    answers the one ``tools/list`` that follows with a JSON-RPC error; it is up and
    answers everything else. ``_watch_loop`` lets the error escape, the supervisor tears
    the connection down and restarts the subprocess: the running call ends
    ``unavailable`` "went away during the call", and the server's handler is killed
    mid-work (``slow-cancelled`` is never written: the process is gone).

    Expected: the failed re-list is logged or retried; the call that was running ends
    with the server's answer."""
    settings = mcp_settings(tmp_path, [hostile_mount(tmp_path, tools={"slow": {"timeout": 30}})])
    async with running(settings) as gw, client(gw) as bus:
        await has_tools(bus, "h_slow", "h_break_list")
        slow = asyncio.ensure_future(bus.invoke("h_slow", {"seconds": 2}, call_id="s1"))
        await eventually(lambda: (tmp_path / "slow-started").exists(), "slow started")
        out = await bus.invoke("h_break_list", {})
        assert isinstance(out, m.Result)
        try:
            result = await asyncio.wait_for(slow, WAIT)
            outcome = ("result", result.result["text"])
        except toolbus.CallFailed as exc:
            outcome = (exc.event.code, exc.event.message)
        attempts = gw.mcp.servers["h"].attempts
    assert outcome == ("result", "slept"), (outcome, attempts)


# -- M4 one port: what the sniffer hands to HTTP stays HTTP ------------------------------


async def test_h_m4_o2_side_routes_answer_on_a_kept_alive_mcp_connection(tmp_path: Path) -> None:
    """SPEC M4 ("at ``/mcp`` on the same port"), O2 (``/healthz``, ``/readyz``).

    The sniffer decides once per TCP connection: after a ``POST /mcp`` the connection
    belongs to uvicorn's h11 protocol serving the MCP app only. An HTTP client with a
    connection pool (httpx, as the MCP SDK uses) reuses that kept-alive connection for
    its next request to the same host, so ``GET /readyz`` (or ``/healthz``, ``/metrics``)
    through it gets the MCP app's ``404 not found``; on a fresh connection it is 200.
    Expected: the side routes answer whatever connection they arrive on."""
    import httpx2

    async with running(settings_for(tmp_path)) as gw:
        base = f"http://127.0.0.1:{gw.port}"
        headers = {
            "Authorization": "Bearer bob-token",
            "Accept": "application/json, text/event-stream",
        }
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "pool", "version": "1"},
            },
        }
        async with httpx2.AsyncClient(timeout=10) as http:
            fresh = await http.get(f"{base}/readyz")
            assert fresh.status_code == 200
            assert (await http.post(f"{base}/mcp", json=init, headers=headers)).status_code == 200
            again = await http.get(f"{base}/readyz")
    assert (again.status_code, again.text) == (200, fresh.text)


async def test_h_m4_e1_a_half_sent_mcp_request_head_is_not_held_forever(tmp_path: Path) -> None:
    """SPEC M4, E1/E3 (one client cannot starve the others), S1 (a silent connection is
    dropped).

    A WebSocket request head that never ends is dropped by websockets' open timeout
    (10 s), and a connection that sends nothing by the sniffer's timer. A connection that
    starts ``POST /mcp`` is handed to uvicorn's h11 protocol, which sets no timeout while
    it waits for the rest of the head: the sniffer's timer is cancelled at hand-over,
    ``timeout_keep_alive`` only runs between requests, and authentication only happens
    once the head is complete. Anyone who can reach the port can hold any number of
    sockets (file descriptors) this way, unauthenticated.

    Expected: the half-sent ``/mcp`` head is closed like the WebSocket one."""
    async with running(settings_for(tmp_path)) as gw:
        ws_reader, ws_writer = await asyncio.open_connection("127.0.0.1", gw.port)
        mcp_reader, mcp_writer = await asyncio.open_connection("127.0.0.1", gw.port)
        body_reader, body_writer = await asyncio.open_connection("127.0.0.1", gw.port)
        ws_writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        mcp_writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        # A whole head announcing a body that never comes: refused 401 (no credential)
        # before its body is read, and closed.
        body_writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        await asyncio.gather(ws_writer.drain(), mcp_writer.drain(), body_writer.drain())

        async def closed(reader: asyncio.StreamReader) -> bool:
            try:
                async with asyncio.timeout(13):
                    while await reader.read(4096):
                        pass
                return True
            except ConnectionError:
                return True  # reset by the server: closed too
            except TimeoutError:
                return False

        ws_closed, mcp_closed, body_closed = await asyncio.gather(
            closed(ws_reader), closed(mcp_reader), closed(body_reader)
        )
        for writer in (ws_writer, mcp_writer, body_writer):
            writer.close()
    assert ws_closed, "websockets kept a half-sent head (the control case)"
    assert mcp_closed, "a half-sent POST /mcp head is held open with no timeout"
    assert body_closed, "an unauthenticated POST /mcp whose body never comes is held open"


# -- M3 + I8: a cancelled call's question (2025-era server) ------------------------------


async def test_h_m3_i8_a_cancelled_calls_question_is_settled_with_the_call(tmp_path: Path) -> None:
    """SPEC M3 (docs/mcp.md: "No answer ..., the end of the session, or the end of the
    call, answers ``cancel``"), I8 (``call.cancel`` cancels the running call), A4
    ("pending slots never leak").

    The reference server "everything" (a 2025-era server: it asks on its own stream, so
    toolbus runs the question in the SDK's task, not the call's) asks a question during
    ``trigger-elicitation-request``. The client cancels the call before answering. The
    call ends ``cancelled``, but the question stays pending in ``Elicitations`` (up to
    ``calls.approval_timeout``, an hour by default), and a later ``elicit.answer`` for it
    is accepted although its call is over.

    Expected: the question is settled when its call ends; the late answer is not
    accepted."""
    from tests.mcp.support import everything_entry

    mount = {
        "name": "ev",
        "command": "node",
        "args": [str(everything_entry()), "stdio"],
        "capability": "everything",
        "include": ["trigger-elicitation-request"],
    }
    asked: asyncio.Queue[m.ElicitRequest] = asyncio.Queue()

    never = asyncio.Event()

    async def hold(req: m.ElicitRequest) -> tuple[m.ElicitAction, dict[str, Any] | None]:
        await asked.put(req)
        await never.wait()  # the user is still reading; answered later by id
        raise AssertionError("unreachable")

    async with (
        running(mcp_settings(tmp_path, [mount])) as gw,
        client(gw, on_elicitation=hold) as bus,
    ):
        await has_tools(bus, "ev_trigger-elicitation-request")
        call = asyncio.ensure_future(bus.invoke("ev_trigger-elicitation-request", {}, call_id="e1"))
        req = await asyncio.wait_for(asked.get(), WAIT)
        await bus.cancel("e1")
        with pytest.raises(toolbus.Cancelled):
            await asyncio.wait_for(call, WAIT)
        await eventually(lambda: not gw.parts.elicitations._pending, "the question settled")
        pending = len(gw.parts.elicitations._pending)
        late = await bus.answer_elicitation(
            req.elicitation_id, m.ElicitAction.ACCEPT, {"name": "Ada"}
        )
    assert (pending, late.accepted) == (0, False), (pending, late)


# -- M3 + J6: a response the SDK cannot parse --------------------------------------------

RAW_SERVER = Path(__file__).resolve().parent / "raw_server.py"


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_h_m3_j6_a_result_the_sdk_cannot_parse_ends_the_call(
    tmp_path: Path, mode: str
) -> None:
    """SPEC M3 (docs/mcp.md: "a result the SDK cannot parse -> ``call.error``
    ``handler_error``: MCP server '<name>' sent a malformed result"), J6 (states tell
    the truth), J5 ("none stays ``running`` forever").

    The server answers ``tools/call`` with a text whose JSON escape is a lone surrogate
    (``"\\ud83d"``: what ``JSON.stringify`` writes for a JavaScript string cut inside an
    emoji). The SDK's line parser refuses the whole message and hands the error to
    toolbus's ``message_handler``, which ignores everything but ``list_changed``; the
    response never reaches the call. A sync call waits for its run timeout and is
    reported ``timeout`` (2 s here; the server had answered at once); a job (no run
    timeout unless set) stays ``running`` for ever.

    Expected: the call ends ``handler_error`` naming the malformed answer, promptly."""
    mount = {
        "name": "raw",
        "command": sys.executable,
        "args": [str(RAW_SERVER)],
        "capability": "raw",
        "tools": {"surrogate": {"timeout": 2} if mode == "sync" else {"mode": "async"}},
    }
    async with running(mcp_settings(tmp_path, [mount])) as gw, client(gw) as bus:
        await has_tools(bus, "raw_surrogate", "raw_ok")
        try:
            out = await bus.invoke("raw_surrogate", {})
            if isinstance(out, toolbus.JobHandle):
                try:
                    job = await out.result(timeout=5)
                    outcome = (job.state.value, job.error.code if job.error else None)
                except toolbus.RequestTimeout:
                    rows = gw.store.jobs("alice", None, None, 10)
                    outcome = ("still " + rows[0].state, None)
            else:
                outcome = ("result", str(out.result)[:80])
        except toolbus.CallFailed as exc:
            outcome = (str(exc.event.code), exc.event.message)
        fine = await bus.invoke("raw_ok", {})
        assert isinstance(fine, m.Result)
    assert outcome[0] in ("handler_error", "failed"), outcome


# -- M1 + E3: a tool's "$schema" is fetched, on the event loop ---------------------------


async def test_h_m1_e3_a_mounted_tools_schema_url_is_not_fetched_on_the_event_loop(
    tmp_path: Path,
) -> None:
    """SPEC M1 (each mounted tool's schema is checked like a file tool's, C1), E3 (the
    event loop is shared fairly: one peer cannot stall every session), S2 (a server the
    operator mounts is not the operator).

    A mounted server lists a tool whose ``inputSchema`` has ``"$schema":
    "http://127.0.0.1:<port>/latest/meta-data/iam"``. ``catalog.tooldefs`` checks the
    schema with ``jsonschema_rs.meta.validate``, which *fetches* an unknown ``$schema``
    over HTTP (the compiled validator is ``offline=True``, the meta check is not): the
    gateway sends a GET to any URL a mounted server names (server-side request forgery
    into toolbus's network, repeated at each re-list and health probe), and does it
    synchronously on the event loop. Here the URL is a socket that accepts and never
    answers: the fetch blocks the loop for its 30 s timeout, and every session's
    requests stall meanwhile.

    Expected: no request to the named URL; other sessions keep being served."""
    import socket

    tarpit = socket.socket()
    tarpit.bind(("127.0.0.1", 0))
    tarpit.listen(8)  # the kernel completes the handshake; nothing ever answers
    url = f"http://127.0.0.1:{tarpit.getsockname()[1]}/latest/meta-data/iam"
    mount = hostile_mount(tmp_path)
    mount["env"] = {**mount["env"], "SCHEMA_URL": url}
    worst = 0.0
    try:
        async with running(mcp_settings(tmp_path, [mount])) as gw:
            started = time.monotonic()
            async with client(gw) as bus:
                worst = time.monotonic() - started  # hello and welcome, then requests
                server = gw.mcp.servers["h"]
                deadline = time.monotonic() + 40
                while not server.settled.is_set() and time.monotonic() < deadline:
                    # One round: a request of this session, then a 50 ms pause; a loop
                    # blocked by anything else shows as a long round.
                    started = time.monotonic()
                    await bus.refresh_catalog()
                    await asyncio.sleep(0.05)
                    worst = max(worst, time.monotonic() - started - 0.05)
        tarpit.setblocking(False)
        try:
            conn, _ = tarpit.accept()
            conn.setblocking(True)
            conn.settimeout(1)
            requested = conn.recv(200)
            conn.close()
        except OSError:
            requested = b""
    finally:
        tarpit.close()
    assert (worst < 2, requested[:40]) == (True, b""), (worst, requested[:60])
