"""Mounting a small MCP server (the SDK's MCPServer) over stdio, through a real toolbus
socket with the Python client: every path of SPEC M1-M3 and the faults of a real server."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest
import yaml

import toolbus
from gateway.mcp.calls import MALFORMED, unparsed_answer
from protocol import messages as m
from tests.mcp.support import client, eventually, fault_mount, has_tools, mcp_settings
from tests.support import WAIT, running

PNG = "iVBORw0KGgpmYWtl"


def _text_result(text: str, structured: Any) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": text}],
        "artifacts": [],
        "text": text,
        "summary": text,
        "structured": structured,
    }


async def _steps_job(
    tmp_path: Path, override: dict[str, Any], count: int
) -> tuple[toolbus.JobOutcome, list[m.JobProgress]]:
    """Run the fault server's ``steps`` tool (with this ``steps`` override, progress sent
    at once) for ``count`` steps; it must become a job. Its outcome and the
    ``job.progress`` events the client got (SPEC M3)."""
    mount = fault_mount(tmp_path, tools={"steps": override})
    settings = mcp_settings(tmp_path, [mount], jobs={"progress_interval": 0})
    events: list[Any] = []
    async with running(settings) as gw, client(gw, on_job_event=events.append) as bus:
        await has_tools(bus, "f_steps")
        handle = await bus.invoke("f_steps", {"count": count})
        assert isinstance(handle, toolbus.JobHandle)
        outcome = await handle.result(timeout=WAIT)
    return outcome, [e for e in events if isinstance(e, m.JobProgress)]


async def test_mounted_tools_enter_the_catalog_with_annotation_defaults(tmp_path: Path) -> None:
    """SPEC M1, C3: tools appear under the prefix and capability; destructiveHint makes a
    tool dangerous and gated, readOnlyHint/idempotentHint carry over."""
    settings = mcp_settings(tmp_path, [fault_mount(tmp_path)], allow_dangerous=["f_wipe"])
    async with running(settings) as gw, client(gw) as bus:
        await has_tools(bus, "f_add", "f_wipe", "f_media")
        wipe, add = bus.tool("f_wipe"), bus.tool("f_add")
        assert wipe is not None
        assert add is not None
        assert (wipe.dangerous, wipe.requires_approval) == (True, True)
        assert (add.dangerous, add.requires_approval) == (False, False)
        tool = gw.catalog.current.tools["f_add"]
        assert (tool.read_only, tool.idempotent, tool.capability) == (True, True, "faults")
        out = await bus.invoke("f_add", {"a": 2, "b": 3})
        assert isinstance(out, m.Result)
        assert out.result == _text_result("5", {"result": 5})


async def test_params_are_validated_by_toolbus_before_the_mcp_call(tmp_path: Path) -> None:
    """SPEC M1, I4: toolbus refuses bad arguments with JSON pointers; nothing is sent."""
    async with running(mcp_settings(tmp_path, [fault_mount(tmp_path)])) as gw, client(gw) as bus:
        await has_tools(bus, "f_add")
        with pytest.raises(toolbus.InvalidParams) as caught:
            await bus.invoke("f_add", {"a": "two"})
        pointers = sorted(v.pointer for v in caught.value.violations)
        assert pointers == ["", "/a"]


async def test_every_content_type_and_structured_content_map(tmp_path: Path) -> None:
    """SPEC M3: text, image, audio, text and blob resources, resource link and
    structuredContent become the documented result and artifacts (docs/mcp.md)."""
    async with running(mcp_settings(tmp_path, [fault_mount(tmp_path)])) as gw, client(gw) as bus:
        await has_tools(bus, "f_media")
        out = await bus.invoke("f_media", {})
        assert isinstance(out, m.Result)
        assert out.result == {
            "content": [
                {"type": "text", "text": "every kind"},
                {"type": "image", "mime_type": "image/png", "artifact": "f_media-1.png"},
                {"type": "audio", "mime_type": "audio/wav", "artifact": "f_media-2.wav"},
                {
                    "type": "resource",
                    "uri": "file:///notes/a.txt",
                    "mime_type": "text/plain",
                    "artifact": "a.txt",
                },
                {
                    "type": "resource",
                    "uri": "file:///bin/b.dat",
                    "mime_type": "application/octet-stream",
                    "artifact": "b.dat",
                },
                {
                    "type": "resource_link",
                    "uri": "file:///docs/c.md",
                    "name": "c.md",
                    "mime_type": "text/markdown",
                },
            ],
            "artifacts": [
                {
                    "name": "f_media-1.png",
                    "mime_type": "image/png",
                    "encoding": "base64",
                    "content": PNG,
                },
                {
                    "name": "f_media-2.wav",
                    "mime_type": "audio/wav",
                    "encoding": "base64",
                    "content": "UklGRi4uLi5XQVZFZm10IA==",
                },
                {
                    "name": "a.txt",
                    "uri": "file:///notes/a.txt",
                    "mime_type": "text/plain",
                    "content": "note a",
                },
                {
                    "name": "b.dat",
                    "uri": "file:///bin/b.dat",
                    "mime_type": "application/octet-stream",
                    "encoding": "base64",
                    "content": PNG,
                },
                {"uri": "file:///docs/c.md", "name": "c.md", "mime_type": "text/markdown"},
            ],
            "text": "every kind",
            "summary": "every kind",
            "structured": {"kinds": 6},
        }


async def test_is_error_becomes_handler_error_with_the_servers_text(tmp_path: Path) -> None:
    """SPEC M3: ``isError`` ends the call ``handler_error`` with exactly the server's text."""
    async with running(mcp_settings(tmp_path, [fault_mount(tmp_path)])) as gw, client(gw) as bus:
        await has_tools(bus, "f_fail")
        with pytest.raises(toolbus.HandlerError) as caught:
            await bus.invoke("f_fail", {"reason": "disk full"})
        assert caught.value.event.message == "cannot: disk full"


async def test_progress_becomes_job_progress_for_an_async_override(tmp_path: Path) -> None:
    """SPEC M1 overrides, M3: ``mode: async`` makes a job; MCP progress is job.progress."""
    override = {"mode": "async", "dispatch_message": "Counting."}
    outcome, events = await _steps_job(tmp_path, override, 3)
    assert outcome.ok
    assert outcome.summary == "3 steps"
    progress = [(e.progress, e.message) for e in events]
    assert progress == [(1 / 3, "step 1"), (2 / 3, "step 2"), (1.0, "step 3")]


async def test_progress_that_overflows_is_reported_without_a_fraction(tmp_path: Path) -> None:
    """SPEC M3, I16: a server's progress whose fraction is not a finite number (1e308 of
    1e-308) is still reported, as its message with no fraction, and the job ends well."""
    mount = fault_mount(tmp_path, tools={"overflow": {"mode": "async"}})
    settings = mcp_settings(tmp_path, [mount], jobs={"progress_interval": 0})
    events: list[Any] = []
    async with running(settings) as gw, client(gw, on_job_event=events.append) as bus:
        await has_tools(bus, "f_overflow")
        handle = await bus.invoke("f_overflow", {})
        assert isinstance(handle, toolbus.JobHandle)
        outcome = await handle.result(timeout=WAIT)
    assert outcome.ok
    assert outcome.summary == "overflowed"
    progress = [(e.progress, e.message) for e in events if isinstance(e, m.JobProgress)]
    assert progress == [(None, "huge")]


async def test_call_cancel_reaches_the_mcp_server(tmp_path: Path) -> None:
    """SPEC M3, I8: ``call.cancel`` ends the call ``cancelled`` and the SDK's
    ``notifications/cancelled`` stops the server's handler (its marker file says so)."""
    async with running(mcp_settings(tmp_path, [fault_mount(tmp_path)])) as gw, client(gw) as bus:
        await has_tools(bus, "f_hang")
        call = asyncio.ensure_future(bus.invoke("f_hang", {}, call_id="h1"))
        await eventually(lambda: (tmp_path / "hang-started").exists(), "hang started")
        await bus.cancel("h1")
        with pytest.raises(toolbus.Cancelled):
            await call
        await eventually(lambda: (tmp_path / "hang-cancelled").exists(), "server cancelled")


async def test_job_cancel_reaches_the_mcp_server(tmp_path: Path) -> None:
    """SPEC M3, J3: ``job.cancel`` of a mounted async tool cancels the MCP request."""
    mount = fault_mount(tmp_path, tools={"hang": {"mode": "async"}})
    async with running(mcp_settings(tmp_path, [mount])) as gw, client(gw) as bus:
        await has_tools(bus, "f_hang")
        handle = await bus.invoke("f_hang", {})
        assert isinstance(handle, toolbus.JobHandle)
        await eventually(lambda: (tmp_path / "hang-started").exists(), "hang started")
        info = await handle.cancel(timeout=WAIT)
        assert info.state is m.JobState.CANCELLED
        await eventually(lambda: (tmp_path / "hang-cancelled").exists(), "server cancelled")


async def test_dangerous_mounted_tool_goes_through_approval(tmp_path: Path) -> None:
    """SPEC M1, A1-A3: a destructiveHint tool waits for the user's decision."""
    asked: list[str] = []

    async def approve(request: toolbus.ApprovalRequest) -> toolbus.Decision:
        asked.append(request.tool)
        return toolbus.Decision.ALLOW

    settings = mcp_settings(tmp_path, [fault_mount(tmp_path)], allow_dangerous=["f_wipe"])
    async with running(settings) as gw, client(gw, on_approval=approve) as bus:
        await has_tools(bus, "f_wipe")
        out = await bus.invoke("f_wipe", {"target": "tmp"})
        assert isinstance(out, m.Result)
        assert out.result["text"] == "wiped tmp"
        assert asked == ["f_wipe"]


async def test_list_changed_reloads_and_pushes_the_catalog(tmp_path: Path) -> None:
    """SPEC M2, C3: the server's tools/list_changed reaches every session as a catalog push."""
    async with running(mcp_settings(tmp_path, [fault_mount(tmp_path)])) as gw, client(gw) as bus:
        await has_tools(bus, "f_grow")
        assert bus.tool("f_extra") is None
        await bus.invoke("f_grow", {})
        await has_tools(bus, "f_extra")
        out = await bus.invoke("f_extra", {})
        assert isinstance(out, m.Result)
        assert out.result["text"] == "extra"


async def test_include_exclude_filter_the_mounted_tools(tmp_path: Path) -> None:
    """SPEC M1: include patterns, then exclude, choose the tools; the prefix is applied."""
    mount = fault_mount(tmp_path, include=["a*", "m*", "s*"], exclude=["media"], prefix="x-")
    async with running(mcp_settings(tmp_path, [mount])) as gw, client(gw) as bus:
        await has_tools(bus, "x-add", "x-steps")
        assert sorted(t.name for t in bus.catalog) == ["x-add", "x-steps"]


async def test_case_server_crash_mid_call_is_unavailable_then_restarted(tmp_path: Path) -> None:
    """SPEC M2: a server that exits mid-call ends the call ``unavailable``; its tools stay
    and answer ``unavailable`` while it is down; it is restarted with backoff."""
    mount = fault_mount(tmp_path, backoff_initial=0.2)
    async with running(mcp_settings(tmp_path, [mount])) as gw, client(gw) as bus:
        await has_tools(bus, "f_crash", "f_add")
        server = gw.mcp.servers["f"]
        with pytest.raises(toolbus.Unavailable) as caught:
            await bus.invoke("f_crash", {})
        assert caught.value.event.message == "MCP server 'f' went away during the call"
        await eventually(lambda: server.attempts == 1 and server.client is not None, "restart")
        out = await bus.invoke("f_add", {"a": 1, "b": 1})
        assert isinstance(out, m.Result)
        assert out.result["text"] == "2"


class _Audit(logging.Handler):
    """Collects audit records (the ``toolbus.audit`` logger does not propagate)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.audit)  # type: ignore[attr-defined]


@pytest.fixture
def audited() -> Iterator[_Audit]:
    """Audit records written during the test (SPEC I11)."""
    logger, handler = logging.getLogger("toolbus.audit"), _Audit()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_case_server_down_tools_answer_unavailable(tmp_path: Path, audited: _Audit) -> None:
    """SPEC M2, I11: while a server is down (a long backoff here) its tools answer a typed
    ``unavailable`` naming the server and why; they stay in the catalog; every call is
    audited with its outcome and ``sensitive`` override masking."""
    mount = fault_mount(tmp_path, backoff_initial=60, tools={"add": {"sensitive": ["a"]}})
    async with running(mcp_settings(tmp_path, [mount])) as gw, client(gw) as bus:
        await has_tools(bus, "f_crash", "f_add")
        out = await bus.invoke("f_add", {"a": 1, "b": 1})
        assert isinstance(out, m.Result)
        with pytest.raises(toolbus.Unavailable):
            await bus.invoke("f_crash", {})
        with pytest.raises(toolbus.Unavailable) as caught:
            await bus.invoke("f_add", {"a": 1, "b": 1})
        message = caught.value.event.message
        assert message.startswith("MCP server 'f' is not connected (")
        assert message.endswith("); it is being reconnected")
        assert bus.tool("f_add") is not None
    outcomes = [(r["tool"], r["outcome"], r["params"]) for r in audited.records]
    assert outcomes == [
        ("f_add", "ok", {"a": "***", "b": 1}),
        ("f_crash", "unavailable", {}),
        ("f_add", "unavailable", {"a": "***", "b": 1}),
    ]


async def test_case_hanging_server_does_not_block_startup(tmp_path: Path) -> None:
    """SPEC M2, C3: a server that never answers does not delay start-up; file tools
    serve at once, and the server is retried after its connect timeout."""
    hang = {
        "name": "slow",
        "command": "python3",
        "args": ["-c", "import time; time.sleep(3600)"],
        "connect_timeout": 0.2,
        "backoff_initial": 0.05,
    }
    clock = {
        "name": "clock_now",
        "description": "Now.",
        "capability": "slow",
        "handler": "gateway.demo.handlers:clock_now",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}},
    }
    async with running(mcp_settings(tmp_path, [hang], tools=[clock])) as gw, client(gw) as bus:
        assert [t.name for t in bus.catalog] == ["clock_now"]
        out = await bus.invoke("clock_now", {"timezone": "UTC"})
        assert isinstance(out, m.Result)
        server = gw.mcp.servers["slow"]
        await eventually(lambda: server.attempts >= 1, "a connect attempt timed out")
        assert server.last_error == "no answer within connect_timeout"
        assert [t.name for t in bus.catalog] == ["clock_now"]


async def test_hot_reload_reconciles_the_mounts(tmp_path: Path) -> None:
    """SPEC M2, C3: a reload that changes a server's entry restarts it with the new
    configuration (here a narrower include); removing it withdraws its tools."""
    async with running(mcp_settings(tmp_path, [fault_mount(tmp_path)])) as gw, client(gw) as bus:
        await has_tools(bus, "f_add", "f_media")
        tools_file = tmp_path / "catalog" / "tools.yaml"
        narrower = fault_mount(tmp_path, include=["add"])
        tools_file.write_text(yaml.safe_dump({"tools": [], "mcp_servers": [narrower]}))
        gw.catalog._stamps = {}  # as if the poller saw a new modification time
        assert gw.catalog.reload()
        await bus.wait_catalog(lambda tools: [t.name for t in tools] == ["f_add"], timeout=WAIT)
        tools_file.write_text(yaml.safe_dump({"tools": [], "mcp_servers": []}))
        gw.catalog._stamps = {}
        assert gw.catalog.reload()
        await bus.wait_catalog(lambda tools: tools == [], timeout=WAIT)
        assert gw.mcp.servers == {}


async def test_timeout_override_cancels_the_mcp_request(tmp_path: Path) -> None:
    """SPEC M1 overrides, I8, M3: ``timeout`` ends a hanging call ``timeout`` and the
    MCP request is cancelled at the server."""
    mount = fault_mount(tmp_path, tools={"hang": {"timeout": 0.5}})
    async with running(mcp_settings(tmp_path, [mount])) as gw, client(gw) as bus:
        await has_tools(bus, "f_hang")
        with pytest.raises(toolbus.Timeout):
            await bus.invoke("f_hang", {})
        await eventually(lambda: (tmp_path / "hang-cancelled").exists(), "server cancelled")


async def test_promote_after_override_makes_a_job_with_progress(tmp_path: Path) -> None:
    """SPEC M1 overrides, I14, M3: past ``promote_after`` a sync MCP call becomes a job;
    its later MCP progress is ``job.progress`` and its result ``job.done``."""
    outcome, events = await _steps_job(tmp_path, {"promote_after": 0.001}, 5)
    assert outcome.ok
    assert outcome.summary == "5 steps"
    assert [e.message for e in events][-1] == "step 5"


# -- SPEC M3, J6: a response line the SDK's parser refuses ---------------------------------

RAW_SERVER = Path(__file__).resolve().parent / "raw_server.py"
_SURROGATE = '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"cut \\ud83d"}]}}'


def _refused(line: str) -> Exception:
    try:
        mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        return exc
    raise AssertionError(f"the SDK parsed {line!r}")


@pytest.mark.parametrize("request_id", ["7", '"r-7"'])
def test_an_unparsable_response_answers_its_request(request_id: str) -> None:
    """SPEC M3, J6: a response the SDK cannot parse becomes a JSON-RPC error for its id,
    marked as toolbus's (MALFORMED), so the call ends instead of waiting."""
    answer = unparsed_answer(_refused(_SURROGATE % request_id))
    assert answer is not None
    error = answer.message
    assert isinstance(error, mcp_types.JSONRPCError)
    assert error.id == json.loads(request_id)
    assert error.error.data == MALFORMED
    assert error.error.message.startswith("1 problem(s), first: Invalid JSON")


@pytest.mark.parametrize(
    "line",
    [
        '{"jsonrpc":"2.0","method":"notifications/message","params":{"x":"\\ud83d"}}',
        '{"jsonrpc":"2.0","id":3,"method":"ping","params":{"x":"\\ud83d"}}',
        '{"jsonrpc":"2.0","id":true,"result":{"x":"\\ud83d"}}',
        "not json at all",
    ],
    ids=["notification", "request", "bool-id", "garbage"],
)
def test_an_unparsable_line_of_no_request_stays_the_sdks(line: str) -> None:
    """SPEC M3: a line that is not a response with a readable id answers no call."""
    assert unparsed_answer(_refused(line)) is None
    assert unparsed_answer(RuntimeError("not a parse failure")) is None


async def test_a_result_line_the_sdk_cannot_parse_ends_the_call_at_once(tmp_path: Path) -> None:
    """SPEC M3, J6 (docs/mcp.md): a lone surrogate escape in a server's answer ends the
    call handler_error naming the server, well before its run timeout."""
    mount = {
        "name": "raw",
        "command": sys.executable,
        "args": [str(RAW_SERVER)],
        "capability": "raw",
        "tools": {"surrogate": {"timeout": 30}},
    }
    async with running(mcp_settings(tmp_path, [mount])) as gw, client(gw) as bus:
        await has_tools(bus, "raw_surrogate", "raw_ok")
        with pytest.raises(toolbus.CallFailed) as failed:
            await asyncio.wait_for(bus.invoke("raw_surrogate", {}), WAIT)
        assert isinstance(await bus.invoke("raw_ok", {}), m.Result)
    assert failed.value.event.code == "handler_error"
    assert failed.value.event.message.startswith(
        "MCP server 'raw' sent a malformed result: 1 problem(s), first: Invalid JSON"
    )
