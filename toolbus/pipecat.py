"""Pipecat adapter: a session's toolbus catalog as the functions of a Pipecat LLM (SPEC V2).

Install with the extra ``pipecat`` (``pip install ".[pipecat]"`` in the clone).
:class:`ToolbusTools` is a Pipecat ``FrameProcessor``; put it in the pipeline before the
user context aggregator and give its :meth:`~ToolbusTools.tools_schema` to the ``LLMContext``::

    bus = await toolbus.connect(url, token=token, profile="voice").open()
    tools = ToolbusTools(bus, on_approval=ask_the_user)
    context = LLMContext(messages, tools=tools.tools_schema())
    pair = LLMContextAggregatorPair(context)
    pipeline = Pipeline([transport.input(), stt, tools, pair.user(), llm, tts,
                         transport.output(), pair.assistant()])

- **Schemas.** Each catalog tool becomes a ``FunctionSchema`` carrying its handler, so
  the LLM service registers it wherever the context advertises it; when the catalog
  changes (SPEC C3: hot reload, context update) the processor pushes an
  ``LLMSetToolsFrame`` with the new set, and the service follows it.
- **Calls.** A handler invokes the tool through the toolbus :class:`~toolbus.Client`
  with ``call_id`` = Pipecat's ``tool_call_id`` (a repeated id returns the recorded
  outcome, SPEC I12/I15) and the catalog version the model was given (SPEC I13).
  The result handed to Pipecat: a sync tool's result object; a declined call's text
  (SPEC A5); ``{"error": code, "message", ...hints}`` for a ``call.error`` or a client
  failure, so the model can act on it.
- **Approvals.** ``on_approval(req)`` gets each :class:`~toolbus.ApprovalRequest` of
  this adapter's calls and returns a :class:`~toolbus.Decision` (or ``None`` to answer
  later through ``req``); it may be a coroutine function (SPEC A2, A3). Each request is
  asked in a task of its own, so a callback still waiting for the user does not hold
  back the next question. A callback that raises is logged and its request stays
  pending, as with the Client's own ``on_approval`` (toolbus/client_approvals.py): the
  user did not decline, so no ``deny`` is sent in the user's name (the audit would say
  "user"); whoever else holds the request (``bus.approvals()``) can still answer it,
  else the server denies it at the approval timeout or when the call is cancelled
  (SPEC A4, reasons ``timeout`` / ``cancelled``). Later requests are asked as before.
- **Cancellation.** When Pipecat cancels a function call (an interruption for sync
  tools, ``cancel_on_interruption=True``; its function call timeout; the LLM
  cancelling an async call) it broadcasts a ``FunctionCallCancelFrame`` and tells the
  model the call was cancelled. The adapter then cancels it on toolbus too:
  ``call.cancel`` (SPEC I8; a pending approval is settled, denied ``cancelled``,
  SPEC A4, so a late "allow" changes nothing), or ``job.cancel`` for a job it already
  follows (SPEC J3); an ``on_approval`` still asking about that call is cancelled.
- **Jobs.** ``async`` tools are registered as Pipecat async function calls
  (``cancel_on_interruption=False``): the dispatch message is an intermediate result
  the model says at once, and the job's end is the final result, which Pipecat puts
  into the conversation when it arrives (SPEC I9, J4). A sync call promoted to a job
  (SPEC I14) answers with its dispatch message; its end is appended to the context
  with an ``LLMMessagesAppendFrame`` that runs the LLM.
- **Client tools.** ``client``-mode tools run here, from ``client_tools`` (SPEC I3).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from pipecat.adapters.llm.schemas.direct_function import tool_options
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    FunctionCallCancelFrame,
    FunctionCallResultProperties,
    LLMMessagesAppendFrame,
    LLMSetToolsFrame,
    StartFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams

from protocol import messages as m
from protocol.codec import encode_json
from toolbus.client import Client
from toolbus.errors import CallFailed, RequestRefused, ToolbusClientError
from toolbus.handles import ApprovalRequest, JobHandle, JobOutcome

logger = logging.getLogger("toolbus.pipecat")

ApprovalHandler = Callable[[ApprovalRequest], "m.Decision | Awaitable[m.Decision | None] | None"]
"""``on_approval``: a decision for the request, or ``None`` to leave it pending."""
ClientTool = Callable[[dict[str, Any]], Any]
"""A ``client``-mode tool's handler: gets the arguments, returns (or awaits) a JSON value."""
Handler = Callable[[FunctionCallParams], Awaitable[None]]

CANCEL_TIMEOUT = 5.0
"""Seconds to wait for the answer to a ``call.cancel`` / ``job.cancel`` (SPEC I8, J3);
also how long stopping the processor waits for cancellations still under way."""


def error_payload(error: ToolbusClientError) -> dict[str, Any]:
    """The result the model gets for a failed call: ``{"error": code, "message", ...}``
    with the ``call.error`` hints (``suggestions``, ``guidance``, ``violations``,
    ``reason_code``) when there are any (SPEC V2, I1, I4)."""
    payload: dict[str, Any] = {"error": str(error.code or "client"), "message": str(error)}
    if isinstance(error, CallFailed):
        event = error.event
        payload["message"] = event.message
        for key in ("suggestions", "guidance", "violations", "reason_code"):
            value = getattr(event, key)
            if value:
                payload[key] = (
                    [v.model_dump(exclude_none=True) for v in value]
                    if key == "violations"
                    else value
                )
    return payload


def result_payload(result: m.Result) -> dict[str, Any] | str:
    """A sync call's result for the model: the result object, or the declined text."""
    if result.declined:
        return str(result.result.get("message", "The user declined this tool call."))
    return dict(result.result)


def job_payload(outcome: JobOutcome) -> dict[str, Any]:
    """A finished job for the model (SPEC J4): ``{"job_id", "tool", "state",
    "summary", "result"?, "error"?}``; artifacts stay out (they may be large)."""
    payload: dict[str, Any] = {
        "job_id": outcome.job_id,
        "tool": outcome.tool,
        "state": outcome.state.value,
        "summary": outcome.summary,
    }
    if outcome.result:
        payload["result"] = outcome.result
    if outcome.error is not None:
        payload["error"] = outcome.error.model_dump()
    return payload


class ToolbusTools(FrameProcessor):
    """The toolbus catalog as Pipecat functions, following every change (SPEC V2).

    Args:
        client: an open toolbus client (its catalog is known).
        on_approval: decides approval requests of this adapter's calls; ``None``
            leaves them to the client (its own ``on_approval`` or ``approvals()``).
        client_tools: handlers of ``client``-mode tools, by tool name.
        **kwargs: passed to ``FrameProcessor``.
    """

    def __init__(
        self,
        client: Client,
        *,
        on_approval: ApprovalHandler | None = None,
        client_tools: Mapping[str, ClientTool] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.client = client
        self.on_approval = on_approval
        self.client_tools = dict(client_tools or {})
        self.version: str | None = None
        """The catalog version last given to the model."""
        self._handlers: dict[tuple[str, str], Handler] = {}
        self._calls: dict[str, JobHandle | None] = {}
        """Pipecat calls not settled yet -> the job an async call waits for, once known."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._asking: dict[asyncio.Task[None], str] = {}
        """``on_approval`` tasks still running -> the call id they ask about."""
        self._cancels: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ schemas

    def tools_schema(self) -> ToolsSchema:
        """The session's catalog as a ``ToolsSchema`` of ``FunctionSchema`` objects that
        carry their handlers; records its version as the one the model was given."""
        self.version = self.client.catalog_version
        return ToolsSchema(standard_tools=[self._schema(tool) for tool in self.client.catalog])

    def _schema(self, tool: m.ToolInfo) -> FunctionSchema:
        params = tool.parameters
        return FunctionSchema(
            name=tool.name,
            description=tool.description + _root_rules_note(params),
            properties=inline_refs(dict(params.get("properties", {})), params),
            required=list(params.get("required", [])),
            handler=self._handler(tool),
        )

    def _handler(self, tool: m.ToolInfo) -> Handler:
        # One handler object per (name, mode), so Pipecat does not re-bind unchanged tools.
        key = (tool.name, tool.mode)
        if key not in self._handlers:
            is_async = tool.mode == "async"

            async def handle(params: FunctionCallParams) -> None:
                await self._call(params, is_async=is_async)

            self._handlers[key] = tool_options(handle, cancel_on_interruption=not is_async)
        return self._handlers[key]

    # ------------------------------------------------------------------ calls

    async def _call(self, params: FunctionCallParams, *, is_async: bool) -> None:
        call_id = params.tool_call_id
        self._calls[call_id] = None
        try:
            await self._run(params, is_async=is_async)
        except asyncio.CancelledError:
            # Pipecat cancels this task, then broadcasts its FunctionCallCancelFrame:
            # the entry stays for _cancel to find (SPEC I8).
            raise
        except BaseException:
            self._calls.pop(call_id, None)
            raise
        self._calls.pop(call_id, None)

    async def _run(self, params: FunctionCallParams, *, is_async: bool) -> None:
        name, call_id = params.function_name, params.tool_call_id
        info = self.client.tool(name)
        if info is not None and info.mode == "client":
            await params.result_callback(await self._client_tool(name, dict(params.arguments)))
            return
        try:
            out = await self.client.invoke(
                name, dict(params.arguments), call_id=call_id, catalog_version=self.version
            )
        except ToolbusClientError as exc:
            await params.result_callback(error_payload(exc))
            return
        if isinstance(out, m.Result):
            await params.result_callback(result_payload(out))
        elif is_async:
            # Pipecat's async function call: the dispatch message now (the model says it
            # at once, even beside sibling calls), the job's end later.
            self._calls[call_id] = out
            later = FunctionCallResultProperties(is_final=False, run_llm=True)
            await params.result_callback(out.message, properties=later)
            await params.result_callback(job_payload(await out.result()))
        else:
            await params.result_callback(out.message)
            self._spawn(self._tell_when_done(out))

    async def _tell_when_done(self, handle: JobHandle) -> None:
        """A promoted sync call (SPEC I14): its job's end joins the conversation."""
        outcome = await handle.result()
        note = {
            "role": "developer",
            "content": f"The background task {outcome.tool} (call {handle.call_id}) ended: "
            f"{job_payload(outcome)}. Tell the user.",
        }
        await self.push_frame(LLMMessagesAppendFrame(messages=[note], run_llm=True))  # type: ignore[list-item]

    async def _client_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        handler = self.client_tools.get(name)
        if handler is None:
            return {"error": "no_client_handler", "message": f"This app cannot run {name}."}
        try:
            value = handler(arguments)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:  # the model is told; the pipeline goes on
            logger.warning("client tool %s failed: %s", name, exc)
            return {"error": "client_error", "message": f"{name} failed in the app: {exc}"}
        return {"ok": True} if value is None else value

    # ------------------------------------------------------------------ background

    async def _follow_catalog(self) -> None:
        """Push the new tool set on every catalog change (SPEC C3)."""
        while True:
            seen = self.version

            def changed(_: list[m.ToolInfo], seen: str | None = seen) -> bool:
                return self.client.catalog_version != seen

            try:
                await self.client.wait_catalog(changed)
            except ToolbusClientError:
                return  # the client stopped
            await self.push_frame(LLMSetToolsFrame(tools=self.tools_schema()))

    async def _answer_approvals(self) -> None:
        """Hand each approval request of this adapter's calls to ``on_approval``, in a
        task of its own (SPEC A2, A3): one that raises or waits does not stop the rest."""
        async with self.client.approvals() as requests:
            async for req in requests:
                if req.call_id in self._calls:
                    task = self._spawn(self._ask(req))
                    self._asking[task] = req.call_id
                    task.add_done_callback(lambda done: self._asking.pop(done, None))

    async def _ask(self, req: ApprovalRequest) -> None:
        """Ask ``on_approval`` about ``req`` and send the decision it returns (SPEC A3).

        A callback that raises is logged and ``req`` stays pending, as with the Client's
        own callback: nothing is sent in the user's name; the request can still be
        answered through ``req`` (``bus.approvals()``), else the server denies it at the
        approval timeout or when the call is cancelled (SPEC A4)."""
        assert self.on_approval is not None
        try:
            decision = self.on_approval(req)
            if inspect.isawaitable(decision):
                decision = await decision
        except Exception:
            logger.exception("on_approval raised for call %s; it stays pending", req.call_id)
            return
        if decision is None or req.decided is not None or req.settled:
            return
        try:
            await req.decide(m.Decision(decision))
        except ToolbusClientError as exc:
            logger.warning("could not send the decision for call %s: %s", req.call_id, exc)

    async def _cancel(self, call_id: str, handle: JobHandle | None) -> None:
        """Pipecat cancelled ``call_id`` and told the model so: cancel it on toolbus too,
        ``call.cancel`` (SPEC I8; its pending approval is denied ``cancelled``, A4), or
        ``job.cancel`` of ``handle``, the job of a dispatched async call (SPEC J3)."""
        for task, asked in list(self._asking.items()):
            if asked == call_id:
                task.cancel()  # the question is moot: the call is gone
        try:
            if handle is not None:
                await self.client.cancel_job(handle.job_id, timeout=CANCEL_TIMEOUT)
            else:
                await self.client.cancel(call_id, timeout=CANCEL_TIMEOUT)
        except RequestRefused as exc:
            logger.debug("call %s had already ended on toolbus: %s", call_id, exc)
        except ToolbusClientError as exc:
            logger.warning("could not cancel call %s on toolbus: %s", call_id, exc)

    def _spawn(
        self, coroutine: Coroutine[Any, Any, None], pool: set[asyncio.Task[None]] | None = None
    ) -> asyncio.Task[None]:
        """Run ``coroutine`` as a task of this processor, kept in ``pool`` (default: the
        background tasks) until it ends."""
        pool = self._tasks if pool is None else pool
        task: asyncio.Task[None] = self.create_task(coroutine)
        pool.add(task)
        task.add_done_callback(pool.discard)
        return task

    # ------------------------------------------------------------------ frames

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Pass every frame on; start following the session at ``StartFrame``, cancel a
        call on toolbus at its ``FunctionCallCancelFrame`` (SPEC I8), and stop at
        ``EndFrame`` / ``CancelFrame``."""
        await super().process_frame(frame, direction)
        if isinstance(frame, FunctionCallCancelFrame) and frame.tool_call_id in self._calls:
            handle = self._calls.pop(frame.tool_call_id)  # once, whatever else repeats it
            self._spawn(self._cancel(frame.tool_call_id, handle), self._cancels)
        if isinstance(frame, EndFrame | CancelFrame):
            await self._stop()
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame):
            self._spawn(self._follow_catalog())
            if self.on_approval is not None:
                self._spawn(self._answer_approvals())

    async def _stop(self) -> None:
        # Cancellations under way are let finish (bounded): the model was told the call
        # is cancelled, so toolbus must not go on running it (SPEC I8).
        if self._cancels:
            await asyncio.wait(set(self._cancels), timeout=CANCEL_TIMEOUT)
        tasks = self._tasks | self._cancels  # a copy: done tasks leave the old sets
        self._tasks, self._cancels = set(), set()
        self._calls.clear()
        for task in tasks:
            await self.cancel_task(task)

    async def cleanup(self) -> None:
        """Cancel the background tasks (Pipecat calls this at teardown)."""
        await super().cleanup()  # type: ignore[no-untyped-call]
        await self._stop()


# -- schema flattening ---------------------------------------------------------------------

_MAX_REF_DEPTH = 16


def inline_refs(node: Any, root: Mapping[str, Any], depth: int = 0) -> Any:
    """Copy ``node`` with every local ``$ref`` (``#/$defs/X``, ``#/definitions/X``) of
    ``root`` replaced by what it points to (SPEC C4).

    Pipecat's ``FunctionSchema`` carries only ``properties`` and ``required``, so a
    ``$ref`` into the root's ``$defs`` would dangle once the root is dropped. A
    recursive definition is cut at ``_MAX_REF_DEPTH`` levels, where the reference
    becomes an unconstrained ``{}``; a non-local ``$ref`` is kept as it is.

    Args:
        node: a JSON Schema fragment (dicts, lists and scalars).
        root: the tool's whole parameters schema, where the references point.
        depth: how many references have been followed to reach ``node``.

    Returns:
        A new structure; ``node`` and ``root`` are not changed.
    """
    if isinstance(node, list):
        return [inline_refs(item, root, depth) for item in node]
    if not isinstance(node, Mapping):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        if depth >= _MAX_REF_DEPTH:
            return {}
        target: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")  # RFC 6901 section 4
            target = target.get(part) if isinstance(target, Mapping) else None
        if isinstance(target, Mapping):
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            return inline_refs({**target, **siblings}, root, depth + 1)
    return {key: inline_refs(value, root, depth) for key, value in node.items()}


def _root_rules_note(params: Mapping[str, Any]) -> str:
    """A sentence for the description naming root combinators that ``FunctionSchema``
    cannot carry (``oneOf`` / ``anyOf`` / ``allOf`` / ``not``), so the model still learns
    them; toolbus validates the full schema at the call either way (SPEC I4, C4)."""
    rules = {k: params[k] for k in ("oneOf", "anyOf", "allOf", "not") if k in params}
    if not rules:
        return ""
    return " Parameter rules: " + encode_json(rules).decode()
