"""The browser client module and credential lifetimes in a real headless Chromium (SPEC
K2, S6): ``auth.expiring`` is an event and ``client.authExpiring``,
``refreshCredentials`` keeps the socket past the first expiry (or rejects with the
wire code), and an unrefreshed credential ends the client with close 4004."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.async_api import Page

from tests.support import JWT_SECRET, make_jwt, running, settings_for

pytestmark = pytest.mark.browser

SCRIPT = (Path(__file__).parent / "auth_check.js").read_text()


def token(sub: str, exp: int) -> str:
    return make_jwt(sub, ["demo"], exp)


async def test_module_warns_refreshes_and_closes_4004(tmp_path: Path, page: Page) -> None:
    """S6: warned before exp; refresh refused for another user (principal_mismatch) and
    accepted for the same one; the session serves calls after the first exp; a client
    that does not refresh is closed 4004 and does not reconnect."""
    settings = settings_for(
        tmp_path,
        auth={"jwt_secret": JWT_SECRET, "expiry_warning": 2.5},
        calls={"approval_timeout": 3.5},
    )
    async with running(settings) as gw:
        await page.goto(f"http://127.0.0.1:{gw.port}/")
        first = int(time.time()) + 3  # the page is up: the clock starts now
        out = await page.evaluate(
            SCRIPT,
            {
                "url": gw.url,
                "first": token("ana", first),
                "fresh": token("ana", first + 300),
                "stranger": token("bea", first + 300),
                "short": token("ana", first + 5),
            },
        )
    assert out["warning"]["type"] == "auth.expiring"
    assert out["warning"]["expires_at"] == first
    assert out["refusedCode"] == "principal_mismatch"
    assert out["refreshedTo"] == first + 300
    assert out["afterRefresh"] is None
    assert out["declined"]["declined"] is True
    assert out["nowAfterTimeout"] > first
    assert out["reply"]["result"]["result"] == 1000
    assert out["stateAfter"] == "open"
    assert out["closesBefore"] == []
    assert out["lapse"]["code"] == 4004
    assert out["lapse"]["reason"] == "credential expired"
    assert out["lapse"]["willReconnect"] is False
    assert out["lapsedState"] == "closed"
    assert out["lapsedWarning"]["expires_at"] == first + 5
