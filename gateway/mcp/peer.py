"""What a mounted MCP server asks toolbus during a call: sampling and elicitation (SPEC M3).

:class:`PeerRequests` holds the SDK ``Client`` callbacks for one mounted server and knows
which toolbus calls are in flight on it, so a question reaches the user of the call it
belongs to. Sampling is refused with a clear error unless the mount names a handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import mcp_types as types

from catalog.handlers import resolve_handler
from catalog.mcp_mounts import MountSpec
from gateway.context import ToolContext
from protocol import messages as m

logger = logging.getLogger("gateway.mcp")

Answer = tuple[m.ElicitAction, dict[str, Any] | None]
"""The user's action and, for ``accept``, the content (SPEC M3)."""

Elicit = Callable[[ToolContext, str, dict[str, Any]], Awaitable[Answer]]
"""``elicit(ctx, message, schema) -> (action, content)``: asks the call's user (SPEC M3)."""

_CALL: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar("mcp_call", default=None)
"""The toolbus call a ``tools/call`` runs for, seen by callbacks run in the caller's task
(2026-07-28 servers ask for input inside the call's own round trips)."""


class PeerRequests:
    """The sampling and elicitation callbacks of one mounted server (SPEC M3).

    Args:
        spec: the server's configuration (its name and ``sampling`` handler).
        elicit: asks a call's user; ``None`` declares no elicitation capability.
        describe: one line about an exception, for log lines and error texts.
    """

    def __init__(
        self, spec: MountSpec, elicit: Elicit | None, describe: Callable[[BaseException], str]
    ) -> None:
        self.spec = spec
        self.elicit = elicit
        self._describe = describe
        self._inflight: list[ToolContext] = []
        self._asking: list[tuple[ToolContext, asyncio.Future[Answer]]] = []
        """Questions asked outside their call's task, each with its call (SPEC M3)."""

    @contextlib.contextmanager
    def calling(self, ctx: ToolContext) -> Iterator[None]:
        """While a ``tools/call`` for the toolbus call ``ctx`` runs: questions asked in the
        caller's task, or while it is the only call in flight, are its user's. When it
        ends (done, failed, cancelled: SPEC I8), its questions still open end with it."""
        token = _CALL.set(ctx)
        self._inflight.append(ctx)
        try:
            yield
        finally:
            _CALL.reset(token)
            self._inflight.remove(ctx)
            for call, asking in self._asking:
                if call is ctx:
                    asking.cancel()

    async def sampling(
        self, context: Any, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.ErrorData:
        """SPEC M3: refused plainly, unless the server's ``sampling`` handler answers."""
        if self.spec.sampling is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message=(
                    f"sampling is not available: toolbus does not offer an LLM to mounted "
                    f"MCP server {self.spec.name!r}"
                ),
            )
        try:
            sampler = resolve_handler(self.spec.sampling)
            value = sampler(params.model_dump(mode="json", by_alias=True, exclude_none=True))
            if inspect.isawaitable(value):
                value = await value
            return types.CreateMessageResult.model_validate(value)
        except Exception as exc:  # the deployment's handler: any failure is an answer
            text = self._describe(exc)
            logger.warning("mcp %s: sampling handler failed: %s", self.spec.name, text)
            return types.ErrorData(code=types.INTERNAL_ERROR, message=f"sampling failed: {text}")

    async def elicitation(
        self, context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        """SPEC M3: the question goes to the user of the call it belongs to. That call is
        the caller's task's (2026-07-28), else the one call in flight (2025-era servers
        ask on their own stream); with several in flight, or a URL-mode question, the
        answer is ``decline``, since toolbus cannot tell whom to ask."""
        own = _CALL.get()
        ctx = own or (self._inflight[0] if len(self._inflight) == 1 else None)
        if self.elicit is None or ctx is None or isinstance(params, types.ElicitRequestURLParams):
            return types.ElicitResult(action="decline")
        schema = params.requested_schema
        if not isinstance(schema, dict):
            schema = schema.model_dump(mode="json", by_alias=True, exclude_none=True)
        if own is not None:  # in the call's task: it is cancelled with the call
            action, content = await self.elicit(ctx, params.message, schema)
        else:
            action, content = await self._ask_apart(ctx, params.message, schema)
        return types.ElicitResult(action=action.value, content=content)

    async def _ask_apart(self, ctx: ToolContext, message: str, schema: dict[str, Any]) -> Answer:
        """SPEC M3, I8, A4: a question a 2025-era server asks on its own stream runs in the
        SDK's task, not the call's; it is tied to its call here, so the call's end
        settles it (the server is answered ``cancel``; a later answer is not accepted)."""
        assert self.elicit is not None
        asking = asyncio.ensure_future(self.elicit(ctx, message, schema))
        entry = (ctx, asking)
        self._asking.append(entry)
        try:
            await asyncio.wait({asking})
        finally:
            asking.cancel()  # this request cancelled: its question ends too
            self._asking.remove(entry)
        if asking.cancelled():
            return (m.ElicitAction.CANCEL, None)
        return asking.result()
