"""A mounted server's connection and tool list kept current (SPEC M2, C3): a dead HTTP
transport is the server's unavailability (``gateway/mcp/transport.py``), a failed listing
keeps the connection (``gateway/mcp/watch.py``), and every field toolbus derives from the
listing counts as a change (``gateway/mcp/server.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR

import toolbus
from catalog.mcp_mounts import MountSpec
from catalog.model import Mode, ToolDef, Visibility
from gateway.mcp.server import _listed
from gateway.mcp.transport import refusal
from gateway.mcp.watch import watch
from protocol import messages as m
from tests.mcp.support import FAULT_SERVER, client, free_port, has_tools, mcp_settings
from tests.support import MS, WAIT, running

URL = "http://127.0.0.1:1/mcp"
CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "add"}}


# -- the transport: what an HTTP answer says about the connection ------------------------


async def _refusal(
    status: int,
    body: bytes,
    *,
    session: bool = True,
    method: str = "POST",
    content_type: str = "application/json; charset=utf-8",
    sent: dict[str, Any] = CALL,
) -> str | None:
    """What :func:`refusal` says of an answer ``status``/``body`` to ``sent`` (a
    ``tools/call``; with a session id when ``session``)."""
    headers = {"mcp-session-id": "s1"} if session else {}
    request = httpx2.Request(method, URL, json=sent if method == "POST" else None, headers=headers)
    response = httpx2.Response(
        status, headers={"content-type": content_type}, content=body, request=request
    )
    return await refusal(response)


async def test_m2_an_http_error_without_a_json_rpc_answer_is_a_dead_connection() -> None:
    """SPEC M2: 404 for the session (MCP Streamable HTTP: the session is gone, whatever
    the body says), 400 with a JSON-RPC error that answers no request (the everything
    server after a restart) and a proxy's 502 page are refusals of the transport."""
    gone = b'{"jsonrpc":"2.0","id":7,"error":{"code":-32600,"message":"Session not found"}}'
    assert "HTTP 404" in str(await _refusal(404, gone))
    no_id = b'{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session"}}'
    assert "HTTP 400" in str(await _refusal(400, no_id))
    null_id = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Session not found"}}'
    assert "HTTP 404" in str(await _refusal(404, null_id, session=False))
    assert "HTTP 502" in str(
        await _refusal(502, b"<html>bad gateway</html>", content_type="text/html")
    )


async def test_m2_m3_a_json_rpc_error_answering_the_request_is_the_servers_answer() -> None:
    """SPEC M3: an error status carrying a JSON-RPC error with the request's id, a
    success, a ``GET`` (the SDK's own stream) and a notification refused with a 400 (the
    MCP spec allows it) say nothing about the connection; a 404 for the session does."""
    answer = b'{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"bad params"}}'
    assert await _refusal(400, answer) is None
    assert await _refusal(404, answer, session=False) is None
    assert await _refusal(200, b'{"jsonrpc":"2.0","id":7,"result":{}}') is None
    assert await _refusal(404, b"", method="GET") is None
    cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}
    assert await _refusal(400, b"", sent=cancelled) is None
    assert "HTTP 404" in str(await _refusal(404, b"", sent=cancelled))


# -- the watch: a failed listing keeps the connection ------------------------------------


class _Client:
    protocol_version = "2025-11-25"


def _spec() -> MountSpec:
    # A health probe would come after the test's WAIT: every listing but the first is a retry.
    timing = {"health_interval": 6 * WAIT, "backoff_initial": 5 * MS, "backoff_max": 20 * MS}
    return MountSpec(name="w", source="test", prefix="w_", capability="w", command="x", **timing)


async def _watched(failures: list[Any], lost: asyncio.Event) -> list[float]:
    """Run :func:`watch` with a ``refresh`` that raises ``failures`` in turn (an
    exception, or an exception class made then), then sets ``lost``; the loop's times
    of each listing, in seconds after the start."""
    relist = asyncio.Event()
    start = asyncio.get_running_loop().time()
    times: list[float] = []

    async def refresh(_client: Any) -> None:
        times.append(asyncio.get_running_loop().time() - start)
        if failures:
            failure = failures.pop(0)
            raise failure() if isinstance(failure, type) else failure
        lost.set()

    relist.set()
    async with asyncio.timeout(WAIT):
        await watch(_Client(), _spec(), lost, relist, refresh)  # type: ignore[arg-type]
    return times


async def test_m2_a_failed_listing_is_retried_with_backoff_on_the_same_connection() -> None:
    """SPEC M2: JSON-RPC error answers and a malformed listing keep the connection; the
    listing is tried again after backoff_initial, doubling, not after health_interval."""
    failures: list[Exception] = [MCPError(INTERNAL_ERROR, "busy"), ValueError("bad page")] * 2
    lost = asyncio.Event()
    times = await _watched(failures, lost)
    assert len(times) == 5
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[-1] >= 15 * MS, gaps  # 5, 10, 20, 20 ms: doubled, up to backoff_max


@pytest.mark.parametrize(
    "dead",
    [MCPError(CONNECTION_CLOSED, "Connection closed"), TimeoutError()],
    ids=["closed", "no-answer"],
)
async def test_m2_a_listing_the_transport_could_not_carry_ends_the_watch(dead: Exception) -> None:
    """SPEC M2: a listing cut off by the SDK's "connection closed", or unanswered within
    connect_timeout, is a dead server: the watch raises and the supervisor reconnects."""
    with pytest.raises(type(dead)):
        await _watched([dead], asyncio.Event())


async def test_m2_a_failed_listing_on_a_lost_connection_ends_the_watch() -> None:
    """SPEC M2: any failure of a listing once the transport is found dead ends the watch
    at once (no retry on that connection); the supervisor reconnects."""
    lost = asyncio.Event()

    class Refused(Exception):
        def __init__(self) -> None:
            lost.set()  # the HTTP transport saw the refusal before the SDK's answer
            super().__init__("Server returned an error response")

    assert len(await _watched([Refused, Refused], lost)) == 1


# -- what counts as a change -------------------------------------------------------------


def test_m2_c3_every_listed_field_but_the_handler_is_a_change() -> None:
    """SPEC M1, M2, C3: a listing that changes any field toolbus derives from it
    (annotations included: idempotent, read_only, title) is republished; a new handler
    closure alone is not a change."""
    tool = ToolDef(name="w_a", description="d", parameters={"type": "object"}, capability="w",
                   mode=Mode.SYNC, func=lambda: None)  # fmt: skip
    changed = {
        bool: lambda v: not v,
        str: lambda v: f"{v}x",
        float: lambda v: (v or 0) + 1,
        dict: lambda v: {**v, "title": "x"},
        tuple: lambda v: (*v, "x"),
        Mode: lambda v: Mode.ASYNC,
        Visibility: lambda v: Visibility(sandbox_only=True),
    }
    assert _listed({"w_a": tool}) == _listed({"w_a": dataclasses.replace(tool, func=print)})
    for field in dataclasses.fields(ToolDef):
        if field.name == "func":
            continue
        value = getattr(tool, field.name)
        kind = next(k for k in changed if isinstance(value, k) or (value is None and k is str))
        if field.name in ("timeout", "promote_after"):
            kind = float
        other = dataclasses.replace(tool, **{field.name: changed[kind](value)})
        assert _listed({"w_a": other}) != _listed({"w_a": tool}), field.name


# -- a real Streamable HTTP server that stops and restarts on the same port --------------


@contextlib.asynccontextmanager
async def _fault_http(port: int, tmp: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(FAULT_SERVER),
        "http",
        str(port),
        env={"FAULT_DIR": str(tmp), "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    try:
        async with asyncio.timeout(WAIT):
            while b"Uvicorn running on" not in await process.stderr.readline():
                pass
        yield process
    finally:
        if process.returncode is None:
            process.kill()  # uvicorn's SIGTERM waits for toolbus's open streams to close
            await process.wait()


async def _calls_until_result(bus: toolbus.Client) -> list[str]:
    """Call ``f_add`` every 50 ms until it answers; the failures on the way."""
    errors: list[str] = []
    async with asyncio.timeout(WAIT):
        while True:
            try:
                out = await bus.invoke("f_add", {"a": 1, "b": 2})
            except toolbus.CallFailed as exc:
                errors.append(f"{exc.event.code}: {exc.event.message}")
                await asyncio.sleep(0.05)
                continue
            assert isinstance(out, m.Result)
            return errors


def _http_mount(port: int) -> dict[str, Any]:
    """The fault server over Streamable HTTP; no health probe within a test."""
    return {
        "name": "f",
        "url": f"http://127.0.0.1:{port}/mcp",
        "capability": "faults",
        "include": ["add", "crash", "grow", "extra"],
        "health_interval": 600,
        "backoff_initial": 0.1,
        "backoff_max": 0.2,
    }


async def test_m2_a_sessionless_http_server_restarted_is_used_and_listened_to_again(
    tmp_path: Path,
) -> None:
    """SPEC M2: the SDK's Streamable HTTP server negotiates 2026-07-28, which keeps no
    MCP session (the everything server, which keeps them, is
    tests/mcp/test_h_mcp_attacks.py's restart test). Killed and restarted on its port,
    it is used again (calls meanwhile answer ``unavailable``), and its ``list_changed``
    stream is opened again: a tool it adds then reaches the catalog before any health
    probe. Before, the stream ended with the first process and was never reopened."""
    port = free_port()
    settings = mcp_settings(tmp_path, [_http_mount(port)])
    async with _fault_http(port, tmp_path) as first, running(settings) as gw, client(gw) as bus:
        await has_tools(bus, "f_add")
        assert await _calls_until_result(bus) == []
        first.kill()
        await first.wait()
        async with _fault_http(port, tmp_path):
            errors = await _calls_until_result(bus)
            grown = await bus.invoke("f_grow", {})
            assert isinstance(grown, m.Result)
            await has_tools(bus, "f_extra")
    assert all(e.startswith("unavailable") for e in errors), errors


async def test_m2_an_http_server_that_refuses_connections_is_unavailable(tmp_path: Path) -> None:
    """SPEC M2: a stopped Streamable HTTP server (connection refused) makes its tools
    answer ``unavailable`` while toolbus keeps trying to reconnect, with backoff."""
    port = free_port()
    settings = mcp_settings(tmp_path, [_http_mount(port)])
    async with _fault_http(port, tmp_path) as only, running(settings) as gw, client(gw) as bus:
        await has_tools(bus, "f_add")
        assert await _calls_until_result(bus) == []
        only.kill()
        await only.wait()
        server = gw.mcp.servers["f"]
        for _ in range(3):
            with pytest.raises(toolbus.Unavailable):
                await bus.invoke("f_add", {"a": 1, "b": 2})
        async with asyncio.timeout(WAIT):
            while server.attempts < 3:  # noqa: ASYNC110 - the supervisor's retries
                await asyncio.sleep(0.05)
        assert server.client is None


async def test_m2_an_http_server_that_dies_mid_call_is_unavailable_then_reconnected(
    tmp_path: Path,
) -> None:
    """SPEC M2: a Streamable HTTP server that exits during a call (its connection closed
    under the response) ends the call ``unavailable``, never ``handler_error``; once it
    is back on its port, calls answer again."""
    port = free_port()
    settings = mcp_settings(tmp_path, [_http_mount(port)])
    async with _fault_http(port, tmp_path) as first, running(settings) as gw, client(gw) as bus:
        await has_tools(bus, "f_add", "f_crash")
        with pytest.raises(toolbus.Unavailable):
            await bus.invoke("f_crash", {})
        await first.wait()
        async with _fault_http(port, tmp_path):
            errors = await _calls_until_result(bus)
            assert gw.mcp.servers["f"].client is not None
    assert all(e.startswith("unavailable") for e in errors), errors
