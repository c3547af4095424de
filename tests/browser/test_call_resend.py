"""The browser client after a failed resume (SPEC I15, K2; case F16 in a browser)."""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import Page

from tests.gateway import ledger_tools as lt
from tests.support import running

RESEND_SCRIPT = (Path(__file__).parent / "resend_check.js").read_text()


async def test_module_resends_inflight_call_after_resumed_false(tmp_path: Path, page: Page) -> None:
    """SPEC I15: the socket drops while `charge` runs and the session expires; after
    `resumed: false` the module re-sends the call with the same call_id (instead of
    failing it) and gets the first run's result; the charge ran once."""
    lt.reset()
    settings = lt.ledger_settings(tmp_path, sessions={"resume_window": 0.2})
    async with running(settings) as gw:
        await page.goto(f"http://127.0.0.1:{gw.port}/")
        out = await page.evaluate(RESEND_SCRIPT, {"url": gw.url})
    welcomes = out["seen"]["welcomes"]
    assert [w["resumed"] for w in welcomes] == [False, False]
    assert len(out["seen"]["resyncs"]) == 1
    reply = out["reply"]
    assert (reply["type"], reply["call_id"], reply["result"]) == (
        "result",
        "pay-b",
        {"charged": 100},
    )
    assert lt.runs(settings.data_dir) == ["pay-b 100"]
