"""The Python client and credential lifetimes (SPEC K1, S6): the expiring callback,
``refresh_credentials``, and the typed close at expiry. Real server, JWT auth; every
wait is on a reply or a close, never a sleep."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import toolbus
from protocol import messages as m
from protocol.errors import ErrorCode
from tests.support import JWT_SECRET, WAIT, make_jwt, running, settings_for

KM = {"value": 1, "from_unit": "km", "to_unit": "m"}


def token(sub: str, exp: float, profiles: tuple[str, ...] = ("demo",)) -> str:
    """An HS256 JWT for ``sub`` granting ``profiles``, expiring at ``exp`` (Unix s)."""
    return make_jwt(sub, profiles, exp)


def settings(tmp: Path, **auth: Any) -> Any:
    # notes_delete needs approval; nobody answers, so it ends (declined) after 3.5 s.
    return settings_for(
        tmp, auth={"jwt_secret": JWT_SECRET, **auth}, calls={"approval_timeout": 3.5}
    )


def connect(url: str, credential: str, **options: Any) -> toolbus.Client:
    return toolbus.connect(url, token=credential, profile="demo", request_timeout=WAIT, **options)


async def test_s6_expiring_callback_refreshes_and_the_session_outlives_the_first_exp(
    tmp_path: Path,
) -> None:
    """SPEC S6, K1: on_auth_expiring returns a fresh JWT, the client sends auth.refresh,
    and the same socket serves calls after the first credential's exp."""
    warnings: list[m.AuthExpiring] = []

    def fresh(msg: m.AuthExpiring) -> str:
        warnings.append(msg)
        return token("ana", later)

    async with running(settings(tmp_path, expiry_warning=2.5)) as gw:
        first = int(time.time()) + 3  # the server is up: the clock starts now
        later = first + 300
        async with connect(gw.url, token("ana", first), on_auth_expiring=fresh) as bus:
            declined = await bus.invoke("notes_delete", {"note_id": 1}, timeout=WAIT)
            assert isinstance(declined, m.Result)
            assert declined.declined is True
            assert time.time() > first
            assert [w.expires_at for w in warnings] == [first]
            assert bus.auth_expiring is None
            out = await bus.invoke("convert_units", KM, timeout=WAIT)
            assert isinstance(out, m.Result)
            assert out.result["result"] == 1000.0
            assert (bus.connected, bus.reconnects) == (True, 0)
            session = gw.sessions.sessions[bus.session_id or ""]
            assert gw.authority._credentials[session.id].identity.expires_at == later


async def test_s6_refresh_credentials_refused_is_typed(tmp_path: Path) -> None:
    """SPEC S6, K1: refresh_credentials with another user's JWT raises RequestRefused
    ``principal_mismatch``; with a fresh one of the same user it returns the new exp."""
    exp = time.time() + 300
    async with running(settings(tmp_path)) as gw, connect(gw.url, token("ana", exp)) as bus:
        with pytest.raises(toolbus.RequestRefused) as refused:
            await bus.refresh_credentials(token("bea", exp))
        assert refused.value.code is ErrorCode.PRINCIPAL_MISMATCH
        assert await bus.refresh_credentials(token("ana", exp + 60)) == exp + 60


async def test_s6_unrefreshed_credential_ends_the_client_with_4004(tmp_path: Path) -> None:
    """SPEC S6, K1: without a refresh the server closes 4004 at exp; the client was
    warned (auth_expiring), fails its waiting call with SessionClosed and does not
    reconnect on the lapsed credential."""
    async with running(settings(tmp_path)) as gw:
        exp = int(time.time()) + 3
        async with connect(gw.url, token("ana", exp)) as bus:
            with pytest.raises(toolbus.SessionClosed) as ended:
                await bus.invoke("notes_delete", {"note_id": 1}, timeout=WAIT)
            assert (ended.value.close_code, ended.value.reason) == (4004, "credential expired")
            assert bus.auth_expiring is not None
            assert bus.auth_expiring.expires_at == exp
            assert bus.reconnects == 0
