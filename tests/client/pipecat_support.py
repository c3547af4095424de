"""A scripted Pipecat LLM and a pipeline gate for the adapter tests (SPEC V2); no network.

:class:`ScriptedLLM` is a real Pipecat ``LLMService``: on each ``LLMContextFrame`` (one
inference) it records the context the model would see and plays the next turn of its
script: function calls through Pipecat's own ``run_function_calls`` (so registration,
parallel calls, async calls and result callbacks are Pipecat's), or a spoken answer.
:class:`Gate` sits first in the pipeline: a :class:`Hold` frame stops later frames
until its event is set, and ``EndFrame`` waits for the script to end, so
``pipecat.tests.utils.run_test`` can drive a conversation whose steps wait on toolbus
without any sleep.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Any

from pipecat.frames.frames import (
    DataFrame,
    EndFrame,
    Frame,
    FunctionCallFromLLM,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import LLMService
from pipecat.services.settings import LLMSettings

from tests.support import WAIT


@dataclass(frozen=True)
class Calls:
    """A turn that calls functions: ``(tool_call_id, name, arguments)`` each."""

    calls: tuple[tuple[str, str, dict[str, Any]], ...]
    before: Callable[[], Awaitable[Any]] | None = None


@dataclass(frozen=True)
class Say:
    """A turn that answers with text; ``before`` runs first (e.g. a context update)."""

    text: str
    before: Callable[[], Awaitable[Any]] | None = None


@dataclass
class Hold(DataFrame):
    """Frames after this one wait until ``event`` is set (see :class:`Gate`)."""

    event: asyncio.Event = field(default_factory=asyncio.Event)


class ScriptedLLM(LLMService):  # type: ignore[misc]
    """An LLM service that plays ``script``, one turn per inference."""

    def __init__(self, script: list[Calls | Say]) -> None:
        # Every setting given (None: unsupported), as Pipecat asks of a service.
        unset = {f.name: None for f in fields(LLMSettings) if f.init and not f.name.startswith("_")}
        super().__init__(settings=LLMSettings(**unset))
        self.script = list(script)
        self.contexts: list[list[dict[str, Any]]] = []
        self.tools: list[list[str]] = []
        self.finished = asyncio.Event()
        self.extra = 0
        """Inferences after the script ran out (a test expects 0)."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame):
            await self._infer(frame)
        else:
            await self.push_frame(frame, direction)

    async def _infer(self, frame: LLMContextFrame) -> None:
        context = frame.context
        self.contexts.append(copy.deepcopy(list(context.get_messages())))
        self.tools.append(sorted(t.name for t in context.tools.standard_tools))
        if not self.script:
            self.extra += 1
            return
        turn = self.script.pop(0)
        if turn.before is not None:
            await turn.before()
        if isinstance(turn, Say):
            await self.push_frame(LLMFullResponseStartFrame())
            await self.push_frame(LLMTextFrame(turn.text))
            await self.push_frame(LLMFullResponseEndFrame())
        else:
            calls = [
                FunctionCallFromLLM(
                    function_name=name, tool_call_id=call_id, arguments=args, context=context
                )
                for call_id, name, args in turn.calls
            ]
            await self.run_function_calls(calls)
        if not self.script:
            self.finished.set()


class Gate(FrameProcessor):  # type: ignore[misc]
    """Holds the frame stream at each :class:`Hold` until its event, and ``EndFrame``
    until ``llm`` played its whole script."""

    def __init__(self, llm: ScriptedLLM) -> None:
        super().__init__()
        self.llm = llm

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, Hold):
            async with asyncio.timeout(WAIT):
                await frame.event.wait()
            return
        if isinstance(frame, EndFrame):
            async with asyncio.timeout(WAIT):
                await self.llm.finished.wait()
        await self.push_frame(frame, direction)


class Probe(FrameProcessor):  # type: ignore[misc]
    """Sets ``event`` when a frame of ``kind`` passes downstream, and keeps those frames."""

    def __init__(self, kind: type[Frame]) -> None:
        super().__init__()
        self.kind = kind
        self.event = asyncio.Event()
        self.seen: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, self.kind) and direction == FrameDirection.DOWNSTREAM:
            self.seen.append(frame)
            self.event.set()
        await self.push_frame(frame, direction)
