"""Handshake and authentication over real sockets (SPEC S1, S2, case F15)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.server import Gateway
from tests.support import JWT_SECRET, MS, WAIT, Peer, closed, make_jwt, peer, running, settings_for


async def refused(gateway: Gateway, url: str | None = None, **kwargs: Any) -> InvalidStatus:
    """Attempt an upgrade that the server must refuse with an HTTP status."""
    with pytest.raises(InvalidStatus) as info:
        async with asyncio.timeout(WAIT), connect(url or gateway.url, **kwargs):
            pass
    return info.value


# -- S1: subprotocol, hello, welcome ------------------------------------------------------


async def test_subprotocol_negotiated_and_welcome_limits(tmp_path: Path) -> None:
    """SPEC S1: toolbus.v1 is negotiated; welcome carries the configured limits."""
    settings = settings_for(
        tmp_path,
        server={"max_message_bytes": 65536, "heartbeat_interval": 15.0, "heartbeat_timeout": 5.0},
        limits={
            "max_inflight_calls": 3,
            "invoke_rate": 7.0,
            "invoke_burst": 9,
            "max_pending_approvals": 4,
            "max_sessions_per_user": 5,
        },
        sessions={"resume_window": 30.0, "max_unacked_events": 500},
    )
    async with running(settings) as gw, peer(gw, id="h1") as p:
        assert p.ws.subprotocol == "toolbus.v1"
        welcome = p.welcome
        assert welcome["id"] == "h1"
        assert welcome["protocol"] == "toolbus.v1"
        assert welcome["resumed"] is False
        assert welcome["last_seq"] == 0
        assert welcome["user"] == "alice"
        assert welcome["profile"] == "demo"
        assert welcome["session_id"].startswith("s_")
        assert len(welcome["resume_token"]) >= 32
        assert welcome["limits"] == {
            "max_message_bytes": 65536,
            "heartbeat_interval": 15.0,
            "heartbeat_timeout": 5.0,
            "max_inflight_calls": 3,
            "invoke_rate": 7.0,
            "invoke_burst": 9,
            "max_pending_approvals": 4,
            "max_sessions_per_user": 5,
            "resume_window": 30.0,
            "max_unacked_events": 500,
            "max_context_bytes": 16384,
        }
        catalog = await p.recv()
        assert catalog["type"] == "catalog"
        assert catalog["seq"] == 1
        assert catalog["reason"] == "initial"


async def test_no_subprotocol_refused_400_with_reason(gateway: Gateway) -> None:
    """SPEC S1: a client offering no subprotocol is refused at the upgrade (HTTP 400)."""
    error = await refused(gateway)
    assert error.response.status_code == 400
    assert b"toolbus.v1" in error.response.body
    assert not gateway.sessions.sessions


async def test_unsupported_subprotocol_refused_400_naming_versions(gateway: Gateway) -> None:
    """SPEC S1: offering only toolbus.v9 is refused (HTTP 400) naming offered and supported."""
    error = await refused(gateway, subprotocols=["toolbus.v9"])  # type: ignore[list-item]
    assert error.response.status_code == 400
    body = error.response.body.decode()
    assert "toolbus.v9" in body
    assert "toolbus.v1" in body


async def test_hello_timeout_closes_1008(tmp_path: Path) -> None:
    """SPEC S1: no hello within hello_timeout -> error hello_timeout, close 1008."""
    settings = settings_for(tmp_path, server={"hello_timeout": 200 * MS})
    async with running(settings) as gw, peer(gw, hello=False) as p:
        error = await p.recv()
        assert error["type"] == "error"
        assert error["code"] == "hello_timeout"
        assert (await closed(p)).rcvd.code == 1008
        assert not gw.sessions.sessions


async def test_first_message_not_hello_closes_1008(gateway: Gateway) -> None:
    """SPEC S1: a first message other than hello -> error hello_required, close 1008."""
    async with peer(gateway, hello=False) as p:
        await p.send({"type": "catalog.get", "id": "r1"})
        error = await p.recv()
        assert error == {
            "type": "error",
            "id": "r1",
            "code": "hello_required",
            "message": error["message"],
        }
        assert (await closed(p)).rcvd.code == 1008


async def test_binary_first_frame_is_hello_required(gateway: Gateway) -> None:
    """SPEC S1/E1: a binary frame before hello is hello_required and a 1008 close."""
    async with peer(gateway, hello=False) as p:
        await p.ws.send(b'{"type":"hello"}')
        error = await p.recv()
        assert error["type"] == "error"
        assert error["code"] == "hello_required"
        assert (await closed(p)).rcvd.code == 1008


async def test_second_hello_is_unexpected_message(gateway: Gateway) -> None:
    """SPEC S1: a second hello is unexpected_message; the connection stays usable."""
    async with peer(gateway) as p:
        await p.expect("catalog")
        await p.send({"type": "hello", "id": "h2", "token": "alice-token"})
        error = await p.expect("error")
        assert error["code"] == "unexpected_message"
        assert error["id"] == "h2"
        await p.send({"type": "grants.list", "id": "g1"})
        assert await p.expect("grants") == {"type": "grants", "id": "g1", "tools": []}


# -- S2: authentication --------------------------------------------------------------------


async def test_bad_token_auth_failed_4003(gateway: Gateway) -> None:
    """SPEC S2: unknown credentials -> error auth_failed, close 4003, no session."""
    async with peer(gateway, hello=False) as p:
        await p.send({"type": "hello", "id": "h1", "token": "not-a-token", "profile": "demo"})
        error = await p.recv()
        assert error["type"] == "error"
        assert error["code"] == "auth_failed"
        assert error["id"] == "h1"
        assert (await closed(p)).rcvd.code == 4003
    assert not gateway.sessions.sessions


async def test_missing_token_auth_failed_4003(gateway: Gateway) -> None:
    """SPEC S2: no credentials at all -> auth_failed, close 4003."""
    async with peer(gateway, hello=False) as p:
        await p.send({"type": "hello", "profile": "demo"})
        assert (await p.recv())["code"] == "auth_failed"
        assert (await closed(p)).rcvd.code == 4003


async def test_profile_not_granted_profile_denied_4003(gateway: Gateway) -> None:
    """SPEC S2: bob may not take profile readonly -> profile_denied, close 4003."""
    async with peer(gateway, hello=False) as p:
        await p.send({"type": "hello", "token": "bob-token", "profile": "readonly"})
        error = await p.recv()
        assert error["type"] == "error"
        assert error["code"] == "profile_denied"
        assert (await closed(p)).rcvd.code == 4003
    assert not gateway.sessions.sessions


async def test_single_granted_profile_is_implied(gateway: Gateway) -> None:
    """SPEC S2: a hello without profile gets the only profile the credentials grant."""
    async with peer(gateway, token="bob-token", profile=None) as p:
        assert p.welcome["user"] == "bob"
        assert p.welcome["profile"] == "demo"


async def test_bearer_header_authenticates_without_hello_token(gateway: Gateway) -> None:
    """SPEC S2: an Authorization: Bearer header stands in for hello.token."""
    headers = {"Authorization": "Bearer bob-token"}
    async with connect(gateway.url, subprotocols=["toolbus.v1"], additional_headers=headers) as ws:  # type: ignore[list-item]
        p = Peer(ws)
        await p.send({"type": "hello", "profile": "demo"})
        welcome = await p.recv()
        assert welcome["type"] == "welcome"
        assert welcome["user"] == "bob"


@pytest.mark.parametrize(
    "query",
    [
        "?token=alice-token",
        "?access_token=x",
        "?resume_token=x&a=1",
        "?API_KEY=x",
        ";token=alice-token",
        "x;password=y",
    ],
)
async def test_credentials_in_url_query_refused_400(gateway: Gateway, query: str) -> None:
    """SPEC S2: credentials in the URL query or path parameters are refused at the upgrade
    (HTTP 400)."""
    error = await refused(gateway, gateway.url + query, subprotocols=["toolbus.v1"])
    assert error.response.status_code == 400
    assert b"URL" in error.response.body
    assert not gateway.sessions.sessions


def _jwt(sub: str, profiles: list[str], exp_in: float) -> str:
    return make_jwt(sub, profiles, int(time.time() + exp_in))


async def test_jwt_hs256_accepted_and_expired_refused(tmp_path: Path) -> None:
    """SPEC S2: an HS256 JWT names user and profiles; an expired one is auth_failed 4003."""
    settings = settings_for(tmp_path, auth={"jwt_secret": JWT_SECRET})
    async with running(settings) as gw:
        async with peer(gw, token=_jwt("carol", ["voice"], 300), profile="voice") as p:
            assert p.welcome["user"] == "carol"
            assert p.welcome["profile"] == "voice"
        async with peer(gw, hello=False) as p:
            await p.send(
                {"type": "hello", "token": _jwt("carol", ["voice"], -300), "profile": "voice"}
            )
            assert (await p.recv())["code"] == "auth_failed"
            assert (await closed(p)).rcvd.code == 4003
        async with peer(gw, hello=False) as p:
            await p.send(
                {"type": "hello", "token": _jwt("carol", ["voice"], 300), "profile": "demo"}
            )
            assert (await p.recv())["code"] == "profile_denied"
            assert (await closed(p)).rcvd.code == 4003
        # The token file still works alongside JWT.
        async with peer(gw) as p:
            assert p.welcome["user"] == "alice"


async def test_credentials_never_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SPEC S2: neither a refused nor an accepted credential appears in any log record."""
    secret_bad = "wrong-secret-zq9x7"
    secret_jwt = _jwt("carol", ["voice"], 300)
    caplog.set_level(logging.DEBUG)
    settings = settings_for(tmp_path, auth={"jwt_secret": JWT_SECRET})
    async with running(settings) as gw:
        async with peer(gw, hello=False) as p:
            await p.send({"type": "hello", "token": secret_bad, "profile": "demo"})
            await closed(p)
        async with peer(gw, token=secret_jwt, profile="voice") as p:
            await p.expect("catalog")
        async with peer(gw) as p:
            await p.expect("catalog")
            resume_token = p.welcome["resume_token"]
        headers = {"Authorization": "Bearer bob-token"}
        async with connect(gw.url, subprotocols=["toolbus.v1"], additional_headers=headers) as ws:  # type: ignore[list-item]
            b = Peer(ws)
            await b.send({"type": "hello", "profile": "demo"})
            await b.expect("catalog")
    server_records = [r for r in caplog.records if not r.name.startswith("websockets.client")]
    assert server_records
    for record in server_records:  # the test's own client may log what it sends
        text = record.getMessage()
        for secret in (secret_bad, secret_jwt, "alice-token", "bob-token", resume_token):
            assert secret not in text, f"{record.name} logged a credential: {text[:200]}"


# -- F15: Origin allowlist -------------------------------------------------------------------


async def test_case_f15_foreign_origin_refused_403(tmp_path: Path) -> None:
    """F15 / SPEC S2: Origin https://evil.example is refused with HTTP 403; no session made."""
    settings = settings_for(tmp_path, server={"origins": ["https://demo.example"]})
    async with running(settings) as gw:
        headers = {"Origin": "https://evil.example"}
        error = await refused(gw, subprotocols=["toolbus.v1"], additional_headers=headers)
        assert error.response.status_code == 403
        assert not gw.sessions.sessions
        assert gw.metrics.connections._value.get() == 0
        async with peer(gw, origin="https://demo.example") as p:
            assert p.welcome["resumed"] is False
        async with peer(gw) as p:  # no Origin header: not a browser, allowed
            assert p.welcome["resumed"] is False


async def test_case_f15_default_allowlist_is_own_origin(gateway: Gateway) -> None:
    """F15 / SPEC S2: with no configured origins only the server's own origin passes."""
    error = await refused(
        gateway, subprotocols=["toolbus.v1"], additional_headers={"Origin": "https://evil.example"}
    )
    assert error.response.status_code == 403
    async with peer(gateway, origin=f"http://127.0.0.1:{gateway.port}") as p:
        assert p.welcome["user"] == "alice"
    async with peer(gateway, origin=f"http://localhost:{gateway.port}") as p:
        assert p.welcome["user"] == "alice"
