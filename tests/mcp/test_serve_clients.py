"""``/mcp`` for every kind of MCP client (SPEC M4): initialize-handshake clients told of
catalog changes, internal sessions outside the WebSocket session limit (SPEC E2), and
the MCP project's own Inspector CLI driving ``/mcp`` headless.

Every test runs the real gateway on 127.0.0.1. The Inspector is the npm package
``@modelcontextprotocol/inspector``, installed by ``scripts/ensure-mcp-inspector`` into
``.cache/mcp-inspector`` (missing: the test fails with the command to run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from gateway.server import Gateway
from tests.mcp.support import reloading_catalog
from tests.support import CONVERT, WAIT, peer, running, settings_for

ROOT = Path(__file__).resolve().parents[2]
INSPECTOR = ROOT / ".cache/mcp-inspector/node_modules/.bin/mcp-inspector"


@contextlib.asynccontextmanager
async def handshake_client(
    gw: Gateway,
    token: str,
    profile: str,
    seen: list[Any],
    get_stream: asyncio.Event,
    changed: asyncio.Event,
) -> AsyncIterator[Client]:
    """The SDK's client in ``legacy`` mode (initialize handshake, a version before
    2026-07-28) on ``/mcp``. Every server notification lands in ``seen`` (``changed``
    is set by ``tools/list_changed``), and ``get_stream`` is set once its standalone
    GET stream is open."""

    async def opened(response: httpx2.Response) -> None:
        if response.request.method == "GET" and response.status_code == 200:
            get_stream.set()

    async def handler(message: Any) -> None:
        seen.append(message)
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    headers = {"Authorization": f"Bearer {token}", "X-Toolbus-Profile": profile}
    timeout = httpx2.Timeout(30.0, read=300.0)
    async with httpx2.AsyncClient(
        headers=headers, timeout=timeout, event_hooks={"response": [opened]}
    ) as http:
        transport = streamable_http_client(f"http://127.0.0.1:{gw.port}/mcp", http_client=http)
        async with Client(transport, cache=None, mode="legacy", message_handler=handler) as c:
            yield c


def _drop_units_from_readonly(profiles: Path) -> None:
    stat = profiles.stat()
    profiles.write_text(
        profiles.read_text().replace(
            "  readonly:\n    capabilities: [notes.read, time, units]",
            "  readonly:\n    capabilities: [notes.read, time]",
        )
    )
    os.utime(profiles, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


async def test_m4_list_changed_reaches_handshake_clients(tmp_path: Path) -> None:
    """SPEC M4, C3: a client that negotiated a version before 2026-07-28 (initialize
    handshake) is told ``tools.listChanged`` in the ``initialize`` answer and gets
    ``notifications/tools/list_changed`` on its standalone stream when the catalog
    changes; listing again shows the change. Ending the client (``DELETE``) forgets it."""
    catalog, profiles = reloading_catalog(tmp_path)
    seen: list[Any] = []
    get_stream, changed = asyncio.Event(), asyncio.Event()
    async with (
        asyncio.timeout(WAIT),
        running(settings_for(tmp_path, catalog=catalog)) as gateway,
    ):
        async with handshake_client(
            gateway, "alice-token", "readonly", seen, get_stream, changed
        ) as c:
            assert c.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
            assert c.server_capabilities.tools is not None
            assert c.server_capabilities.tools.list_changed is True
            before = {t.name for t in (await c.list_tools()).tools}
            await get_stream.wait()  # the notification rides the standalone GET stream
            assert gateway.mcp_endpoint.changes.handshake_clients() == 1
            _drop_units_from_readonly(profiles)
            await changed.wait()
            after = {t.name for t in (await c.list_tools()).tools}
        assert gateway.mcp_endpoint.changes.handshake_clients() == 0
    assert [type(n) for n in seen] == [types.ToolListChangedNotification]
    assert before - after == {"convert_units"}


async def test_m4_internal_sessions_do_not_count_against_max_sessions_per_user(
    tmp_path: Path,
) -> None:
    """SPEC M4, E2: ``/mcp`` runs each (user, profile) on an internal session; it is
    not one of the user's sockets, so with ``max_sessions_per_user: 1`` the user's
    WebSocket still gets its session, and a second socket is still refused."""
    settings = settings_for(tmp_path, limits={"max_sessions_per_user": 1})
    headers = {"Authorization": "Bearer bob-token"}
    async with (
        asyncio.timeout(WAIT),
        running(settings) as gateway,
        httpx2.AsyncClient(headers=headers) as http,
        Client(
            streamable_http_client(f"http://127.0.0.1:{gateway.port}/mcp", http_client=http),
            cache=None,
        ) as c,
    ):
        called = await c.call_tool("convert_units", CONVERT)
        assert called.is_error is False
        [internal] = [s for s in gateway.sessions.sessions.values() if s.user == "bob"]
        assert internal.internal
        assert internal.id.startswith("m_")
        assert gateway.sessions.count_for("bob", None) == 0
        async with peer(gateway, token="bob-token") as first:
            assert first.welcome["type"] == "welcome"
            assert gateway.sessions.count_for("bob", None) == 1
            async with peer(gateway, hello=False) as second:
                await second.send({"type": "hello", "id": "h2", "token": "bob-token"})
                refused = await second.recv()
        assert (refused["type"], refused["code"], refused["id"]) == (
            "error",
            "too_many_sessions",
            "h2",
        )


async def test_m4_internal_sessions_stay_uncounted_after_a_restart(tmp_path: Path) -> None:
    """SPEC M4, E2, D3: an internal session stored before a restart comes back parked
    (its id says it is internal) and still does not count against the limit."""
    settings = settings_for(tmp_path, limits={"max_sessions_per_user": 1})
    headers = {"Authorization": "Bearer bob-token"}
    async with asyncio.timeout(WAIT):
        async with (
            running(settings) as gateway,
            httpx2.AsyncClient(headers=headers) as http,
            Client(
                streamable_http_client(f"http://127.0.0.1:{gateway.port}/mcp", http_client=http),
                cache=None,
            ) as c,
        ):
            assert (await c.call_tool("convert_units", CONVERT)).is_error is False
            [before] = [s.id for s in gateway.sessions.sessions.values()]
        async with running(settings) as gateway:
            assert before in gateway.sessions.sessions  # adopted, parked (SPEC D3)
            assert gateway.sessions.sessions[before].internal
            assert gateway.sessions.count_for("bob", None) == 0
            async with peer(gateway, token="bob-token") as p:
                assert p.welcome["resumed"] is False


async def _inspector(tmp: Path, gateway: Gateway, token: str, *args: str) -> tuple[int, str]:
    """Run ``mcp-inspector --cli`` against ``/mcp`` with ``Authorization: Bearer token``;
    its exit code and stdout. Its files (catalog, storage) go to ``tmp``, not ``~``."""
    assert INSPECTOR.is_file(), (
        f"{INSPECTOR} is missing: run scripts/ensure-mcp-inspector (scripts/check does)"
    )
    env = {**os.environ, "HOME": str(tmp), "MCP_CATALOG_PATH": str(tmp / "mcp.json")}
    process = await asyncio.create_subprocess_exec(
        str(INSPECTOR),
        "--cli",
        f"http://127.0.0.1:{gateway.port}/mcp",
        "--transport",
        "http",
        "--header",
        f"Authorization: Bearer {token}",
        *args,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_m4_inspector_cli_lists_and_calls(tmp_path: Path) -> None:
    """SPEC M4, S2: the MCP Inspector's CLI (another SDK: TypeScript) drives ``/mcp``
    headless: ``tools/list`` is bob's ``demo`` catalog, ``tools/call`` runs
    ``convert_units`` through the pipeline, and a refused credential lists nothing."""
    async with asyncio.timeout(4 * WAIT), running(settings_for(tmp_path)) as gateway:
        code, listed = await _inspector(tmp_path, gateway, "bob-token", "--method", "tools/list")
        assert code == 0, listed
        names = {tool["name"] for tool in json.loads(listed)["tools"]}
        assert {"convert_units", "notes_create", "notes_delete", "report"} <= names
        assert "show_map" not in names  # mode: client (SPEC I3)
        code, called = await _inspector(
            tmp_path,
            gateway,
            "bob-token",
            "--method",
            "tools/call",
            "--tool-name",
            "convert_units",
            "--tool-arg",
            "value=1",
            "from_unit=km",
            "to_unit=m",
        )
        assert code == 0, called
        result = json.loads(called)
        assert result["isError"] is False
        assert result["structuredContent"] == {
            "value": 1,
            "from_unit": "km",
            "to_unit": "m",
            "result": 1000,
            "dimension": "length",
        }
        code, refused = await _inspector(tmp_path, gateway, "nope", "--method", "tools/list")
    assert code != 0
    assert '"tools"' not in refused
