"""The OpenAI Realtime bridge (gateway/static/realtime.js, SPEC V1) in a real headless Chromium.

No network: the Realtime model is a scripted peer in the page (a data-channel-like
object, tests/browser/realtime_harness.js) that plays the server event sequences of the
API reference (tests/browser/realtime_events.py); toolbus is the real server. Each test
asserts every event the bridge sends to the model, in order and exactly, validated
against openai-python's Realtime client event types, and every frame it sends to toolbus.
Covers V1 with C3/C4 (catalog as session tools), I12/I15 (one run per model call id),
I13 (catalog version), A2-A5 (approvals, declined text), I9/J4 (dispatch message, job end
told once after the in-flight response), I3 (client tools), I1/I4 (errors as output
text), D3 (toolbus socket drop and resume mid-call; a lost session resynced with job.list).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page
from websockets.asyncio.server import ServerConnection, serve

from catalog.exports import to_openai_realtime
from catalog.visibility import Scope, visible_tools
from gateway.demo import handlers
from gateway.server import Gateway
from tests.browser.realtime_events import (
    Call,
    calling_turn,
    check_sent,
    output,
    respond,
    session_update,
    speaking_end,
    speaking_start,
    spoken_turn,
    system_note,
)
from tests.support import WAIT

pytestmark = pytest.mark.browser

HARNESS = (Path(__file__).parent / "realtime_harness.js").read_text(encoding="utf-8")
DISPATCH = "I'm writing that report now; I'll tell you when it's ready."
DECLINED = "The user declined this tool call. Do not retry it; ask the user how to proceed."
MILE = '{"value":1,"from_unit":"mi","to_unit":"km","result":1.609344,"dimension":"length"}'


def _compact(value: Any) -> str:
    """JSON as the page's JSON.stringify writes it (no spaces, keys in order)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def _start(
    page: Page,
    gateway: Gateway,
    *,
    options: dict[str, Any] | None = None,
    channel: str = "open",
    profile: str = "demo",
    realtime_url: str | None = None,
) -> dict[str, Any]:
    await page.goto(f"http://127.0.0.1:{gateway.port}/")
    started: dict[str, Any] = await page.evaluate(
        HARNESS,
        {
            "url": f"ws://127.0.0.1:{gateway.port}/",
            "profile": profile,
            "bridgeOptions": options or {},
            "channelState": channel,
            "realtimeUrl": realtime_url,
        },
    )
    return started


def _export(gateway: Gateway, context: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The Python `openai-realtime` export of alice's demo catalog (SPEC C4)."""
    catalog = gateway.catalog.current
    origin = f"http://127.0.0.1:{gateway.port}"
    return to_openai_realtime(
        visible_tools(catalog, catalog.profile("demo"), Scope(context or {}, origin))
    )


async def _play(page: Page, events: list[dict[str, Any]]) -> None:
    await page.evaluate("events => rt.play(events)", events)


async def _sent(page: Page, count: int, *, beta: bool = False) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = await page.evaluate("n => rt.sent(n)", count)
    return check_sent(events, beta=beta)


async def _frames(page: Page, count: int) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = await page.evaluate("n => rt.frames(n)", count)
    return frames


async def _quiet(page: Page) -> None:
    """Nothing more went to the model or to toolbus (both are sent synchronously on the
    events that cause them, so this holds right after the cause was played)."""
    assert await page.evaluate("rt.unsent()") == []
    assert await page.evaluate("rt.unframed()") == []


def _invoke(
    frame: dict[str, Any], call_id: str, tool: str, params: dict[str, Any], version: str
) -> None:
    assert frame == {
        "type": "invoke",
        "id": frame["id"],
        "call_id": call_id,
        "tool": tool,
        "params": params,
        "catalog_version": version,
    }


async def _note(page: Page) -> int:
    """A note created by the page's toolbus client directly (not through the model)."""
    note_id: int = await page.evaluate(
        "rt.client.invoke('notes_create', {title: 'old', body: 'delete me'})"
        ".then(r => r.result.note_id)"
    )
    [frame] = await _frames(page, 1)
    assert frame["tool"] == "notes_create"
    return note_id


async def _delete_called(
    page: Page, gateway: Gateway
) -> tuple[dict[str, Any], int, dict[str, Any]]:
    """Start the bridge, make a note, and play a model turn calling ``notes_delete`` on
    it (call id ``call_del``): the bridge's start info, the note id and the one frame
    the call sent to toolbus."""
    started = await _start(page, gateway)
    await _sent(page, 1)
    note_id = await _note(page)
    await _play(
        page, calling_turn("resp_1", Call.of("call_del", "notes_delete", {"note_id": note_id}))
    )
    [frame] = await _frames(page, 1)
    return started, note_id, frame


async def test_sync_call_outcome_then_response_and_replays_run_nothing(
    gateway: Gateway, page: Page
) -> None:
    """V1, C4, I15: tools as session.update; a call -> invoke -> output + response.create;
    a replayed call event or response.done runs nothing and sends nothing."""
    started = await _start(page, gateway)
    assert await _sent(page, 1) == [session_update(_export(gateway), "evt_1")]
    assert await page.evaluate("rt.realtimeTools(rt.client.catalog.tools)") == _export(gateway)

    call = Call.of("call_mile", "convert_units", {"value": 1, "from_unit": "mi", "to_unit": "km"})
    turn = calling_turn("resp_1", call)
    await _play(page, turn)
    [frame] = await _frames(page, 1)
    _invoke(frame, "call_mile", "convert_units", json.loads(call.arguments), started["version"])
    assert await _sent(page, 2) == [output("call_mile", MILE, "evt_2"), respond("evt_3")]

    await _play(page, spoken_turn("resp_2", "One mile is about 1.6 kilometres."))
    await _play(page, turn[-2:])  # response.output_item.done and response.done again
    await _play(page, turn)  # the whole response again
    await _quiet(page)


async def test_parallel_calls_get_one_response(gateway: Gateway, page: Page) -> None:
    """V1: two calls of one response -> two outputs, then exactly one response.create."""
    started = await _start(page, gateway)
    await _sent(page, 1)
    mile = Call.of("call_a", "convert_units", {"value": 1, "from_unit": "mi", "to_unit": "km"})
    boil = Call.of("call_b", "convert_units", {"value": 100, "from_unit": "C", "to_unit": "F"})
    await _play(page, calling_turn("resp_1", mile, boil))
    first, second = await _frames(page, 2)
    _invoke(first, "call_a", "convert_units", json.loads(mile.arguments), started["version"])
    _invoke(second, "call_b", "convert_units", json.loads(boil.arguments), started["version"])

    events = await _sent(page, 3)
    items = sorted(events[:2], key=lambda e: e["item"]["call_id"])
    ids = sorted(e["event_id"] for e in events[:2])
    assert ids == ["evt_2", "evt_3"]
    assert [{**e, "event_id": ""} for e in items] == [
        output("call_a", MILE, ""),
        output(
            "call_b",
            '{"value":100,"from_unit":"C","to_unit":"F","result":212,"dimension":"temperature"}',
            "",
        ),
    ]
    assert events[2] == respond("evt_4")
    await _quiet(page)


async def test_approval_allowed(gateway: Gateway, page: Page) -> None:
    """V1, A2, A3: an approval surfaces through the callback; nothing goes to the model until
    the user allows; then the result and response.create."""
    started, note_id, frame = await _delete_called(page, gateway)
    _invoke(frame, "call_del", "notes_delete", {"note_id": note_id}, started["version"])
    card = await page.evaluate("rt.card()")
    assert card == {
        "callId": "call_del",
        "tool": "notes_delete",
        "params": {"note_id": note_id},
        "approvalId": card["approvalId"],
        "expiresAt": card["expiresAt"],
    }
    assert card["approvalId"].startswith("ap_")
    await _quiet(page)

    await page.evaluate("rt.lastCard.allow()")
    [confirm] = await _frames(page, 1)
    assert confirm == {
        "type": "tool.confirm",
        "id": confirm["id"],
        "approval_id": card["approvalId"],
        "decision": "allow",
    }
    assert await _sent(page, 2) == [
        output("call_del", _compact({"deleted": note_id}), "evt_2"),
        respond("evt_3"),
    ]
    [resolved] = await page.evaluate("rt.resolved.take(1, 'resolved')")
    assert (resolved["call_id"], resolved["resolution"], resolved["reason"]) == (
        "call_del",
        "allowed",
        "user",
    )
    await _quiet(page)


async def test_approval_denied_while_a_parallel_call_is_answered(
    gateway: Gateway, page: Page
) -> None:
    """V1, A5: a call awaiting approval does not hold the answer of a parallel call; the
    denied call's output is the declined text, followed by its own response.create."""
    await _start(page, gateway)
    await _sent(page, 1)
    note_id = await _note(page)
    delete = Call.of("call_del", "notes_delete", {"note_id": note_id})
    mile = Call.of("call_mile", "convert_units", {"value": 1, "from_unit": "mi", "to_unit": "km"})
    await _play(page, calling_turn("resp_1", delete, mile))
    assert [f["call_id"] for f in await _frames(page, 2)] == ["call_del", "call_mile"]
    await page.evaluate("rt.card()")
    assert await _sent(page, 2) == [output("call_mile", MILE, "evt_2"), respond("evt_3")]
    await _play(page, spoken_turn("resp_2", "1.6 km. Shall I delete the note?"))
    await _quiet(page)

    await page.evaluate("rt.lastCard.deny()")
    [confirm] = await _frames(page, 1)
    assert confirm["decision"] == "deny"
    assert await _sent(page, 2) == [output("call_del", DECLINED, "evt_4"), respond("evt_5")]
    [resolved] = await page.evaluate("rt.resolved.take(1, 'resolved')")
    assert (resolved["resolution"], resolved["reason"]) == ("denied", "user")
    assert await page.evaluate("rt.client.invoke('notes_list', {}).then(r => r.result.total)") == 1


async def test_async_job_ending_mid_response_is_told_once_after_it(
    gateway: Gateway, page: Page
) -> None:
    """V1, I9, J4: the dispatch message is the output at once; the job.done that arrives while
    the model speaks becomes one system item + response.create after response.done, once."""
    started = await _start(page, gateway)
    await _sent(page, 1)
    await page.evaluate("rt.hold(['job.done'])")
    report = Call.of("call_rep", "report", {"topic": "walk", "sections": 1})
    await _play(page, calling_turn("resp_1", report))
    [frame] = await _frames(page, 1)
    _invoke(frame, "call_rep", "report", {"topic": "walk", "sections": 1}, started["version"])
    assert await _sent(page, 2) == [output("call_rep", DISPATCH, "evt_2"), respond("evt_3")]

    # The model speaks the dispatch message; the job ends meanwhile (its frame was held
    # until now and is delivered while the response is in flight).
    await page.evaluate("rt.held('job.done')")
    await _play(page, speaking_start("resp_2", DISPATCH))
    await page.evaluate("rt.release()")
    done = await page.evaluate("rt.toolbus('job.done')")
    assert (done["call_id"], done["summary"]) == (
        "call_rep",
        "Report on walk with 1 section(s) is ready.",
    )
    await _quiet(page)

    await _play(page, speaking_end("resp_2", DISPATCH))
    text = (
        f"The background task report (job {done['job_id']}) has finished: "
        f"Report on walk with 1 section(s) is ready. Result: {_compact(done['result'])} "
        "Tell the user now."
    )
    assert await _sent(page, 2) == [system_note(text, "evt_4"), respond("evt_5")]

    # Once: the same job.done frame again, and a resume, tell the model nothing more.
    await page.evaluate("f => rt.client._handleFrame(JSON.stringify(f))", done)
    await page.evaluate("rt.client.simulateDrop()")
    welcome = await page.evaluate("rt.toolbus('welcome')")
    assert welcome["resumed"] is True
    await _play(page, spoken_turn("resp_3", "Your report on walk is ready."))
    assert [f["type"] for f in await _frames(page, 1)] == ["hello"]
    await _quiet(page)


async def test_catalog_change_updates_session_tools(gateway: Gateway, page: Page) -> None:
    """V1, C3, I13: events wait for the transport to open; every catalog version becomes one
    session.update; a call made with the new tools carries the new version."""
    started = await _start(page, gateway, channel="connecting")
    assert await page.evaluate("rt.unsent()") == []
    await page.evaluate("rt.channel.open()")
    assert await _sent(page, 1) == [session_update(_export(gateway), "evt_1")]

    await page.evaluate("rt.client.updateContext({project_id: 'p1'})")
    [update] = await _frames(page, 1)
    assert update["type"] == "context.update"
    with_project = _export(gateway, {"project_id": "p1"})
    assert "project_summary" in [t["name"] for t in with_project]
    assert await _sent(page, 1) == [session_update(with_project, "evt_2")]
    version = await page.evaluate("rt.bridge.catalogVersion")
    assert version != started["version"]
    assert version == await page.evaluate("rt.client.catalog.version")

    # The same version again (catalog.get answers the same catalog) sends nothing.
    await page.evaluate("rt.client.getCatalog(null)")
    await _frames(page, 1)
    await _play(page, calling_turn("resp_1", Call.of("call_proj", "project_summary", {})))
    [frame] = await _frames(page, 1)
    _invoke(frame, "call_proj", "project_summary", {}, version)
    summary = await page.evaluate("rt.toolbus('result')")
    assert await _sent(page, 2) == [
        output("call_proj", _compact(summary["result"]), "evt_3"),
        respond("evt_4"),
    ]
    await _quiet(page)


async def test_toolbus_drop_and_resume_mid_call(gateway: Gateway, page: Page) -> None:
    """V1, D3, I12: the toolbus socket drops while a call awaits approval; after the resume
    the approval is not asked again, the call runs once and its output is sent once."""
    started, note_id, frame = await _delete_called(page, gateway)
    await page.evaluate("rt.card()")

    await page.evaluate("rt.client.simulateDrop()")
    welcome = await page.evaluate("rt.toolbus('welcome')")
    assert welcome["resumed"] is True
    hello, resent = await _frames(page, 2)
    assert (hello["type"], hello["session_id"]) == ("hello", started["session_id"])
    assert resent == frame  # the same invoke, same call_id: the server runs it once (I12)
    await _quiet(page)

    await page.evaluate("rt.lastCard.allow()")
    [confirm] = await _frames(page, 1)
    assert confirm["decision"] == "allow"
    assert await _sent(page, 2) == [
        output("call_del", _compact({"deleted": note_id}), "evt_2"),
        respond("evt_3"),
    ]
    assert await page.evaluate("rt.cards.items.length") == 0
    assert await page.evaluate("rt.client.invoke('notes_list', {}).then(r => r.result.total)") == 0


async def test_client_tools_and_errors_become_output_text(gateway: Gateway, page: Page) -> None:
    """V1, I3, I1, I4: client tools run in the page; unknown tools, bad JSON, invalid
    parameters and a failing client tool all become output text the model can act on."""
    started = await _start(page, gateway)
    await _sent(page, 1)
    calls = [
        Call.of("call_1map", "show_map", {"lat": 48.85, "lon": 2.35}),
        Call.of("call_2weather", "get_weather", {"city": "Paris"}),
        Call("call_3json", "convert_units", '{"value": 1,'),
        Call.of(
            "call_4params", "convert_units", {"value": "one", "from_unit": "mi", "to_unit": "km"}
        ),
        Call.of("call_5zoom", "show_map", {"lat": 0, "lon": 0, "zoom": 20}),
        Call("call_6array", "convert_units", "[1]"),
    ]
    await _play(page, calling_turn("resp_1", *calls))
    weather, params = await _frames(page, 2)
    _invoke(weather, "call_2weather", "get_weather", {"city": "Paris"}, started["version"])
    assert params["call_id"] == "call_4params"
    events = await _sent(page, 7)
    assert events[6] == respond("evt_8")
    outputs = {e["item"]["call_id"]: json.loads(e["item"]["output"]) for e in events[:6]}
    assert sorted(e["event_id"] for e in events[:6]) == [f"evt_{n}" for n in range(2, 8)]

    assert outputs["call_1map"] == {"shown": True, "lat": 48.85, "lon": 2.35}
    assert await page.evaluate("rt.mapCalls.map(c => c.meta)") == [
        {"callId": "call_1map", "tool": "show_map"},
        {"callId": "call_5zoom", "tool": "show_map"},
    ]
    assert outputs["call_2weather"] == {
        "error": "unknown_tool",
        "message": outputs["call_2weather"]["message"],
        "guidance": "There is no weather service here. Tell the user you cannot check the "
        "weather; use clock_now for the local time.",
    }
    assert "get_weather" in outputs["call_2weather"]["message"]
    assert outputs["call_3json"]["error"] == "invalid_arguments"
    assert outputs["call_3json"]["message"].startswith("The arguments are not valid JSON (")
    assert outputs["call_3json"]["message"].endswith("Call convert_units again with a JSON object.")
    assert outputs["call_4params"]["error"] == "invalid_params"
    assert [v["pointer"] for v in outputs["call_4params"]["violations"]] == ["/value"]
    assert outputs["call_5zoom"] == {
        "error": "client_error",
        "message": "show_map failed in the app: no screen at that zoom",
    }
    assert outputs["call_6array"] == {
        "error": "invalid_arguments",
        "message": "The arguments must be a JSON object. Call convert_units again with one.",
    }
    await _quiet(page)


async def test_beta_interface_interrupted_calls_and_a_refused_response_create(
    gateway: Gateway, page: Page
) -> None:
    """V1: the beta interface's session.update has no session.type; a call of a cancelled
    response never runs; a response.create refused because a response is active is sent
    again after that response's response.done."""
    await _start(page, gateway, options={"api": "beta"})
    [update] = await _sent(page, 1, beta=True)
    assert update == session_update(_export(gateway), "evt_1", beta=True)

    cut = Call.of("call_cut", "convert_units", {"value": 1, "from_unit": "mi", "to_unit": "km"})
    await _play(page, calling_turn("resp_1", cut, status="cancelled"))
    await _quiet(page)

    mile = Call.of("call_mile", "convert_units", {"value": 1, "from_unit": "mi", "to_unit": "km"})
    await _play(page, calling_turn("resp_2", mile))
    await _frames(page, 1)
    assert await _sent(page, 2, beta=True) == [output("call_mile", MILE, "evt_2"), respond("evt_3")]
    refusal = {
        "type": "error",
        "event_id": "event_refused",
        "error": {
            "type": "invalid_request_error",
            "code": "conversation_already_has_active_response",
            "message": "Conversation already has an active response in progress.",
            "event_id": "evt_3",
        },
    }
    await _play(page, [refusal])
    await _quiet(page)
    await _play(page, spoken_turn("resp_3", "Hello again."))
    assert await _sent(page, 1, beta=True) == [respond("evt_4")]
    await _quiet(page)


async def test_lost_session_resyncs_the_jobs_of_the_bridge(gateway: Gateway, page: Page) -> None:
    """V1, D3, J3: when the toolbus session cannot be resumed (resumed: false), the job
    events it held are gone; the bridge asks job.list and tells the model the job ended."""
    await _start(page, gateway)
    await _sent(page, 1)
    await page.evaluate("rt.hold(['job.done'])")
    report = Call.of("call_rep", "report", {"topic": "loss", "sections": 1})
    await _play(page, calling_turn("resp_1", report))
    await _frames(page, 1)
    assert await _sent(page, 2) == [output("call_rep", DISPATCH, "evt_2"), respond("evt_3")]
    await _play(page, spoken_turn("resp_2", DISPATCH))

    # The job is done (its job.done frame is held); the socket drops and the resume is
    # refused, so that frame never reaches the bridge.
    await page.evaluate("rt.held('job.done')")
    await page.evaluate(
        """() => {
          const closed = rt.closed();
          rt.client.resumeToken = "not-the-resume-token";
          rt.client.simulateDrop();
          return closed.then(() => rt.release());
        }"""
    )
    welcome = await page.evaluate("rt.toolbus('welcome')")
    assert welcome["resumed"] is False
    await page.evaluate("rt.toolbus('resync')")
    hello, listing = await _frames(page, 2)
    assert (hello["type"], listing["type"]) == ("hello", "job.list")
    [job] = [j for j in await page.evaluate("rt.client.jobs()") if j["call_id"] == "call_rep"]
    assert job["state"] == "done"
    text = (
        f"The background task report (job {job['job_id']}) has finished: "
        f"Report on loss with 1 section(s) is ready. Result: {_compact(job['result'])} "
        "Tell the user now."
    )
    assert await _sent(page, 2) == [system_note(text, "evt_4"), respond("evt_5")]
    assert await page.evaluate("rt.unsent()") == []


async def test_websocket_transport(gateway: Gateway, page: Page) -> None:
    """V1: the same flow over a real WebSocket to a local Realtime stand-in: events sent
    before the socket opens are queued, then a call's outcome and response.create."""
    received: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    peers: list[ServerConnection] = []

    async def realtime(ws: ServerConnection) -> None:
        peers.append(ws)
        async for message in ws:
            await received.put(json.loads(message))

    async def take(count: int) -> list[dict[str, Any]]:
        async with asyncio.timeout(WAIT):
            return check_sent([await received.get() for _ in range(count)])

    async with serve(realtime, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        started = await _start(page, gateway, realtime_url=f"ws://127.0.0.1:{port}/")
        assert await take(1) == [session_update(_export(gateway), "evt_1")]
        [ws] = peers
        mile = Call.of(
            "call_mile", "convert_units", {"value": 1, "from_unit": "mi", "to_unit": "km"}
        )
        for event in calling_turn("resp_1", mile):
            await ws.send(json.dumps(event))
        [frame] = await _frames(page, 1)
        _invoke(frame, "call_mile", "convert_units", json.loads(mile.arguments), started["version"])
        assert await take(2) == [output("call_mile", MILE, "evt_2"), respond("evt_3")]
        await page.evaluate("rt.bridge.close(); rt.channel.close()")
    assert received.empty()


async def test_a_job_dispatched_to_a_call_resent_after_a_lost_session_is_told_when_it_ends(
    gateway: Gateway, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """V1, I15, J4, D3: the session is lost before the bridge read its call's
    ``dispatched``; the re-sent invoke gets the recorded ``dispatched`` in the new session,
    but the job's events still go to the lost one, so the bridge follows the job with
    ``job.get`` and tells the model once it ends."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", 1.5)
    await _start(page, gateway)
    await _sent(page, 1)
    await page.evaluate("rt.hold(['dispatched'])")
    report = Call.of("call_rep", "report", {"topic": "loss", "sections": 1})
    await _play(page, calling_turn("resp_1", report))
    await _frames(page, 1)
    await page.evaluate("rt.held('dispatched')")
    await page.evaluate(
        """() => {
          const closed = rt.closed();
          rt.client.resumeToken = "not-the-resume-token";
          rt.client.simulateDrop();
          return closed.then(() => rt.release());
        }"""
    )
    welcome = await page.evaluate("rt.toolbus('welcome')")
    assert welcome["resumed"] is False
    hello, resent = await _frames(page, 2)
    assert (hello["type"], resent["type"], resent["call_id"]) == ("hello", "invoke", "call_rep")
    assert await _sent(page, 2) == [output("call_rep", DISPATCH, "evt_2"), respond("evt_3")]
    await _play(page, spoken_turn("resp_2", DISPATCH))
    [job] = [j for j in await page.evaluate("rt.client.jobs()") if j["call_id"] == "call_rep"]
    async with asyncio.timeout(WAIT):
        [note, again] = await _sent(page, 2)
    assert (note["type"], note["item"]["type"], again["type"]) == (
        "conversation.item.create",
        "message",
        "response.create",
    )
    assert f"(job {job['job_id']}) has finished" in note["item"]["content"][0]["text"]
