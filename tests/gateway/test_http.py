"""HTTP side routes on the WebSocket port (SPEC O2)."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from gateway.config import ServerConfig
from gateway.http_front import Origins
from gateway.server import Gateway
from tests.support import WAIT, peer, signal


async def http_get(gw: Gateway, path: str) -> tuple[int, dict[str, str], bytes]:
    """One plain HTTP/1.1 GET over a raw TCP connection: (status, headers, body)."""
    async with asyncio.timeout(WAIT):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n\r\n".encode())
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            headers = {
                k.lower(): v.strip()
                for k, _, v in (line.partition(":") for line in lines[1:] if line)
            }
            body = await reader.readexactly(int(headers["content-length"]))
        finally:
            writer.close()
    return status, headers, body


async def test_healthz_and_readyz(gateway: Gateway) -> None:
    """SPEC O2: /healthz and /readyz answer 200 on a serving server."""
    status, _, body = await http_get(gateway, "/healthz")
    assert (status, body) == (200, b"ok\n")
    status, headers, body = await http_get(gateway, "/readyz")
    assert (status, body) == (200, b"ready\n")
    assert headers["content-type"].startswith("text/plain")


async def test_readyz_503_when_not_ready(gateway: Gateway) -> None:
    """SPEC O2/S4: /readyz is 503 once the server stops being ready (drain clears the flag
    first; the listener closes right after, so the flag is flipped here to observe it)."""
    gateway.ready = False
    try:
        status, _, body = await http_get(gateway, "/readyz")
        assert (status, body) == (503, b"draining\n")
        assert (await http_get(gateway, "/healthz"))[0] == 200
    finally:
        gateway.ready = True


def _sample(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name}{labels} missing from /metrics"
    return float(match.group(1))


async def test_metrics_prometheus_text(gateway: Gateway) -> None:
    """SPEC O2: /metrics has sessions, invocations by outcome, latency, replayed events."""
    async with peer(gateway) as p:
        await p.invoke("c1", "convert_units", {"value": 1, "from_unit": "m", "to_unit": "cm"})
        await p.terminal("c1")
        await p.invoke("c2", "no_such_tool", {})
        await p.terminal("c2")
        status, headers, body = await http_get(gateway, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    assert "# TYPE toolbus_invocations_total counter" in text
    assert _sample(text, "toolbus_invocations_total", '{outcome="ok"}') == 1.0
    assert _sample(text, "toolbus_invocations_total", '{outcome="unknown_tool"}') == 1.0
    assert _sample(text, "toolbus_sessions", '{state="live"}') == 1.0
    assert _sample(text, "toolbus_sessions", '{state="parked"}') == 0.0
    assert _sample(text, "toolbus_invoke_seconds_count", '{mode="sync"}') == 1.0
    assert "toolbus_replayed_events_total" in text
    assert "toolbus_pending_approvals" in text


async def test_unknown_path_404(gateway: Gateway) -> None:
    """SPEC O2: an unknown plain-HTTP path is 404, not an upgrade error."""
    status, _, body = await http_get(gateway, "/nope")
    assert (status, body) == (404, b"not found\n")


async def test_http_methods(gateway: Gateway) -> None:
    """SPEC O2 (RFC 9110): HEAD answers headers without a body; other methods get 405."""
    for method, status, body in (
        (b"HEAD", b"200", b""),
        (b"POST", b"405", b"method not allowed\n"),
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(method + b" /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        async with asyncio.timeout(WAIT):
            head = await reader.readuntil(b"\r\n\r\n")
            rest = await reader.read(len(body)) if body else b""
        writer.close()
        assert head.split(b" ")[1] == status
        assert rest == body
        if method == b"POST":
            assert b"Allow: GET, HEAD" in head


async def test_o2_websockets_logs_no_line_per_connection(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """SPEC O2: a probe of /healthz or /metrics (a load balancer's, every two seconds)
    logs nothing, and a session only its own lines (``gateway.connection``, with its
    id); websockets' ``connection open``, ``connection closed`` and ``HTTP response
    sent (200 OK)`` lines are dropped, a refused request's line is kept."""
    caplog.set_level(logging.INFO)
    parked = signal(gateway, "park")
    assert (await http_get(gateway, "/healthz"))[0] == 200
    assert (await http_get(gateway, "/metrics"))[0] == 200
    async with peer(gateway) as p:
        session = p.welcome["session_id"]
    async with asyncio.timeout(WAIT):
        await parked.wait()  # its line follows in the same step
    assert (await http_get(gateway, "/nope"))[0] == 404
    lines = [(r.name, r.getMessage()) for r in caplog.records]
    assert [m for name, m in lines if name == "websockets.server"] == [
        "HTTP response sent (404 Not Found)"
    ]
    assert [m for name, m in lines if name == "gateway.connection"] == [
        f"session {session} (resumed=False, user=alice)",
        "socket closed; session parked",
    ]


async def _upgrade(gw: Gateway, extra: str) -> bytes:
    """The status line answering a WebSocket upgrade with ``extra`` header lines."""
    async with asyncio.timeout(WAIT):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        try:
            writer.write(
                f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: toolbus.v1\r\n"
                f"{extra}\r\n".encode()
            )
            return (await reader.readuntil(b"\r\n")).strip()
        finally:
            writer.close()


@pytest.mark.parametrize(
    ("lines", "status"),
    [
        ("Upgrade: websocket\r\nUpgrade: websocket\r\nSec-WebSocket-Key: {key}\r\n", b"426"),
        ("Upgrade: h2c\r\nUpgrade: websocket\r\nSec-WebSocket-Key: {key}\r\n", b"426"),
        ("Upgrade: websocket\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Key: {key}\r\n", b"400"),
        (
            "Upgrade: websocket\r\nSec-WebSocket-Key: {key}\r\n"
            "Origin: {origin}\r\nOrigin: https://evil.example\r\n",
            b"400",
        ),
        ("Upgrade: websocket\r\nSec-WebSocket-Key: {key}\r\nOrigin: {origin}\r\n", b"101"),
    ],
)
async def test_s2_e1_repeated_upgrade_headers_are_refused_typed(
    gateway: Gateway, caplog: pytest.LogCaptureFixture, lines: str, status: bytes
) -> None:
    """SPEC S1, S2, E1: an upgrade repeating a single-valued header (``Upgrade``,
    ``Sec-WebSocket-Key``, ``Origin``) is answered 400 (426 for ``Upgrade``, RFC 9110
    section 15.5.22, as websockets answers one it cannot take), never 500."""
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    origin = f"http://127.0.0.1:{gateway.port}"
    answer = await _upgrade(gateway, lines.format(key=key, origin=origin))
    assert answer.split(b" ")[1] == status, answer
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_s2_banner_names_the_origins_and_when_a_page_needs_server_origins() -> None:
    """SPEC S2, O1: the allowlist the banner prints; a named non-loopback host warns about
    pages loaded under another name, a loopback host or a set server.origins does not."""
    named = Origins(ServerConfig(host="10.1.2.3"))
    named.port = 8765
    assert named.notice() == [
        "browser origins allowed: http://10.1.2.3:8765, http://127.0.0.1:8765, "
        "http://localhost:8765",
        "serving on 10.1.2.3: a page loaded under a name not 10.1.2.3 gets its WebSocket "
        "refused 403 (origin not allowed) until server.origins lists the page's origin, "
        "e.g. TOOLBUS_SERVER__ORIGINS='[\"http://HOST:8765\"]' (HOST: the address in the "
        "browser's address bar)",
    ]
    listed = Origins(ServerConfig(host="10.1.2.3", origins=["https://app.example"]))
    assert listed.notice() == ["browser origins allowed: https://app.example"]
    loopback = Origins(ServerConfig(host="localhost"))
    loopback.port = 1
    assert loopback.notice() == ["browser origins allowed: http://127.0.0.1:1, http://localhost:1"]
