"""A Pipecat voice agent whose tools come from toolbus (SPEC V2, V3).

Speech to speech with OpenAI Realtime through Pipecat, on your computer's microphone and
speakers; the tools are the session's toolbus catalog through :class:`toolbus.pipecat.
ToolbusTools`. A dangerous tool asks you on the console first; a report is spoken when
its job is done.

    pip install ".[pipecat]" "pipecat-ai[local,openai]"   # in the clone
    toolbus serve                                  # in another terminal
    OPENAI_API_KEY=sk-... python examples/voice/pipecat_agent.py \\
        --token "$(cat toolbus-data/dev-token)" --profile voice

The OpenAI key is read from the environment by Pipecat's service, which runs here (a
server-side bot needs no ephemeral key); it never goes to toolbus.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from typing import Any

from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameProcessor

import toolbus
from toolbus.pipecat import ToolbusTools

INSTRUCTIONS = (
    "You are a friendly voice assistant with tools: notes, unit conversions, the time and "
    "reports. Deleting a note asks the user on their screen first; if the user declines, "
    "do not retry. A report runs in the background: say the message the tool returns, and "
    "when its result arrives, tell the user its summary."
)


def console_approval(ask: Callable[[str], str] = input) -> Callable[..., Any]:
    """An ``on_approval`` callback asking on the console (``ask`` runs in a thread).

    Answers: ``y`` allow, ``a`` always allow this tool, anything else deny (SPEC A3).
    """

    async def decide(req: toolbus.ApprovalRequest) -> toolbus.Decision:
        answer = await asyncio.to_thread(ask, f"Allow {req.tool} {dict(req.params)}? [y/a/N] ")
        choice = answer.strip().lower()
        if choice == "y":
            return toolbus.Decision.ALLOW
        if choice == "a":
            return toolbus.Decision.ALLOW_ALWAYS
        return toolbus.Decision.DENY

    return decide


def build_pipeline(
    bus: toolbus.Client,
    llm: FrameProcessor,
    audio_in: FrameProcessor,
    audio_out: FrameProcessor,
    on_approval: Callable[..., Any],
) -> Pipeline:
    """The agent's pipeline: audio in, toolbus tools, context, the LLM, audio out."""
    tools = ToolbusTools(bus, on_approval=on_approval)
    context = LLMContext([{"role": "system", "content": INSTRUCTIONS}], tools=tools.tools_schema())
    pair = LLMContextAggregatorPair(context)
    return Pipeline([audio_in, tools, pair.user(), llm, audio_out, pair.assistant()])


async def main() -> None:
    parser = argparse.ArgumentParser(description="A Pipecat voice agent with toolbus tools")
    parser.add_argument("--url", default="ws://127.0.0.1:8765/")
    parser.add_argument("--token", required=True, help="toolbus token (the dev token)")
    parser.add_argument("--profile", default="voice")
    args = parser.parse_args()
    # Imported here: they need pipecat-ai's `local` (PyAudio) and `openai` extras.
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
    from pipecat.transports.local.audio import LocalAudioTransport, LocalAudioTransportParams
    from pipecat.workers.runner import WorkerRunner

    async with toolbus.connect(args.url, token=args.token, profile=args.profile) as bus:
        transport = LocalAudioTransport(
            LocalAudioTransportParams(audio_in_enabled=True, audio_out_enabled=True)
        )
        llm = OpenAIRealtimeLLMService(api_key=os.environ["OPENAI_API_KEY"])
        pipeline = build_pipeline(
            bus, llm, transport.input(), transport.output(), console_approval()
        )
        runner = WorkerRunner()
        await runner.add_workers(PipelineWorker(pipeline))
        await runner.run()


if __name__ == "__main__":
    asyncio.run(main())
