"""Inbound processing of the toolbus client: each server message, dispatched by type
(SPEC K1).

:class:`ClientInbound` processes durable events exactly once and in order by ``seq``
(SPEC D1-D3), resolves waiting calls (``result``, ``dispatched``, ``call.error``; SPEC
I1-I14, I12 for recorded outcomes re-sent after a reconnect) and requests (replies and
``error`` by ``id``), turns ``tool_start`` into approval requests (SPEC A2-A6), follows
jobs to their end (SPEC J2, J4) and notes a drain's ``reconnect`` hint (SPEC S4). One
table, :attr:`ClientInbound._HANDLERS`, maps each message class to its handler.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any, Final

from pydantic import BaseModel

from protocol import messages as m
from protocol.errors import ErrorCode
from toolbus.client_base import ApprovalCallback, ClientBase
from toolbus.errors import RequestRefused, ToolbusClientError, call_error
from toolbus.handles import FINISHED, ApprovalRequest, JobEvent, JobHandle, JobOutcome

logger = logging.getLogger(__name__)

KEEP_OUTCOMES: Final = 1000
"""Finished job outcomes remembered for handles created late (recorded re-sends)."""

FOLLOW_FIRST_DELAY: Final = 0.5
"""Seconds between the first two ``job.get`` of a followed job; doubles up to the
reconnect backoff's cap (SPEC I15, see :meth:`ClientInbound._poll_job`)."""


class ClientInbound(ClientBase):
    """Processes each server message (second layer of :class:`toolbus.client.Client`)."""

    def _process(self, message: BaseModel) -> None:
        """Handle one server message; durable events exactly once by ``seq`` (D1-D3)."""
        seq = getattr(message, "seq", None)
        if seq is not None:
            if seq <= self.last_seq:
                self._late(message)
                return
            if seq != self.last_seq + 1:
                logger.warning("seq gap: %d after %d", seq, self.last_seq)
            self.last_seq = seq
        handler = self._HANDLERS.get(type(message))
        if handler is not None:
            handler(self, message)
        if self._on_message is not None:
            self._call(self._on_message, message)

    def _late(self, message: BaseModel) -> None:
        """An already-processed seq: only a recorded outcome re-sent for a waiting
        invoke (SPEC I12) still counts, and only for that invoke."""
        call_id = getattr(message, "call_id", None)
        if isinstance(message, m.Result | m.Dispatched | m.CallError) and call_id in self._invokes:
            self._HANDLERS[type(message)](self, message)

    def _call(self, callback: Callable[[Any], object], arg: Any) -> None:
        try:
            outcome = callback(arg)
        except Exception:
            logger.exception("callback %r raised", callback)
            return
        if inspect.isawaitable(outcome):
            self._spawn(outcome)

    def _answer(self, request_id: str | None, reply: BaseModel) -> None:
        pending = self._requests.get(request_id) if request_id else None
        if pending is not None and not pending.future.done():
            pending.future.set_result(reply)

    def _finish_call(self, call_id: str, outcome: Any, error: BaseException | None = None) -> None:
        pending = self._invokes.get(call_id)
        if pending is None or pending.future.done():
            return
        if error is not None:
            pending.future.set_exception(error)
        else:
            pending.future.set_result(outcome)

    def _on_catalog(self, msg: m.Catalog) -> None:
        self.catalog, self.catalog_version = list(msg.tools), msg.version
        self._notify_change()
        self._answer(msg.id, msg)

    def _on_not_modified(self, msg: m.CatalogNotModified) -> None:
        self._answer(msg.id, msg)

    def _on_tool_start(self, msg: m.ToolStart) -> None:
        if msg.approval_id is None:
            return
        req = ApprovalRequest(self, msg)
        self._approvals[req.approval_id] = req
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

    def _on_elicit_request(self, msg: m.ElicitRequest) -> None:
        """SPEC M3: a tool asks the user; the ``on_elicitation`` callback answers. Without
        one the question stays open (answer it with ``answer_elicitation``)."""
        if self._on_elicitation is not None:
            self._spawn(self._elicit(msg))

    async def _elicit(self, msg: m.ElicitRequest) -> None:
        assert self._on_elicitation is not None
        try:
            reply = self._on_elicitation(msg)
            if inspect.isawaitable(reply):
                reply = await reply
            action, content = reply
        except Exception:
            logger.exception("elicitation callback raised; answering cancel")
            action, content = m.ElicitAction.CANCEL, None
        try:
            await self.answer_elicitation(msg.elicitation_id, action, content)
        except ToolbusClientError as exc:
            logger.warning("could not answer elicitation %s: %s", msg.elicitation_id, exc)

    def _offer(self, req: ApprovalRequest) -> None:
        for stream in list(self._approval_streams):
            stream.put(req)

    def _on_resolved(self, msg: m.ToolResolved) -> None:
        req = self._approvals.pop(msg.approval_id, None)
        if req is not None:
            req._settle(msg)

    def _drop_approvals(self) -> None:
        """The session holding these approvals is gone (SPEC A4: they are denied)."""
        for req in self._approvals.values():
            req._settle(None)
        self._approvals.clear()

    def _on_result(self, msg: m.Result) -> None:
        self._finish_call(msg.call_id, msg)

    def _on_dispatched(self, msg: m.Dispatched) -> None:
        handle = self._jobs.get(msg.job_id)
        if handle is None:
            handle = JobHandle(self, msg)
            self._jobs[msg.job_id] = handle
            known = self._outcomes.get(msg.job_id)
            if known is not None:
                handle._resolve(known)
        self._finish_call(msg.call_id, handle)

    def _on_call_error(self, msg: m.CallError) -> None:
        self._finish_call(msg.call_id, None, call_error(msg))

    def _on_job_event(self, msg: JobEvent) -> None:
        handle = self._jobs.get(msg.job_id)
        if handle is not None:
            handle.events_here = True
        if isinstance(msg, m.JobProgress):
            if handle is not None:
                handle.progress = (msg.progress, msg.message)
        else:
            self._job_ended(JobOutcome.from_event(msg))
        for stream in list(self._job_streams):
            stream.put(msg)
        if self._job_callback is not None:
            self._call(self._job_callback, msg)

    def _follow(self, handle: JobHandle) -> None:
        """Start following ``handle`` through ``job.get`` (once; SPEC I15, K1)."""
        if handle._following or handle.done() or self._closed is not None:
            return
        handle._following = True
        self._spawn(self._poll_job(handle))

    async def _poll_job(self, handle: JobHandle) -> None:
        """Ask ``job.get`` at once, then with a doubling delay, until the job ended, a
        job event showed its events come to this session, or the client closed. A job
        started by another session of the user (a re-sent ``call_id``, SPEC I15) sends
        its events there; this is how its re-sender learns its end, exactly once."""
        delay = FOLLOW_FIRST_DELAY
        while not handle.done() and not handle.events_here and self._closed is None:
            try:
                info = await self.job(handle.job_id)
            except RequestRefused as exc:
                handle._fail(exc)
                return
            except ToolbusClientError:
                info = None  # no answer (a reconnect is under way): ask again later
            if info is not None and info.state in FINISHED:
                self._job_ended(JobOutcome.from_info(info))
                return
            await asyncio.wait([handle._outcome], timeout=delay)
            delay = min(delay * 2, self.backoff.cap)

    def _job_ended(self, outcome: JobOutcome) -> None:
        self._outcomes[outcome.job_id] = outcome
        while len(self._outcomes) > KEEP_OUTCOMES:
            self._outcomes.popitem(last=False)
        handle = self._jobs.pop(outcome.job_id, None)
        if handle is not None:
            handle._resolve(outcome)

    def _on_error(self, msg: m.Error) -> None:
        """``error``: a refused request (by ``id``) or a refused invoke (by
        ``details.call_id``). A re-sent invoke refused ``duplicate_call`` is still
        running on the server: keep waiting for its terminal event."""
        refused = RequestRefused(msg)
        pending = self._requests.get(msg.id) if msg.id else None
        if pending is None:
            call_id = (msg.details or {}).get("call_id")
            pending = self._invokes.get(call_id) if isinstance(call_id, str) else None
            if pending is not None and pending.resent and msg.code is ErrorCode.DUPLICATE_CALL:
                return
        if pending is not None and not pending.future.done():
            pending.future.set_exception(refused)
            return
        logger.warning("server error not tied to a request: %s: %s", msg.code, msg.message)

    def _on_reply(
        self, msg: m.ConfirmResult | m.ElicitResult | m.Grants | m.Job | m.Jobs | m.Context
    ) -> None:
        self._answer(msg.id, msg)

    def _on_auth_refreshed(self, msg: m.AuthRefreshed) -> None:
        self._answer(msg.id, msg)

    def _on_auth_expiring(self, msg: m.AuthExpiring) -> None:
        """SPEC S6: note the warning; a callback may hand over a fresh credential."""
        self.auth_expiring = msg
        if self._on_expiring is not None:
            self._spawn(self._renew(msg))

    async def _renew(self, msg: m.AuthExpiring) -> None:
        assert self._on_expiring is not None
        try:
            fresh = self._on_expiring(msg)
            if inspect.isawaitable(fresh):
                fresh = await fresh
            if fresh is not None:
                await self.refresh_credentials(fresh)
        except Exception:
            logger.exception("refreshing the credential failed; it expires at %s", msg.expires_at)

    def _on_reconnect(self, msg: m.Reconnect) -> None:
        """SPEC S4: the server drains; wait ``retry_after`` before reconnecting."""
        self._hint = max(0.0, msg.retry_after)

    _HANDLERS: Final[dict[type[BaseModel], Callable[[ClientInbound, Any], None]]] = {
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
