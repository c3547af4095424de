"""Attacks on the OpenAI Realtime bridge (gateway/static/realtime.js, SPEC V1) found by
the h-mcp helper, in headless Chromium with the scripted Realtime peer of
tests/browser/realtime_harness.js and the real server."""

from __future__ import annotations

import asyncio

import pytest
from playwright.async_api import Page

from gateway.demo import handlers
from gateway.server import Gateway
from tests.browser.realtime_events import Call, calling_turn, output, respond, spoken_turn
from tests.browser.test_realtime_bridge import DISPATCH, _frames, _play, _sent, _start
from tests.support import WAIT

pytestmark = pytest.mark.browser


async def test_h_v1_a_job_still_running_when_the_session_is_lost_is_told_when_it_ends(
    gateway: Gateway, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC V1 ("its ``job.done`` later becomes a new conversation item and response so
    the model tells the user the result"), J4, D3, I15.

    The model calls the async ``report``; the bridge says the dispatch message. The
    toolbus socket drops while the job still runs, and the resume is refused
    (``resumed: false``). The job's events go to the session that created it (J4), now
    lost, so its ``job.done`` never reaches the new session. ``_resyncJobs`` asks
    ``job.list`` once, finds the job ``running`` and tells nothing; nothing asks again
    (the Python client's ``JobHandle.result`` polls ``job.get`` for exactly this case).
    The job ends a moment later and the model is never told.

    Expected: once the job ends, one system message about it and one
    ``response.create``."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", 1.5)
    await _start(page, gateway)
    await _sent(page, 1)
    report = Call.of("call_rep", "report", {"topic": "loss", "sections": 1})
    await _play(page, calling_turn("resp_1", report))
    await _frames(page, 1)
    assert await _sent(page, 2) == [output("call_rep", DISPATCH, "evt_2"), respond("evt_3")]
    await _play(page, spoken_turn("resp_2", DISPATCH))
    await page.evaluate(
        """() => {
          const closed = rt.closed();
          rt.client.resumeToken = "not-the-resume-token";
          rt.client.simulateDrop();
          return closed;
        }"""
    )
    welcome = await page.evaluate("rt.toolbus('welcome')")
    assert welcome["resumed"] is False
    await page.evaluate("rt.toolbus('resync')")
    hello, listing = await _frames(page, 2)
    assert (hello["type"], listing["type"]) == ("hello", "job.list")

    def done() -> bool:
        rows = gateway.store.jobs("alice", None, None, 10)
        return bool(rows) and rows[0].state == "done"

    async with asyncio.timeout(WAIT):
        while not done():  # noqa: ASYNC110 - the job runs in the gateway: poll its row
            await asyncio.sleep(0.05)
    async with asyncio.timeout(WAIT):  # the bridge follows the job with job.get (backoff)
        while len(told := await page.evaluate("rt.unsent()")) < 2:  # noqa: ASYNC110 - a page
            await asyncio.sleep(0.05)
    kinds = [(e["type"], e.get("item", {}).get("type")) for e in told]
    assert kinds == [("conversation.item.create", "message"), ("response.create", None)], told
