"""Attacks on the Pipecat adapter (SPEC V2) found by the h-mcp helper: a real gateway, a
real Pipecat pipeline with the scripted LLM of tests/client/pipecat_support.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pipecat.frames.frames import (
    FunctionCallCancelFrame,
    FunctionCallResultFrame,
    InterruptionFrame,
    LLMMessagesAppendFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.tests.utils import run_test

import toolbus
from tests.client.pipecat_support import Calls, Gate, Hold, Probe, Say, ScriptedLLM
from tests.support import WAIT, running, settings_for
from toolbus.pipecat import ToolbusTools

SYSTEM = {"role": "system", "content": "You are a voice agent."}
USER = {"role": "user", "content": "Please delete my two notes."}


async def test_h_v2_a3_one_raising_approval_callback_does_not_silence_later_approvals(
    tmp_path: Path,
) -> None:
    """SPEC V2 ("approvals through a callback"), A3, A4.

    The bot's ``on_approval`` fails once (say its text-to-speech raised while asking the
    first question). The Client's own ``on_approval`` survives that (logged, the request
    stays pending, later requests are still asked: toolbus/client_approvals.py). The
    adapter runs every approval of the session in one task, ``_answer_approvals``; the
    exception ends that task, so every later approval of the conversation never reaches
    the callback: each gated call waits for ``approval_timeout`` and is declined, and the
    user is never asked again.

    Expected: the second call's approval reaches ``on_approval`` and its ALLOW deletes
    the note."""
    settings = settings_for(tmp_path, calls={"approval_timeout": 2})
    async with (
        running(settings) as gw,
        toolbus.connect(gw.url, token="alice-token", profile="demo") as bus,
    ):
        first = await bus.invoke("notes_create", {"title": "a", "body": "one"})
        second = await bus.invoke("notes_create", {"title": "b", "body": "two"})
        assert isinstance(first, toolbus.Result)
        assert isinstance(second, toolbus.Result)
        a, b = first.result["note_id"], second.result["note_id"]
        asked: list[str] = []

        async def decide(req: toolbus.ApprovalRequest) -> toolbus.Decision:
            asked.append(req.call_id)
            if req.call_id == "c1":
                raise RuntimeError("text-to-speech is down")
            return toolbus.Decision.ALLOW

        tools = ToolbusTools(bus, on_approval=decide)
        llm = ScriptedLLM(
            [
                Calls((("c1", "notes_delete", {"note_id": a}),)),
                Calls((("c2", "notes_delete", {"note_id": b}),)),
                Say("Done."),
            ]
        )
        context = LLMContext([SYSTEM], tools=tools.tools_schema())
        pair = LLMContextAggregatorPair(context)
        results = Probe(FunctionCallResultFrame)
        pipeline = Pipeline([Gate(llm), tools, pair.user(), llm, results, pair.assistant()])
        frames = [LLMMessagesAppendFrame(messages=[USER], run_llm=True)]
        async with asyncio.timeout(WAIT * 2):
            await run_test(pipeline, frames_to_send=frames)
        got: dict[str, Any] = {
            f.tool_call_id: f.result for f in results.seen if isinstance(f, FunctionCallResultFrame)
        }
    assert asked == ["c1", "c2"], (asked, got)
    assert got["c2"] == {"deleted": b}, got


async def test_h_v2_i8_a_call_pipecat_cancels_on_interruption_is_cancelled_on_toolbus(
    tmp_path: Path,
) -> None:
    """SPEC V2, I8 ("``call.cancel`` ... cancels the running call"), A4 (the call
    cancelled -> deny).

    The adapter registers sync tools with ``cancel_on_interruption=True``: when the user
    barges in, Pipecat cancels the function call and tells the model it was cancelled.
    The handler's ``bus.invoke`` is cancelled, but cancelling ``invoke`` only stops
    waiting (toolbus/client.py: "A timeout stops waiting; it does not cancel the call");
    the adapter sends no ``call.cancel``. So the toolbus call goes on: here a gated
    ``notes_delete`` whose card is still up. The user taps "allow" on it after having
    interrupted, and the note is deleted, though the model was told the call was
    cancelled and will never see its result.

    Expected: the interrupted call is cancelled on toolbus; its approval is settled
    (a late allow is not accepted) and the note stays."""
    settings = settings_for(tmp_path, calls={"approval_timeout": 5})
    async with (
        running(settings) as gw,
        toolbus.connect(gw.url, token="alice-token", profile="demo") as bus,
    ):
        made = await bus.invoke("notes_create", {"title": "a", "body": "one"})
        assert isinstance(made, toolbus.Result)
        note = made.result["note_id"]
        cards: list[toolbus.ApprovalRequest] = []
        interrupted = asyncio.Event()
        tools: ToolbusTools

        async def decide(req: toolbus.ApprovalRequest) -> None:
            cards.append(req)

            async def barge_in() -> None:
                # The card is up: the function call runs in Pipecat and on toolbus.
                await tools.push_frame(InterruptionFrame())
                async with asyncio.timeout(WAIT):
                    while not cancels.seen:  # noqa: ASYNC110 - a frame Pipecat passes on
                        await asyncio.sleep(0.01)
                interrupted.set()

            asyncio.get_running_loop().create_task(barge_in())
            return None  # the card stays up; the user has not answered yet

        tools = ToolbusTools(bus, on_approval=decide)
        llm = ScriptedLLM([Calls((("c1", "notes_delete", {"note_id": note}),))])
        context = LLMContext([SYSTEM], tools=tools.tools_schema())
        pair = LLMContextAggregatorPair(context)
        cancels = Probe(FunctionCallCancelFrame)
        pipeline = Pipeline([Gate(llm), tools, pair.user(), llm, cancels, pair.assistant()])
        # The conversation ends once the user has barged in.
        frames = [LLMMessagesAppendFrame(messages=[USER], run_llm=True), Hold(interrupted)]
        async with asyncio.timeout(WAIT * 2):
            await run_test(pipeline, frames_to_send=frames)
        # Pipecat did cancel the function call on the interruption.
        assert [f.tool_call_id for f in cancels.seen] == ["c1"]
        async with asyncio.timeout(WAIT):
            while gw.pipeline.in_flight():  # noqa: ASYNC110 - the adapter's call.cancel
                await asyncio.sleep(0.01)
        still = [c.call_id for c in gw.pipeline.in_flight()]
        [card] = cards
        late = await card.allow()
        notes = await bus.invoke("notes_list", {})
        assert isinstance(notes, toolbus.Result)
    kept = [n["note_id"] for n in notes.result["notes"]]
    assert (still, late.accepted, kept) == ([], False, [note]), (still, late, kept)
