"""Inbound processing of the toolbus client: each server message, dispatched by type
(SPEC K1).

:class:`Inbound` is one part of :class:`toolbus.client.Client`. It processes durable
events exactly once and in order by ``seq`` (SPEC D1-D3), hands replies and terminal
events to the calls part (SPEC I1-I14, I12 for recorded outcomes re-sent after a
reconnect), ``tool_start`` to the approvals part (SPEC A2-A6) and job events to the
jobs part (SPEC J2, J4), keeps the catalog (SPEC C3), and notes a drain's
``reconnect`` hint (SPEC S4) and an ``auth.expiring`` warning (SPEC S6). One table,
:attr:`Inbound.HANDLERS`, maps each message class to its handler.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

from protocol import messages as m
from toolbus.client_approvals import Approvals
from toolbus.client_calls import Calls
from toolbus.client_jobs import Jobs
from toolbus.errors import ToolbusClientError, call_error
from toolbus.handles import EventStream, JobEvent

logger = logging.getLogger(__name__)

ElicitationReply = tuple[m.ElicitAction, "dict[str, Any] | None"]
ElicitationCallback = Callable[[m.ElicitRequest], "ElicitationReply | Awaitable[ElicitationReply]"]
"""``on_elicitation(req)``: a running tool asks the user (SPEC M3). Return the
``(action, content)`` to send as ``elicit.answer``: ``(ElicitAction.ACCEPT, {...})``
with content matching ``req.requested_schema``, or ``(ElicitAction.DECLINE, None)``.
May be a plain function or a coroutine function; one that raises answers ``cancel``."""

JobCallback = Callable[[JobEvent], object]
MessageCallback = Callable[[BaseModel], object]
ExpiringCallback = Callable[[m.AuthExpiring], "str | Awaitable[str | None] | None"]
"""``on_auth_expiring(msg)``: the session's credential expires at ``msg.expires_at``
(SPEC S6). Return a fresh credential (or a coroutine giving one) and the client sends
it with ``auth.refresh``; return ``None`` to do nothing (the server closes 4004 at
expiry). May be a plain function or a coroutine function."""

AnswerElicitation = Callable[
    [str, m.ElicitAction, "Mapping[str, Any] | None"], Awaitable[m.ElicitResult]
]
"""Sends ``elicit.answer`` (SPEC M3): elicitation id, action, content."""


@dataclass(frozen=True, slots=True)
class Callbacks:
    """The caller's callbacks an :class:`Inbound` runs (see :class:`toolbus.client.Client`)."""

    on_message: MessageCallback | None = None
    on_job_event: JobCallback | None = None
    on_auth_expiring: ExpiringCallback | None = None
    on_elicitation: ElicitationCallback | None = None


@dataclass(frozen=True, slots=True)
class Senders:
    """The requests an :class:`Inbound` sends on its own: answering an elicitation from
    ``on_elicitation`` (SPEC M3), a fresh credential from ``on_auth_expiring`` (SPEC S6)."""

    answer_elicitation: AnswerElicitation
    refresh_credentials: Callable[[str], Awaitable[float | None]]


class Inbound:
    """Processes each server message (SPEC K1, D1-D3).

    Args:
        calls: the calls part (replies, terminal events, refusals).
        approvals: the approvals part (``tool_start``, ``tool.resolved``).
        jobs: the jobs part (``dispatched``, job events).
        job_streams: the open :meth:`Client.job_events` streams.
        spawn: runs a coroutine as a task the client cancels when it closes.
        changed: wakes whoever waits for a catalog change or the client's end.
        callbacks: the caller's callbacks.
        senders: the requests the callbacks' answers are sent with.
    """

    def __init__(
        self,
        calls: Calls,
        approvals: Approvals,
        jobs: Jobs,
        job_streams: set[EventStream[JobEvent]],
        spawn: Callable[[Awaitable[Any]], None],
        changed: Callable[[], None],
        callbacks: Callbacks,
        senders: Senders,
    ) -> None:
        self._calls = calls
        self._approvals = approvals
        self._jobs = jobs
        self._job_streams = job_streams
        self._spawn = spawn
        self._changed = changed
        self._callbacks = callbacks
        self._on_message = callbacks.on_message
        self._senders = senders
        self.last_seq = 0
        """Highest ``seq`` processed in the current session (sent as ``last_seq``)."""
        self.catalog: list[m.ToolInfo] = []
        self.catalog_version: str | None = None
        self.auth_expiring: m.AuthExpiring | None = None
        """The last ``auth.expiring`` warning of the current credential (SPEC S6);
        ``None`` again after a refresh."""
        self.hint: float | None = None
        """Seconds a draining server asked to wait before reconnecting (SPEC S4)."""

    def process(self, message: BaseModel) -> None:
        """Handle one server message; durable events exactly once by ``seq`` (D1-D3)."""
        seq = getattr(message, "seq", None)
        if seq is not None:
            if seq <= self.last_seq:
                self._late(message)
                return
            if seq != self.last_seq + 1:
                logger.warning("seq gap: %d after %d", seq, self.last_seq)
            self.last_seq = seq
        handler = self.HANDLERS.get(type(message))
        if handler is not None:
            handler(self, message)
        if self._on_message is not None:
            self._call(self._on_message, message)

    def _late(self, message: BaseModel) -> None:
        """An already-processed seq: only a recorded outcome re-sent for a waiting
        invoke (SPEC I12) still counts, and only for that invoke."""
        call_id = getattr(message, "call_id", None)
        if (
            isinstance(message, m.Result | m.Dispatched | m.CallError)
            and call_id in self._calls.invokes
        ):
            self.HANDLERS[type(message)](self, message)

    def _call(self, callback: Callable[[Any], object], arg: Any) -> None:
        try:
            outcome = callback(arg)
        except Exception:
            logger.exception("callback %r raised", callback)
            return
        if inspect.isawaitable(outcome):
            self._spawn(outcome)

    def _on_catalog(self, msg: m.Catalog) -> None:
        self.catalog, self.catalog_version = list(msg.tools), msg.version
        self._changed()
        self._calls.answer(msg.id, msg)

    def _on_not_modified(self, msg: m.CatalogNotModified) -> None:
        self._calls.answer(msg.id, msg)

    def _on_tool_start(self, msg: m.ToolStart) -> None:
        self._approvals.started(msg)

    def _on_resolved(self, msg: m.ToolResolved) -> None:
        self._approvals.resolved(msg)

    def _on_elicit_request(self, msg: m.ElicitRequest) -> None:
        """SPEC M3: a tool asks the user; the ``on_elicitation`` callback answers. Without
        one the question stays open (answer it with ``answer_elicitation``)."""
        if self._callbacks.on_elicitation is not None:
            self._spawn(self._elicit(msg, self._callbacks.on_elicitation))

    async def _elicit(self, msg: m.ElicitRequest, callback: ElicitationCallback) -> None:
        try:
            reply = callback(msg)
            if inspect.isawaitable(reply):
                reply = await reply
            action, content = reply
        except Exception:
            logger.exception("elicitation callback raised; answering cancel")
            action, content = m.ElicitAction.CANCEL, None
        try:
            await self._senders.answer_elicitation(msg.elicitation_id, action, content)
        except ToolbusClientError as exc:
            logger.warning("could not answer elicitation %s: %s", msg.elicitation_id, exc)

    def _on_result(self, msg: m.Result) -> None:
        self._calls.finish(msg.call_id, msg)

    def _on_dispatched(self, msg: m.Dispatched) -> None:
        self._calls.finish(msg.call_id, self._jobs.dispatched(msg))

    def _on_call_error(self, msg: m.CallError) -> None:
        self._calls.finish(msg.call_id, None, call_error(msg))

    def _on_job_event(self, msg: JobEvent) -> None:
        self._jobs.event(msg)
        for stream in list(self._job_streams):
            stream.put(msg)
        if self._callbacks.on_job_event is not None:
            self._call(self._callbacks.on_job_event, msg)

    def _on_error(self, msg: m.Error) -> None:
        """``error``: a refused request or invoke (:meth:`Calls.refuse`), else logged."""
        if not self._calls.refuse(msg):
            logger.warning("server error not tied to a request: %s: %s", msg.code, msg.message)

    def _on_reply(
        self, msg: m.ConfirmResult | m.ElicitResult | m.Grants | m.Job | m.Jobs | m.Context
    ) -> None:
        self._calls.answer(msg.id, msg)

    def _on_auth_refreshed(self, msg: m.AuthRefreshed) -> None:
        self._calls.answer(msg.id, msg)

    def _on_auth_expiring(self, msg: m.AuthExpiring) -> None:
        """SPEC S6: note the warning; a callback may hand over a fresh credential."""
        self.auth_expiring = msg
        if self._callbacks.on_auth_expiring is not None:
            self._spawn(self._renew(msg, self._callbacks.on_auth_expiring))

    async def _renew(self, msg: m.AuthExpiring, callback: ExpiringCallback) -> None:
        try:
            fresh = callback(msg)
            if inspect.isawaitable(fresh):
                fresh = await fresh
            if fresh is not None:
                await self._senders.refresh_credentials(fresh)
        except Exception:
            logger.exception("refreshing the credential failed; it expires at %s", msg.expires_at)

    def _on_reconnect(self, msg: m.Reconnect) -> None:
        """SPEC S4: the server drains; wait ``retry_after`` before reconnecting."""
        self.hint = max(0.0, msg.retry_after)

    HANDLERS: Final[dict[type[BaseModel], Callable[[Inbound, Any], None]]] = {
        m.Catalog: _on_catalog,
        m.CatalogNotModified: _on_not_modified,
        m.ToolStart: _on_tool_start,
        m.ToolResolved: _on_resolved,
        m.ElicitRequest: _on_elicit_request,
        m.Result: _on_result,
        m.Dispatched: _on_dispatched,
        m.CallError: _on_call_error,
        m.JobProgress: _on_job_event,
        m.JobDone: _on_job_event,
        m.JobFailed: _on_job_event,
        m.JobCancelled: _on_job_event,
        m.Error: _on_error,
        m.ConfirmResult: _on_reply,
        m.ElicitResult: _on_reply,
        m.Grants: _on_reply,
        m.Job: _on_reply,
        m.Jobs: _on_reply,
        m.Context: _on_reply,
        m.Reconnect: _on_reconnect,
        m.AuthExpiring: _on_auth_expiring,
        m.AuthRefreshed: _on_auth_refreshed,
    }
    """Message class -> handler: one table instead of an if/elif chain."""
