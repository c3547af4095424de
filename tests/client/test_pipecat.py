"""The Pipecat adapter (toolbus/pipecat.py, SPEC V2) in a real Pipecat pipeline, no network.

Each test runs ``pipecat.tests.utils.run_test`` on a pipeline of the adapter, Pipecat's
own context aggregators and a scripted LLM service (tests/client/pipecat_support.py)
whose function calls go through Pipecat's function-call machinery to the real toolbus
server. Asserts are exact on what the model saw at each inference (the LLM context),
on the results Pipecat received, and on the toolbus side. Covers V2 with C3/C4
(catalog as functions, followed on change), I12/I13 (call id, catalog version), A2-A5
(approval callback, each request asked on its own, declined text), I9/J4/I14 (dispatch
message, job end delivered later), I8/J3 (a call Pipecat cancels is cancelled on
toolbus), I3 (client tools), I4 (errors as results).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pipecat.frames.frames import (
    Frame,
    FunctionCallResultFrame,
    LLMMessagesAppendFrame,
    LLMSetToolsFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators import async_tool_messages as atm
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.tests.utils import run_test
from websockets.asyncio.client import ClientConnection

import toolbus
from gateway.demo import handlers as demo_handlers
from gateway.server import Gateway
from tests.client.pipecat_support import Calls, Gate, Hold, Probe, Say, ScriptedLLM
from tests.support import WAIT
from toolbus.pipecat import ToolbusTools, _root_rules_note, inline_refs

SYSTEM = {"role": "system", "content": "You are a voice agent."}
USER = {"role": "user", "content": "Please help."}
DISPATCH = "I'm writing that report now; I'll tell you when it's ready."
DECLINED = "The user declined this tool call. Do not retry it; ask the user how to proceed."
MILE = {"value": 1.0, "from_unit": "mi", "to_unit": "km", "result": 1.609344, "dimension": "length"}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def holding(types: set[str], release: asyncio.Event) -> type[ClientConnection]:
    """A websockets connection that holds server frames of ``types`` until ``release``
    (cancel-safe: a held frame is kept for the next ``recv``)."""

    class Held(ClientConnection):
        _pending: Any = None

        async def recv(self, decode: bool | None = None) -> Any:  # type: ignore[override]
            if self._pending is None:
                self._pending = await super().recv(decode)
            if not release.is_set() and json.loads(self._pending)["type"] in types:
                await release.wait()
            raw, self._pending = self._pending, None
            return raw

    return Held


@pytest.fixture
async def bus(gateway: Gateway) -> AsyncIterator[toolbus.Client]:
    """A toolbus client of alice on the demo profile."""
    async with toolbus.connect(gateway.url, token="alice-token", profile="demo") as client:
        yield client


async def _converse(
    tools: ToolbusTools,
    llm: ScriptedLLM,
    frames: list[Frame],
    *probes: Probe,
    release_after: tuple[str, asyncio.Event] | None = None,
) -> list[Frame]:
    """Run the pipeline [gate, adapter, probes, user aggregator, llm, results probe,
    assistant aggregator] with Pipecat's run_test until the script is played; returns the
    ``FunctionCallResultFrame``s the LLM service sent downstream, in order."""
    context = LLMContext([SYSTEM], tools=tools.tools_schema())
    pair = LLMContextAggregatorPair(context)
    if release_after is not None:
        # Set the event once the assistant turn saying `text` is in the context.
        text, event = release_after

        @pair.assistant().event_handler("on_assistant_turn_stopped")
        async def turn_stopped(_: Any, message: Any) -> None:
            if message.content == text:
                event.set()

    results = Probe(FunctionCallResultFrame)
    pipeline = Pipeline([Gate(llm), tools, *probes, pair.user(), llm, results, pair.assistant()])
    async with asyncio.timeout(WAIT * 2):
        await run_test(pipeline, frames_to_send=frames)
    assert llm.extra == 0
    assert llm.script == []
    return results.seen


def _ask() -> list[Frame]:
    return [LLMMessagesAppendFrame(messages=[USER], run_llm=True)]


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The assistant message Pipecat's aggregator writes for a call in progress."""
    return {
        "role": "assistant",
        "tool_calls": [
            {
                "id": call_id,
                "function": {"name": name, "arguments": _dumps(args)},
                "type": "function",
            }
        ],
    }


def _tool(call_id: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "content": _dumps(content), "tool_call_id": call_id}


def _results(down: list[Frame]) -> dict[str, Any]:
    return {f.tool_call_id: f.result for f in down if isinstance(f, FunctionCallResultFrame)}


async def test_catalog_becomes_functions_and_sync_calls_return_results(
    bus: toolbus.Client,
) -> None:
    """V2, C4, I3, I4: every catalog tool is a FunctionSchema with its handler; parallel
    calls (server, client tool, invalid parameters) give the model exact results."""
    maps: list[dict[str, Any]] = []

    def show_map(args: dict[str, Any]) -> dict[str, Any]:
        maps.append(args)
        return {"shown": True}

    tools = ToolbusTools(bus, client_tools={"show_map": show_map})
    schemas = tools.tools_schema().standard_tools
    assert [s.to_default_dict() for s in schemas] == [
        {
            "name": t.name,
            "description": t.description,
            "parameters": {
                "type": "object",
                "properties": t.parameters.get("properties", {}),
                "required": t.parameters.get("required", []),
            },
        }
        for t in bus.catalog
    ]
    assert all(s.handler is not None for s in schemas)
    assert tools.version == bus.catalog_version

    mile = {"value": 1, "from_unit": "mi", "to_unit": "km"}
    where = {"lat": 48.85, "lon": 2.35}
    bad = {"value": "one", "from_unit": "mi", "to_unit": "km"}
    llm = ScriptedLLM(
        [
            Calls(
                (
                    ("call_mile", "convert_units", mile),
                    ("call_map", "show_map", where),
                    ("call_bad", "convert_units", bad),
                )
            ),
            Say("One mile is 1.6 km; the map is on screen."),
        ]
    )
    down = await _converse(tools, llm, _ask())
    assert llm.tools[0] == sorted(t.name for t in bus.catalog)
    results = _results(down)
    assert results["call_mile"] == MILE
    assert results["call_map"] == {"shown": True}
    assert maps == [where]
    failed = results["call_bad"]
    assert failed["error"] == "invalid_params"
    assert [v["pointer"] for v in failed["violations"]] == ["/value"]
    assert llm.contexts[0] == [SYSTEM, USER]
    assert llm.contexts[1] == [
        SYSTEM,
        USER,
        _call("call_mile", "convert_units", mile),
        _tool("call_mile", MILE),
        _call("call_map", "show_map", where),
        _tool("call_map", {"shown": True}),
        _call("call_bad", "convert_units", bad),
        _tool("call_bad", failed),
    ]
    # I12: toolbus recorded the call under the model's call id: the same id returns it.
    again = await bus.invoke("convert_units", mile, call_id="call_mile")
    assert isinstance(again, toolbus.Result)
    assert again.result == MILE


async def test_client_tool_failures_become_results(bus: toolbus.Client) -> None:
    """V2, I3: a client tool that raises, and one the bot has no handler for, answer the
    model with an error it can act on; the pipeline goes on."""

    def broken(args: dict[str, Any]) -> None:
        raise RuntimeError("no screen")

    where = {"lat": 1, "lon": 2}
    for handlers, expected in (
        (
            {"show_map": broken},
            {"error": "client_error", "message": "show_map failed in the app: no screen"},
        ),
        ({}, {"error": "no_client_handler", "message": "This app cannot run show_map."}),
    ):
        tools = ToolbusTools(bus, client_tools=handlers)
        llm = ScriptedLLM([Calls((("call_map", "show_map", where),)), Say("No map, sorry.")])
        down = await _converse(tools, llm, _ask())
        assert _results(down) == {"call_map": expected}
        assert llm.contexts[1][-1] == _tool("call_map", expected)


async def test_approvals_go_through_the_callback(bus: toolbus.Client) -> None:
    """V2, A2, A3, A5: the callback decides each gated call; an allowed delete returns its
    result, a denied one the declined text; both go back to the model."""
    first = await bus.invoke("notes_create", {"title": "a", "body": "one"})
    second = await bus.invoke("notes_create", {"title": "b", "body": "two"})
    assert isinstance(first, toolbus.Result)
    assert isinstance(second, toolbus.Result)
    keep, drop = second.result["note_id"], first.result["note_id"]
    asked: list[tuple[str, str, dict[str, Any]]] = []

    async def decide(req: toolbus.ApprovalRequest) -> toolbus.Decision:
        asked.append((req.call_id, req.tool, dict(req.params)))
        return toolbus.Decision.ALLOW if req.params["note_id"] == drop else toolbus.Decision.DENY

    tools = ToolbusTools(bus, on_approval=decide)
    llm = ScriptedLLM(
        [
            Calls(
                (
                    ("call_drop", "notes_delete", {"note_id": drop}),
                    ("call_keep", "notes_delete", {"note_id": keep}),
                )
            ),
            Say("I deleted one note; you kept the other."),
        ]
    )
    down = await _converse(tools, llm, _ask())
    assert sorted(asked) == [
        ("call_drop", "notes_delete", {"note_id": drop}),
        ("call_keep", "notes_delete", {"note_id": keep}),
    ]
    assert _results(down) == {"call_drop": {"deleted": drop}, "call_keep": DECLINED}
    assert llm.contexts[1][2:] == [
        _call("call_drop", "notes_delete", {"note_id": drop}),
        _tool("call_drop", {"deleted": drop}),
        _call("call_keep", "notes_delete", {"note_id": keep}),
        _tool("call_keep", DECLINED),
    ]
    remaining = await bus.invoke("notes_list", {})
    assert isinstance(remaining, toolbus.Result)
    assert [n["note_id"] for n in remaining.result["notes"]] == [keep]


async def _held_bus(gateway: Gateway, release: asyncio.Event) -> toolbus.Client:
    held = holding({"job.done"}, release)
    return toolbus.connect(
        gateway.url,
        token="alice-token",
        profile="demo",
        ws_options={"create_connection": held},
    )


async def test_async_job_result_enters_the_conversation_when_it_ends(gateway: Gateway) -> None:
    """V2, I9, J4: an async tool is a Pipecat async call: the dispatch message is spoken at
    once, and the job's end reaches the model later as Pipecat's final result."""
    release = asyncio.Event()
    args = {"topic": "walk", "sections": 1}
    async with await _held_bus(gateway, release) as bus:
        tools = ToolbusTools(bus)
        llm = ScriptedLLM(
            [
                Calls((("call_rep", "report", args),)),
                Say(DISPATCH),
                Say("Your report on walk is ready."),
            ]
        )
        # The job's end is let through once the model said the dispatch message.
        down = await _converse(tools, llm, _ask(), release_after=(DISPATCH, release))
        jobs = await bus.jobs()
    [job] = jobs
    assert (job.call_id, job.state) == ("call_rep", "done")
    final = {
        "job_id": job.job_id,
        "tool": "report",
        "state": "done",
        "summary": "Report on walk with 1 section(s) is ready.",
        "result": job.result,
    }
    placed = [
        SYSTEM,
        USER,
        _call("call_rep", "report", args),
        atm.build_started_message("call_rep"),
        atm.build_intermediate_result_message("call_rep", _dumps(DISPATCH)),
    ]
    assert llm.contexts[1] == placed
    assert llm.contexts[2] == [
        *placed,
        {"role": "assistant", "content": DISPATCH},
        atm.build_final_result_message("call_rep", _dumps(final)),
    ]
    results = [f for f in down if isinstance(f, FunctionCallResultFrame)]
    assert [(f.result, f.properties.is_final if f.properties else True) for f in results] == [
        (DISPATCH, False),
        (final, True),
    ]


async def test_promoted_sync_call_is_told_when_its_job_ends(gateway: Gateway) -> None:
    """V2, I14: a sync call promoted to a job answers with its dispatch message; the job's
    end is appended to the context and runs the LLM."""
    release = asyncio.Event()
    async with await _held_bus(gateway, release) as bus:
        tools = ToolbusTools(bus)
        llm = ScriptedLLM(
            [
                Calls((("call_slow", "slow_lookup", {"query": "tea"}),)),
                Say("Still looking."),
                Say("Found it."),
            ]
        )
        down = await _converse(tools, llm, _ask(), release_after=("Still looking.", release))
        [job] = await bus.jobs()
    promoted = "slow_lookup is taking a while; I'll report back when it's done."
    assert _results(down) == {"call_slow": promoted}
    assert llm.contexts[1][-2:] == [
        _call("call_slow", "slow_lookup", {"query": "tea"}),
        _tool("call_slow", promoted),
    ]
    payload = {
        "job_id": job.job_id,
        "tool": "slow_lookup",
        "state": "done",
        "summary": job.summary,
        "result": job.result,
    }
    assert llm.contexts[2][-2:] == [
        {"role": "assistant", "content": "Still looking."},
        {
            "role": "developer",
            "content": f"The background task slow_lookup (call call_slow) ended: {payload}. "
            "Tell the user.",
        },
    ]


async def test_catalog_change_reaches_the_llm(bus: toolbus.Client) -> None:
    """V2, C3, I13: a context update changes the catalog; the adapter pushes the new tool
    set, the next inference sees it, and a call of a new tool carries the new version."""
    before = bus.catalog_version
    tools = ToolbusTools(bus)
    probe = Probe(LLMSetToolsFrame)

    async def link() -> None:
        await bus.update_context({"project_id": "p1"})

    llm = ScriptedLLM(
        [
            Say("Linked.", before=link),
            Calls((("call_sum", "project_summary", {}),)),
            Say("Here is the summary."),
        ]
    )
    frames: list[Frame] = [*_ask(), Hold(probe.event), *_ask()]
    down = await _converse(tools, llm, frames, probe)
    assert "project_summary" not in llm.tools[0]
    assert llm.tools[1] == sorted(t.name for t in bus.catalog)
    assert "project_summary" in llm.tools[1]
    assert tools.version == bus.catalog_version != before
    [pushed] = probe.seen
    assert isinstance(pushed, LLMSetToolsFrame)
    summary = _results(down)["call_sum"]
    assert summary["project_id"] == "p1"
    assert llm.contexts[2][-2:] == [
        _call("call_sum", "project_summary", {}),
        _tool("call_sum", summary),
    ]


def test_schema_refs_are_inlined_and_root_rules_described() -> None:
    """SPEC C4, V2: Pipecat's ``FunctionSchema`` keeps only ``properties`` and
    ``required``, so references into ``$defs`` are inlined and root combinators are
    named in the description instead of being lost."""
    params = {
        "type": "object",
        "$defs": {
            "when": {"type": "string", "format": "date"},
            "node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}},
        },
        "properties": {
            "day": {"$ref": "#/$defs/when", "description": "the day"},
            "tree": {"$ref": "#/$defs/node"},
            "far": {"$ref": "https://example.org/schema"},
        },
        "oneOf": [{"required": ["day"]}, {"required": ["tree"]}],
    }
    props = inline_refs(params["properties"], params)
    assert props["day"] == {"type": "string", "format": "date", "description": "the day"}
    assert props["far"] == {"$ref": "https://example.org/schema"}
    depth, node = 0, props["tree"]
    while node:
        node = node["properties"]["next"]
        depth += 1
    assert depth == 16
    assert _root_rules_note(params) == (
        ' Parameter rules: {"oneOf":[{"required":["day"]},{"required":["tree"]}]}'
    )
    assert _root_rules_note({"type": "object"}) == ""


async def test_a_callback_still_waiting_does_not_hold_back_the_next_question(
    bus: toolbus.Client,
) -> None:
    """V2, A2, A3: each approval is asked in a task of its own: the first question waits
    for the user (here, until the second is answered), the parallel call's is asked
    meanwhile, and both decisions count (asked one after the other, the first gives up and
    denies)."""
    made = [await bus.invoke("notes_create", {"title": t, "body": t}) for t in ("a", "b")]
    a, b = (r.result["note_id"] for r in made if isinstance(r, toolbus.Result))
    second_answered = asyncio.Event()

    async def decide(req: toolbus.ApprovalRequest) -> toolbus.Decision:
        if req.call_id == "call_b":
            second_answered.set()
            return toolbus.Decision.ALLOW
        try:
            async with asyncio.timeout(WAIT / 2):
                await second_answered.wait()
        except TimeoutError:  # call_b was not asked meanwhile: the user gave up
            return toolbus.Decision.DENY
        return toolbus.Decision.ALLOW

    tools = ToolbusTools(bus, on_approval=decide)
    calls = (("call_a", "notes_delete", {"note_id": a}), ("call_b", "notes_delete", {"note_id": b}))
    llm = ScriptedLLM([Calls(calls), Say("Both deleted.")])
    down = await _converse(tools, llm, _ask())
    assert _results(down) == {"call_a": {"deleted": a}, "call_b": {"deleted": b}}


async def test_an_async_call_pipecat_cancels_cancels_its_job(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """V2, I8, J3: Pipecat cancelling an async function call (here every call in flight,
    ``LLMService.cancel_function_calls``) cancels its dispatched job on toolbus, so the
    job does not run on unseen."""
    monkeypatch.setattr(demo_handlers, "REPORT_SECTION_SECONDS", WAIT)
    async with toolbus.connect(gateway.url, token="alice-token", profile="demo") as bus:
        tools = ToolbusTools(bus)
        llm: ScriptedLLM

        async def cancel_calls() -> None:
            await llm.cancel_function_calls(reason="the user changed their mind")

        llm = ScriptedLLM(
            [
                Calls((("call_rep", "report", {"topic": "walk", "sections": 2}),)),
                Say(DISPATCH, before=cancel_calls),
            ]
        )
        await _converse(tools, llm, _ask())
        async with asyncio.timeout(WAIT):
            while (jobs := await bus.jobs()) and jobs[0].state != "cancelled":  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    assert [(j.call_id, j.state) for j in jobs] == [("call_rep", "cancelled")]
