"""The MCP project's reference server "everything", mounted over stdio and Streamable
HTTP, every tool called over a real toolbus socket with the Python client (SPEC M1-M3).

The server is installed by ``scripts/ensure-mcp-everything``; docs/mcp.md keeps the table
of what each tool does through toolbus.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import toolbus
from protocol import messages as m
from tests.mcp.support import client, everything_entry, free_port, has_tools, mcp_settings
from tests.support import WAIT, running

TOOLS = {
    "echo",
    "get-annotated-message",
    "get-env",
    "get-resource-links",
    "get-resource-reference",
    "get-structured-content",
    "get-sum",
    "get-tiny-image",
    "gzip-file-as-resource",
    "toggle-simulated-logging",
    "toggle-subscriber-updates",
    "trigger-long-running-operation",
    "trigger-sampling-request",
    "trigger-elicitation-request",
    "trigger-url-elicitation",
    "simulate-research-query",
}
"""Every tool the server lists to toolbus's MCP client, which declares sampling and
elicitation but not roots or tasks: the tools needing those are only registered for
clients that declare them."""

GZ_DATA = "data:text/plain;base64," + base64.b64encode(b"hello toolbus").decode()
LONG_RUNNING = {"mode": "async", "dispatch_message": "Working on it."}


def _mount(**transport: Any) -> dict[str, Any]:
    return {
        "name": "ev",
        "capability": "everything",
        "tools": {"trigger-long-running-operation": LONG_RUNNING},
        **transport,
    }


def _kinds(result: dict[str, Any]) -> list[str]:
    return [block["type"] for block in result["content"]]


async def _call(
    bus: toolbus.Client, tool: str, params: dict[str, Any], call_id: str | None = None
) -> dict[str, Any]:
    out = await bus.invoke("ev_" + tool, params, call_id=call_id)
    assert isinstance(out, m.Result), out
    return out.result


async def _every_tool(bus: toolbus.Client, events: list[Any]) -> dict[str, str]:
    """Call every tool once (twice for toggles); return tool -> what happened."""
    table: dict[str, str] = {}
    r = await _call(bus, "echo", {"message": "hi"})
    assert r["text"] == "Echo: hi"
    table["echo"] = "result: text"
    r = await _call(bus, "get-annotated-message", {"messageType": "error", "includeImage": True})
    assert _kinds(r) == ["text", "image"]
    assert r["content"][0]["annotations"] == {"priority": 1.0, "audience": ["user", "assistant"]}
    assert r["artifacts"][0]["mime_type"] == "image/png"
    table["get-annotated-message"] = "result: annotated text + image artifact"
    r = await _call(bus, "get-env", {})
    assert _kinds(r) == ["text"]
    assert '"PATH"' in r["text"]
    table["get-env"] = "result: text (the server's environment)"
    r = await _call(bus, "get-resource-links", {"count": 2})
    assert _kinds(r) == ["text", "resource_link", "resource_link"]
    assert [a["uri"] for a in r["artifacts"]] == [
        "demo://resource/dynamic/blob/1",
        "demo://resource/dynamic/text/2",
    ]
    table["get-resource-links"] = "result: text + 2 resource_link artifacts (references)"
    r = await _call(bus, "get-resource-reference", {"resourceType": "Blob", "resourceId": 2})
    assert "resource" in _kinds(r)
    blob = next(a for a in r["artifacts"] if a["uri"] == "demo://resource/dynamic/blob/2")
    assert blob["encoding"] == "base64"
    r = await _call(bus, "get-resource-reference", {"resourceType": "Text", "resourceId": 1})
    text = next(a for a in r["artifacts"] if a["uri"] == "demo://resource/dynamic/text/1")
    assert "encoding" not in text
    assert text["content"]
    table["get-resource-reference"] = "result: embedded resource artifact (blob base64, or text)"
    r = await _call(bus, "get-structured-content", {"location": "Chicago"})
    assert set(r["structured"]) == {"temperature", "conditions", "humidity"}
    table["get-structured-content"] = "result: structuredContent under structured"
    r = await _call(bus, "get-sum", {"a": 2, "b": 3})
    assert r["text"] == "The sum of 2 and 3 is 5."
    table["get-sum"] = "result: text"
    r = await _call(bus, "get-tiny-image", {})
    assert _kinds(r) == ["text", "image", "text"]
    assert base64.b64decode(r["artifacts"][0]["content"])[:4] == b"\x89PNG"
    table["get-tiny-image"] = "result: text + PNG image artifact"
    params = {"name": "hello.gz", "data": GZ_DATA, "outputType": "resource"}
    r = await _call(bus, "gzip-file-as-resource", params)
    gz = r["artifacts"][0]
    assert (gz["mime_type"], gz["encoding"]) == ("application/gzip", "base64")
    assert base64.b64decode(gz["content"])[:2] == b"\x1f\x8b"
    r = await _call(bus, "gzip-file-as-resource", {**params, "outputType": "resourceLink"})
    assert _kinds(r) == ["resource_link"]
    table["gzip-file-as-resource"] = "result: gzip blob artifact, or a resource_link"
    for toggle in ("toggle-simulated-logging", "toggle-subscriber-updates"):
        on, off = await _call(bus, toggle, {}), await _call(bus, toggle, {})
        assert on["text"] != off["text"]
        table[toggle] = "result: text (on, then off)"
    handle = await bus.invoke("ev_trigger-long-running-operation", {"duration": 1, "steps": 4})
    assert isinstance(handle, toolbus.JobHandle)
    outcome = await handle.result(timeout=WAIT)
    assert outcome.ok
    assert outcome.summary.startswith("Long running operation completed.")
    progress = [e.progress for e in events if isinstance(e, m.JobProgress)]
    assert progress == [0.25, 0.5, 0.75, 1.0]
    table["trigger-long-running-operation"] = "job (mode: async): 4 job.progress, job.done"
    with pytest.raises(toolbus.HandlerError) as caught:
        await bus.invoke("ev_trigger-sampling-request", {"prompt": "hi"})
    assert "sampling is not available: toolbus does not offer an LLM" in caught.value.event.message
    table["trigger-sampling-request"] = "handler_error: sampling refused, with the reason"
    r = await _call(bus, "trigger-elicitation-request", {})
    assert "User inputs:\n- Name: Ada\n- Agreed to terms: true" in r["text"]
    table["trigger-elicitation-request"] = (
        "elicit.request to the client; its answer reaches the server"
    )
    r = await _call(bus, "trigger-url-elicitation", {"url": "https://example.com/"})
    assert r["text"].startswith("❌ User declined to open the URL")
    table["trigger-url-elicitation"] = "result: URL-mode elicitation declined by toolbus"
    with pytest.raises(toolbus.HandlerError) as caught:
        await bus.invoke("ev_simulate-research-query", {"topic": "x"})
    table["simulate-research-query"] = f"handler_error: {caught.value.event.message}"
    return table


@pytest.fixture
async def everything_http() -> AsyncIterator[str]:
    """The everything server over Streamable HTTP on a free port; its URL."""
    port = free_port()
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
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        await process.wait()


async def test_everything_over_stdio_every_tool(tmp_path: Path) -> None:
    """SPEC M1-M3: every tool of the reference server is mounted with a valid schema and
    answers through the toolbus pipeline as the documented table says."""
    mount = _mount(command="node", args=[str(everything_entry()), "stdio"])
    settings = mcp_settings(tmp_path, [mount], jobs={"progress_interval": 0})
    events: list[Any] = []

    def elicited(req: m.ElicitRequest) -> tuple[m.ElicitAction, dict[str, Any] | None]:
        return m.ElicitAction.ACCEPT, {"name": "Ada", "check": True}

    async with (
        running(settings) as gw,
        client(gw, on_job_event=events.append, on_elicitation=elicited) as bus,
    ):
        await has_tools(bus, *("ev_" + t for t in TOOLS))
        assert {t.name for t in bus.catalog} == {"ev_" + t for t in TOOLS}
        assert gw.mcp.servers["ev"].problems == []
        table = await _every_tool(bus, events)
        assert set(table) == TOOLS
        print("\n".join(f"| `{tool}` | {what} |" for tool, what in sorted(table.items())))


async def test_everything_over_streamable_http(
    tmp_path: Path,
    everything_http: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SPEC M1: the same server over Streamable HTTP (URL, headers with a secret from the
    environment) mounts and calls; the secret appears in no log record."""
    caplog.set_level(logging.DEBUG, logger="gateway")
    mount = _mount(url=everything_http, headers={"X-Test": "${TOOLBUS_TEST_HEADER}"})
    monkeypatch.setenv("TOOLBUS_TEST_HEADER", "secret-value")
    settings = mcp_settings(tmp_path, [mount])
    async with running(settings) as gw, client(gw) as bus:
        await has_tools(bus, "ev_get-sum", "ev_echo")
        r = await _call(bus, "get-sum", {"a": 1, "b": 2})
        assert r["text"] == "The sum of 1 and 2 is 3."
        r = await _call(bus, "get-tiny-image", {})
        assert _kinds(r) == ["text", "image", "text"]
    assert "secret-value" not in caplog.text


async def test_everything_sampling_answered_when_configured(tmp_path: Path) -> None:
    """SPEC M3: with ``sampling: module:function`` the server's sampling request is
    answered by that handler, and the tool's result carries its answer."""
    mount = _mount(
        command="node",
        args=[str(everything_entry()), "stdio"],
        sampling="tests.mcp.sampling_for_tests:sample",
        include=["trigger-sampling-request"],
    )
    async with running(mcp_settings(tmp_path, [mount])) as gw, client(gw) as bus:
        await has_tools(bus, "ev_trigger-sampling-request")
        r = await _call(bus, "trigger-sampling-request", {"prompt": "hello"})
        assert "sampled: " in r["text"]
        assert "hello" in r["text"]
        assert "toolbus-test" in r["text"]


async def test_elicitation_reaches_the_client_and_its_answer_goes_back(tmp_path: Path) -> None:
    """SPEC M3: the server's ``elicitation/create`` during a call is an ``elicit.request``
    for the calling session with the requested schema; the client's answer reaches the
    server. A forged id, or an answer once the question is settled, is not accepted, with
    the reason ``tool.confirm`` gives (SPEC A3)."""
    mount = _mount(
        command="node",
        args=[str(everything_entry()), "stdio"],
        include=["trigger-elicitation-request"],
    )
    asked: list[m.ElicitRequest] = []
    results: list[m.ElicitResult] = []

    async def answer(req: m.ElicitRequest) -> tuple[m.ElicitAction, dict[str, Any] | None]:
        asked.append(req)
        results.append(await bus.answer_elicitation("el_forged", m.ElicitAction.ACCEPT, {}))
        return m.ElicitAction.DECLINE, None

    async with (
        running(mcp_settings(tmp_path, [mount])) as gw,
        client(gw, on_elicitation=answer) as bus,
    ):
        await has_tools(bus, "ev_trigger-elicitation-request")
        r = await _call(bus, "trigger-elicitation-request", {}, call_id="e1")
        assert r["text"].startswith("❌ User declined to provide the requested information.")
        [req] = asked
        assert (req.call_id, req.tool) == ("e1", "ev_trigger-elicitation-request")
        assert req.message == "Please provide inputs for the following fields:"
        assert req.requested_schema["properties"]["name"]["type"] == "string"
        late = await bus.answer_elicitation(req.elicitation_id, m.ElicitAction.ACCEPT, {})
        [forged] = results
        assert (forged.accepted, forged.reason) == (False, m.NotAcceptedReason.UNKNOWN)
        assert (late.accepted, late.reason) == (False, m.NotAcceptedReason.UNKNOWN)
