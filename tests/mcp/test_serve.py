"""toolbus as an MCP server: the SDK's own client against ``/mcp`` (SPEC M4).

Every test runs the real gateway on 127.0.0.1 and drives ``/mcp`` with the official
``mcp.Client`` over Streamable HTTP, on the same port as the WebSocket server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.subscriptions import ToolsListChanged

from catalog.compat import ROOT_COMBINATOR, Finding
from gateway.demo import handlers
from gateway.mcp.serve import _log_left_out
from gateway.server import Gateway
from tests.gateway.tools_for_tests import audit_records
from tests.mcp.support import eventually, reloading_catalog
from tests.support import CONVERT, MS, WAIT, peer, running, settings_for


@contextlib.asynccontextmanager
async def mcp_client(
    gw: Gateway, token: str, profile: str | None = None, **options: Any
) -> AsyncIterator[Client]:
    """The SDK's client on ``/mcp`` with ``Authorization: Bearer token`` (SPEC M4, S2)."""
    headers = {"Authorization": f"Bearer {token}"}
    if profile is not None:
        headers["X-Toolbus-Profile"] = profile
    url = f"http://127.0.0.1:{gw.port}/mcp"
    async with create_mcp_http_client(headers=headers) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, cache=None, **options) as client:
            yield client


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running(settings_for(tmp_path)) as gw:
        yield gw


def _waiting(gw: Gateway) -> tuple[int, int]:
    """Calls read and approvals parked by the MCP endpoint now (nothing kept, case F33)."""
    links = gw.mcp_endpoint._links.values()
    return sum(len(k.waiters) for k in links), sum(len(k.parked) for k in links)


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_tools_list_is_the_profiles_catalog(gateway: Gateway) -> None:
    """SPEC M4, C3: ``tools/list`` is the visible catalog of the asked profile."""
    async with asyncio.timeout(WAIT):
        async with mcp_client(gateway, "alice-token", "readonly") as client:
            listed = await client.list_tools()
        async with mcp_client(gateway, "alice-token", "demo") as client:
            demo = await client.list_tools()
    assert sorted(t.name for t in listed.tools) == [
        "clock_now",
        "convert_units",
        "notes_list",
        "notes_search",
    ]
    names = {t.name for t in demo.tools}
    assert "notes_delete" in names
    assert "show_map" not in names  # mode: client, nothing to run it over MCP (I3)
    delete = next(t for t in demo.tools if t.name == "notes_delete")
    assert delete.annotations is not None
    assert delete.annotations.destructive_hint is True


async def test_sync_call_and_invalid_params(gateway: Gateway) -> None:
    """SPEC M4, I4: a sync call returns its result; bad params an MCP error result."""
    async with asyncio.timeout(WAIT):
        async with mcp_client(gateway, "bob-token") as client:
            ok = await client.call_tool(
                "convert_units", {"value": 1, "from_unit": "km", "to_unit": "m"}
            )
            bad = await client.call_tool("convert_units", {"value": "x"})
            unknown = await client.call_tool("no_such_tool", {})
    assert ok.is_error is False
    assert ok.structured_content == {
        "value": 1.0,
        "from_unit": "km",
        "to_unit": "m",
        "result": 1000.0,
        "dimension": "length",
    }
    assert bad.is_error is True
    assert _text(bad).startswith("invalid_params: ")
    assert unknown.is_error is True
    assert _text(unknown).startswith("unknown_tool: ")


async def test_bad_bearer_is_401(gateway: Gateway) -> None:
    """SPEC M4, S2: a refused credential, a credential in the URL, a profile not granted
    (asked by query parameter) and a foreign Origin never reach the MCP server."""
    url = f"http://127.0.0.1:{gateway.port}/mcp"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx2.AsyncClient() as http:
        refused = await http.post(url, json=body, headers={"Authorization": "Bearer nope"})
        missing = await http.post(url, json=body)
        in_url = await http.post(url + "?token=alice-token", json=body)
        bob = {"Authorization": "Bearer bob-token"}
        not_granted = await http.post(url + "?profile=readonly", json=body, headers=bob)
        bad_origin = await http.post(url, json=body, headers={**bob, "Origin": "http://evil"})
    assert (refused.status_code, refused.headers["www-authenticate"]) == (401, "Bearer")
    assert missing.status_code == 401
    assert in_url.status_code == 400
    assert (not_granted.status_code, not_granted.text) == (
        403,
        "profile not granted; granted: demo\n",
    )
    assert bad_origin.status_code == 403


async def test_repeated_single_headers_are_refused(gateway: Gateway) -> None:
    """SPEC M4, S2, E1: a repeated ``Authorization`` is 401 and a repeated ``Origin``,
    ``X-Toolbus-Profile`` or ``Mcp-Session-Id`` 400, never one of the two taken."""
    url = f"http://127.0.0.1:{gateway.port}/mcp"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    bob = ("Authorization", "Bearer bob-token")
    ours = ("Origin", f"http://127.0.0.1:{gateway.port}")
    cases = {
        "authorization": [bob, ("Authorization", "Bearer alice-token")],
        "origin": [bob, ("Origin", "http://evil"), ours],
        "profile": [bob, ("X-Toolbus-Profile", "readonly"), ("X-Toolbus-Profile", "demo")],
        "session": [bob, ("Mcp-Session-Id", "a"), ("Mcp-Session-Id", "b")],
    }
    async with httpx2.AsyncClient() as http:
        got = {
            name: (await http.post(url, json=body, headers=lines)).status_code
            for name, lines in cases.items()
        }
    assert got == {"authorization": 401, "origin": 400, "profile": 400, "session": 400}


async def test_websocket_still_served_on_the_same_port(gateway: Gateway) -> None:
    """SPEC M4, S1: the WebSocket path is unchanged next to ``/mcp``."""
    async with asyncio.timeout(WAIT):
        async with mcp_client(gateway, "bob-token") as client:
            await client.list_tools()
            async with peer(gateway, token="bob-token") as p:
                await p.invoke("c1", "convert_units", CONVERT)
                reply = await p.terminal("c1")
    assert (reply["type"], reply["result"]["result"]) == ("result", 100.0)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_gated_call_with_elicitation(gateway: Gateway, mode: str) -> None:
    """SPEC M4, A3, A5: the approval is asked by elicitation; yes runs it, no declines.

    ``auto`` negotiates 2026-07-28 (asked by ``InputRequiredResult`` and a retry);
    ``legacy`` the initialize handshake (asked by ``elicitation/create``)."""
    asked: list[str] = []
    answers = iter([True, False])

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": next(answers)})

    async with asyncio.timeout(WAIT):
        async with mcp_client(
            gateway, "bob-token", elicitation_callback=elicit, mode=mode
        ) as client:
            made = await client.call_tool("notes_create", {"title": "t", "body": "b"})
            note = made.structured_content
            assert isinstance(note, dict)
            allowed = await client.call_tool("notes_delete", {"note_id": note["note_id"]})
            denied = await client.call_tool("notes_delete", {"note_id": note["note_id"]})
    assert asked == [f'Allow notes_delete with {{"note_id": {note["note_id"]}}}?'] * 2
    assert allowed.is_error is False
    assert allowed.structured_content == {"deleted": note["note_id"]}
    assert denied.is_error is False
    assert denied.structured_content is not None
    assert denied.structured_content["declined"] is True
    assert _waiting(gateway) == (0, 0)


async def test_gated_call_without_elicitation_is_declined(gateway: Gateway) -> None:
    """SPEC M4, A5, A4, I11: a client that cannot be asked gets the declined result; the
    server denied it (``disconnected``: nobody could be asked), and the audit record
    says so, never that the user decided."""
    with audit_records() as records:
        async with asyncio.timeout(WAIT):
            async with mcp_client(gateway, "bob-token") as client:
                denied = await client.call_tool("notes_delete", {"note_id": 1})
    assert denied.is_error is False
    assert denied.structured_content is not None
    assert denied.structured_content["declined"] is True
    assert denied.structured_content["reason"] == "disconnected"
    (record,) = records
    assert (record["tool"], record["outcome"]) == ("notes_delete", "rejected_by_user")
    approval = record["approval"]
    assert (approval["resolution"], approval["reason"], approval["by"]) == (
        "denied",
        "disconnected",
        "server",
    )


async def test_async_tool_reports_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC M4, I9, J2: an async tool's job is awaited; its dispatch message and each
    ``job.progress`` reach the MCP client as progress, then the job's result."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", MS)
    seen: list[tuple[float, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    settings = settings_for(tmp_path, jobs={"progress_interval": 0})
    async with (
        asyncio.timeout(WAIT),
        running(settings) as gateway,
        mcp_client(gateway, "bob-token") as client,
    ):
        done = await client.call_tool("report", {"topic": "x"}, progress_callback=progress)
    assert done.is_error is False
    assert _text(done) == "Report on x with 3 section(s) is ready."
    value = done.structured_content
    assert value is not None
    assert (value["summary"], value["result"]) == (_text(done), {"sections": 3, "words": 44})
    assert [(a["name"], a["mime_type"]) for a in value["artifacts"]] == [
        ("report-x.md", "text/markdown")
    ]
    assert seen == [
        (0.0, "I'm writing that report now; I'll tell you when it's ready."),
        (1 / 3, "section 1"),
        (2 / 3, "section 2"),
        (1.0, "section 3"),
    ]


async def test_calls_are_audited_under_their_mcp_call_id(gateway: Gateway) -> None:
    """SPEC M4, I11, I15: one audit record per call, keyed ``mcp:<session>:<request id>``;
    the same request id in two MCP sessions is two calls."""
    with audit_records() as records:
        async with asyncio.timeout(WAIT):
            for _ in range(2):
                async with mcp_client(gateway, "bob-token") as client:
                    await client.call_tool("convert_units", CONVERT)
    first, second = records
    assert (first["user"], first["tool"], first["outcome"]) == ("bob", "convert_units", "ok")
    assert first["call_id"].startswith("mcp:")
    assert first["call_id"] != second["call_id"]
    assert second["outcome"] == "ok"


async def test_forged_request_state_is_refused(gateway: Gateway) -> None:
    """SPEC M4, A3, A7: a retry whose ``request_state`` was never issued answers no
    approval and runs nothing."""
    async with asyncio.timeout(WAIT):
        async with mcp_client(gateway, "bob-token") as client:
            forged = await client.session.call_tool(
                "notes_delete", {"note_id": 1}, request_state="forged", allow_input_required=True
            )
    assert isinstance(forged, types.CallToolResult)
    assert (forged.is_error, _text(forged)) == (
        True,
        "expired: this approval is no longer pending",
    )


async def test_cancelled_mcp_request_cancels_the_call(gateway: Gateway) -> None:
    """SPEC M4, I8, A4: the host cancels ``tools/call`` while its approval is asked; the
    toolbus call ends ``cancelled`` (one audit record) and nothing is left waiting."""
    ended = threading.Event()
    records: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(dict(record.audit))  # type: ignore[attr-defined]
            ended.set()

    audit = logging.getLogger("toolbus.audit")
    handler, level = Collect(), audit.level
    audit.addHandler(handler)
    audit.setLevel(logging.INFO)
    asked = asyncio.Event()

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.set()
        await asyncio.Event().wait()  # never answered: the request is cancelled meanwhile
        raise AssertionError("unreachable")

    try:
        async with (
            asyncio.timeout(WAIT),
            mcp_client(gateway, "bob-token", elicitation_callback=elicit, mode="legacy") as c,
        ):
            call = asyncio.create_task(c.call_tool("notes_delete", {"note_id": 1}))
            await asyncio.wait_for(asked.wait(), WAIT)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
            assert await asyncio.to_thread(ended.wait, WAIT)
    finally:
        audit.removeHandler(handler)
        audit.setLevel(level)
    [record] = records
    assert (record["tool"], record["outcome"]) == ("notes_delete", "cancelled")
    assert _waiting(gateway) == (0, 0)


async def test_catalog_change_sends_list_changed(tmp_path: Path) -> None:
    """SPEC M4, C3: a catalog change reaches a ``subscriptions/listen`` stream as
    ``tools/list_changed``; listing again shows the new catalog."""
    catalog, profiles = reloading_catalog(tmp_path)
    async with (
        asyncio.timeout(WAIT),
        running(settings_for(tmp_path, catalog=catalog)) as gateway,
        mcp_client(gateway, "alice-token", "readonly") as client,
    ):
        before = {t.name for t in (await client.list_tools()).tools}
        async with client.listen(tools_list_changed=True) as changes:
            stat = profiles.stat()
            profiles.write_text(
                profiles.read_text().replace(
                    "  readonly:\n    capabilities: [notes.read, time, units]",
                    "  readonly:\n    capabilities: [notes.read, time]",
                )
            )
            os.utime(profiles, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
            event = await anext(aiter(changes))
        after = {t.name for t in (await client.list_tools()).tools}
    assert isinstance(event, ToolsListChanged)
    assert before - after == {"convert_units"}


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


def test_a_tool_left_out_of_tools_list_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """SPEC M4, C4: each finding of a tool MCP cannot carry is logged once, naming the
    tool, however often hosts list."""
    finding = Finding("h_pick", "mcp", ROOT_COMBINATOR, "cannot be dropped", adapted=False)
    logged: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="gateway.mcp.serve"):
        for _ in range(3):
            _log_left_out([finding], logged)
    [record] = caplog.records
    assert record.getMessage().startswith("tool h_pick left out of /mcp tools/list: h_pick: mcp")


async def test_m4_j3_cancelled_mcp_request_of_a_promoted_call_cancels_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC M4, I14, J3, I8: a sync call promoted to a job while the host waits; the host
    cancels the request (it has no job id) and the job ends ``cancelled``."""
    monkeypatch.setattr(handlers, "SLOW_LOOKUP_SECONDS", 30.0)
    dispatched = asyncio.Event()

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        dispatched.set()

    async with running(settings_for(tmp_path)) as gw, mcp_client(gw, "bob-token") as host:
        call = asyncio.create_task(
            host.call_tool("slow_lookup", {"query": "q"}, progress_callback=progress)
        )
        await asyncio.wait_for(dispatched.wait(), WAIT)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call

        def ended() -> bool:
            rows = gw.store.jobs("bob", None, None, 10)
            return bool(rows) and rows[0].state not in ("queued", "running")

        await eventually(ended, "the job ended")
        rows = gw.store.jobs("bob", None, None, 10)
        left = _waiting(gw)
    assert [r.state for r in rows] == ["cancelled"]
    assert left == (0, 0)
