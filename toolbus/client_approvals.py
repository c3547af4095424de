"""The client's approval requests: from ``tool_start`` to ``tool.resolved`` (SPEC A2-A6).

:class:`Approvals` is one part of :class:`toolbus.client.Client`. Each ``tool_start``
with an ``approval_id`` becomes an :class:`~toolbus.handles.ApprovalRequest`, handed to
the ``on_approval`` callback, or else to every :meth:`Client.approvals` stream. It is
built with the client's ``tool.confirm`` sender, a task spawner and the callback.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from protocol import messages as m
from toolbus.errors import ToolbusClientError
from toolbus.handles import ApprovalRequest, Confirm, EventStream

logger = logging.getLogger(__name__)

ApprovalCallback = Callable[[ApprovalRequest], "m.Decision | Awaitable[m.Decision | None] | None"]
"""``on_approval(req)``: return a :class:`~protocol.messages.Decision` to answer at once,
or ``None`` to leave the request to :meth:`~toolbus.client.Client.approvals` or a later
``req.allow()``. May be a plain function or a coroutine function."""


class Approvals:
    """Approval requests of the current session, and the streams that want them.

    Args:
        confirm: sends ``tool.confirm`` (SPEC A3).
        spawn: runs a coroutine as a task the client cancels when it closes.
        on_approval: the caller's callback, or ``None``.
    """

    def __init__(
        self,
        confirm: Confirm,
        spawn: Callable[[Awaitable[Any]], None],
        on_approval: ApprovalCallback | None,
    ) -> None:
        self._confirm = confirm
        self._spawn = spawn
        self._on_approval = on_approval
        self.requests: dict[str, ApprovalRequest] = {}
        """Approval id -> the request, until ``tool.resolved`` or the session ends."""
        self._streams: set[EventStream[ApprovalRequest]] = set()

    def started(self, msg: m.ToolStart) -> None:
        """A gated call waits for the user (SPEC A2); ungated ``tool_start`` is ignored."""
        if msg.approval_id is None:
            return
        req = ApprovalRequest(self._confirm, msg)
        self.requests[req.approval_id] = req
        if self._on_approval is not None:
            self._spawn(self._ask(req, self._on_approval))
        else:
            self._offer(req)

    async def _ask(self, req: ApprovalRequest, callback: ApprovalCallback) -> None:
        """Run the approval callback; a returned decision is sent at once (SPEC A3)."""
        try:
            decision = callback(req)
            if inspect.isawaitable(decision):
                decision = await decision
        except Exception:
            logger.exception("approval callback raised; the request stays pending")
            decision = None
        if decision is None:
            self._offer(req)
            return
        req.handled = True
        if req.decided is None and not req.settled:
            try:
                await req.decide(m.Decision(decision))
            except ToolbusClientError as exc:
                logger.warning("could not send the decision for %s: %s", req.approval_id, exc)

    def _offer(self, req: ApprovalRequest) -> None:
        for stream in list(self._streams):
            stream.put(req)

    def decided(self, approval_id: str, decision: m.Decision) -> None:
        """Note a decision sent by id (:meth:`Client.confirm`)."""
        req = self.requests.get(approval_id)
        if req is not None:
            req.decided = decision

    def resolved(self, msg: m.ToolResolved) -> None:
        """``tool.resolved``: the server settled the request (SPEC A4, A5)."""
        req = self.requests.pop(msg.approval_id, None)
        if req is not None:
            req._settle(msg)

    def drop(self) -> None:
        """The session holding these requests is gone (SPEC A4: they are denied)."""
        for req in self.requests.values():
            req._settle(None)
        self.requests.clear()

    def stream(self) -> EventStream[ApprovalRequest]:
        """A new stream, starting with the requests still pending and undecided that no
        callback answered."""
        stream: EventStream[ApprovalRequest] = EventStream(self._streams)
        for req in self.requests.values():
            if not req.settled and req.decided is None and not req.handled:
                stream.put(req)
        return stream

    def waiting(self) -> list[ApprovalRequest]:
        """Requests not settled yet, oldest first."""
        return [req for req in self.requests.values() if not req.settled]

    def close(self) -> None:
        """The client is done: end every stream and drop every request."""
        for stream in list(self._streams):
            stream.close()
        self.drop()
