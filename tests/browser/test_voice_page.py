"""The worked voice example at /voice (SPEC V3) in a real headless Chromium, no network.

The page is driven as a user would (token, ephemeral key, Connect, the approval card's
buttons). The network boundary is OpenAI's SDP endpoint: the test intercepts that one
request and answers it from a second RTCPeerConnection in the same page
(tests/browser/fake_openai.js), so the page's real WebRTC connection and its "oai-events"
data channel open over loopback, and the test plays the model's events on it. Checked:
the page and its module load without errors; the ephemeral key goes only to OpenAI's
endpoint, in the Authorization header, and never to toolbus; the session gets the
instructions and the catalog's tools; a call, an approval card allowed in the page and
a report job spoken when done all flow through the bridge (SPEC V1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, Request, Route, WebSocket, expect

from catalog.exports import to_openai_realtime
from catalog.visibility import Scope, visible_tools
from gateway.server import Gateway
from tests.browser.realtime_events import (
    Call,
    calling_turn,
    check_sent,
    output,
    respond,
    session_update,
    spoken_turn,
    system_note,
    transcript_done,
)

pytestmark = pytest.mark.browser

FAKE_OPENAI = (Path(__file__).parent / "fake_openai.js").read_text(encoding="utf-8")
CALLS_URL = "https://api.openai.com/v1/realtime/calls"
KEY = "ek_test_not_a_real_secret"
DISPATCH = "I'm writing that report now; I'll tell you when it's ready."


async def test_voice_page_is_served_and_its_module_loads(gateway: Gateway, page: Page) -> None:
    """V3: /voice answers the page; it and its modules load without a console error."""
    response = await page.goto(f"http://127.0.0.1:{gateway.port}/voice")
    assert response is not None
    assert response.status == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    await expect(page.locator("body")).to_have_attribute("data-ready", "true")
    await expect(page.get_by_test_id("voice-state")).to_have_text("idle")
    exports = await page.evaluate("import('/static/voice.js').then(m => Object.keys(m).sort())")
    assert exports == ["INSTRUCTIONS", "REALTIME_CALLS_URL", "openRealtime"]
    bridge = await page.evaluate("import('/static/realtime.js').then(m => Object.keys(m).sort())")
    assert bridge == [
        "RealtimeBridge",
        "bridgeRealtime",
        "default",
        "jobText",
        "outputFor",
        "realtimeTools",
    ]


async def test_voice_page_end_to_end_up_to_openai(gateway: Gateway, page: Page) -> None:
    """V3, V1, S2: Connect sends the ephemeral key only to OpenAI's SDP endpoint; over the
    opened data channel the session gets instructions and tools; a call, an approval
    allowed on the page's card, and a report job told when done all reach the model."""
    await page.goto(f"http://127.0.0.1:{gateway.port}/voice")
    await expect(page.locator("body")).to_have_attribute("data-ready", "true")
    await page.evaluate(FAKE_OPENAI)
    sdp_posts: list[dict[str, Any]] = []

    async def answer(route: Route, request: Request) -> None:
        sdp_posts.append(
            {
                "method": request.method,
                "url": request.url,
                "authorization": await request.header_value("authorization"),
                "content_type": await request.header_value("content-type"),
                "offer": request.post_data or "",
            }
        )
        sdp = await page.evaluate("offer => fakeOpenAI.answer(offer)", request.post_data)
        await route.fulfill(status=201, content_type="application/sdp", body=sdp)

    await page.route(CALLS_URL, answer)
    toolbus_frames: list[str] = []
    other_requests: list[str] = []
    page.on("request", lambda r: other_requests.append(r.url + (r.post_data or "")))

    def on_socket(ws: WebSocket) -> None:
        ws.on("framesent", lambda payload: toolbus_frames.append(str(payload)))

    page.on("websocket", on_socket)

    await page.get_by_test_id("token-input").fill("alice-token")
    await page.get_by_test_id("profile-input").fill("voice")
    await page.get_by_test_id("ephemeral-input").fill(KEY)
    await page.get_by_test_id("mic-input").uncheck()
    await page.get_by_test_id("connect-button").click()
    await expect(page.get_by_test_id("voice-state")).to_have_text("live")
    await page.evaluate("fakeOpenAI.ready()")
    await expect(page.get_by_test_id("ephemeral-input")).to_have_value("")

    [post] = sdp_posts
    assert {k: v for k, v in post.items() if k != "offer"} == {
        "method": "POST",
        "url": CALLS_URL,
        "authorization": f"Bearer {KEY}",
        "content_type": "application/sdp",
    }
    assert post["offer"].startswith("v=0")

    # The bridge's session.update (tools) is sent first, on "open"; then the page's own.
    instructions = await page.evaluate("import('/static/voice.js').then(m => m.INSTRUCTIONS)")
    catalog = gateway.catalog.current
    scope = Scope({}, f"http://127.0.0.1:{gateway.port}")
    tools = to_openai_realtime(visible_tools(catalog, catalog.profile("voice"), scope))
    tools_update, own_update = await _take(page, 2)
    assert tools_update == session_update(tools, "toolbus_1")
    assert own_update == {
        "type": "session.update",
        "session": {"type": "realtime", "instructions": instructions},
    }

    # A sync call, then a delete that the user allows on the page's card.
    create = Call.of("call_note", "notes_create", {"title": "milk", "body": "buy milk"})
    await _play(page, calling_turn("resp_1", create))
    note_item, respond_1 = await _take(page, 2)
    note = json.loads(note_item["item"]["output"])
    assert note_item == output("call_note", note_item["item"]["output"], "toolbus_2")
    assert respond_1 == respond("toolbus_3")
    delete = Call.of("call_del", "notes_delete", {"note_id": note["note_id"]})
    await _play(page, calling_turn("resp_2", delete))
    card = page.get_by_test_id("approval-card")
    await expect(card).to_have_count(1)
    await expect(card).to_contain_text("Allow notes_delete?")
    await expect(card).to_contain_text(f'"note_id": {note["note_id"]}')
    await card.get_by_role("button", name="Allow").click()
    await expect(card).to_have_count(0)
    deleted = json.dumps({"deleted": note["note_id"]}, separators=(",", ":"))
    assert await _take(page, 2) == [output("call_del", deleted, "toolbus_4"), respond("toolbus_5")]
    log = page.get_by_test_id("voice-log")
    await expect(log).to_contain_text("notes_delete: allowed (user)")

    # A report: its dispatch message at once, then the job's end once it is done.
    report = Call.of("call_rep", "report", {"topic": "milk", "sections": 1})
    await _play(page, calling_turn("resp_3", report))
    assert await _take(page, 2) == [output("call_rep", DISPATCH, "toolbus_6"), respond("toolbus_7")]
    await _play(page, spoken_turn("resp_4", DISPATCH))  # the model answers response.create
    note_event, respond_2 = await _take(page, 2)
    text = note_event["item"]["content"][0]["text"]
    assert text.startswith("The background task report (job job_")
    assert "has finished: Report on milk with 1 section(s) is ready." in text
    assert note_event == system_note(text, "toolbus_8")
    assert respond_2 == respond("toolbus_9")
    await expect(log).to_contain_text("report: The background task report")
    await _play(page, [transcript_done("resp_5", "Your report on milk is ready.")])
    await expect(log).to_contain_text("agent: Your report on milk is ready.")

    # S2: the key never reached toolbus, neither on its socket nor over HTTP.
    assert toolbus_frames
    assert json.loads(toolbus_frames[0])["type"] == "hello"
    assert not [f for f in toolbus_frames if KEY in f]
    assert not [r for r in other_requests if KEY in r and not r.startswith(CALLS_URL)]

    await page.get_by_test_id("hangup-button").click()
    await expect(page.get_by_test_id("voice-state")).to_have_text("idle")


async def _play(page: Page, events: list[dict[str, Any]]) -> None:
    await page.evaluate("events => fakeOpenAI.play(events)", events)


async def _take(page: Page, count: int) -> list[dict[str, Any]]:
    """The next ``count`` events the page sent on the data channel, each checked against
    the Realtime client event types."""
    events: list[dict[str, Any]] = await page.evaluate("n => fakeOpenAI.take(n)", count)
    return check_sent(events)
