"""The approval gate of a call (SPEC I7, A1-A6; case F01).

:meth:`ApprovalGate.approved` emits ``tool_start``; when the call needs a decision it
opens an approval first (so an instant answer is kept, SPEC A2), waits for it, emits
``tool.resolved`` and ends a declined call through :class:`~gateway.call_end.CallEnd`
with a normal ``result`` that tells the model the user said no (SPEC A5).
"""

from __future__ import annotations

import asyncio

from catalog.model import ToolDef
from gateway.approvals import Approval, Approvals, Settlement
from gateway.call_end import Call, CallEnd
from gateway.config import CallsConfig, LimitsConfig
from gateway.metrics import Metrics
from gateway.session import Session
from protocol import messages as m
from protocol.codec import encode_json
from protocol.errors import ErrorCode
from protocol.outcomes import CallOutcome


def pending_note(approval: Approval) -> bytes:
    """The stored note of a call waiting for ``approval`` (SPEC A2, A4, N3): its tool,
    the approval id (a restart resolves it, A4) and the ``expires_at`` ``tool_start``
    announced, so that a node that routes a decision for it answers a late one
    ``expired`` as this node would (:meth:`gateway.node_requests.NodeRequests.route_confirm`).
    Staged with ``tool_start``: any node that saw it can read the note."""
    return encode_json(
        {
            "tool": approval.tool,
            "approval_id": approval.approval_id,
            "expires_at": approval.expires_at,
        }
    )


class ApprovalGate:
    """``tool_start`` and, when gated, the wait for the user's decision; one per server.

    Args:
        approvals: the approval registry (only :meth:`Approvals.settle` decides, F01).
        calls: call settings (``declined_message``, SPEC A5).
        limits: per-session limits (``max_pending_approvals``, SPEC E2).
        metrics: the server's metrics (``pending_approvals``).
        end: the one exit, for a refused or declined call.
    """

    def __init__(
        self,
        approvals: Approvals,
        calls: CallsConfig,
        limits: LimitsConfig,
        metrics: Metrics,
        end: CallEnd,
    ) -> None:
        self.approvals = approvals
        self.calls = calls
        self.limits = limits
        self.metrics = metrics
        self.end = end

    @staticmethod
    def needs_approval(session: Session, tool: ToolDef) -> bool:
        """SPEC A1."""
        if tool.name in session.grants or tool.name in session.profile.auto_approve:
            return False
        return tool.requires_approval or session.confirm_tool_calls

    def ungated(self, call: Call, tool: ToolDef) -> bool:
        """SPEC I7, A1, A6: ``True`` when the call needs no approval, its ``tool_start``
        emitted if the session asked for ungated ones; ``False`` (nothing done) when it
        does: then :meth:`approved` waits for the decision. Not a coroutine: the
        common case costs no coroutine on every call."""
        session = call.session
        if self.needs_approval(session, tool):
            return False
        if session.ungated_tool_start:
            session.emit(m.ToolStart(call_id=call.call_id, tool=tool.name, params=call.params))
        return True

    async def approved(self, call: Call, tool: ToolDef) -> bool:
        """SPEC I7, A1-A6: for a call :meth:`ungated` found gated, ``tool_start`` with its
        ``approval_id``, then wait for the decision.

        Returns:
            ``True`` when the call may go on; ``False`` when it ended here (too many
            approvals pending, or declined).

        Raises:
            asyncio.CancelledError: the call was cancelled while waiting; the approval
                is settled denied ``cancelled`` first and ``tool.resolved`` emitted.
        """
        session = call.session
        if len(session.pending_approvals) >= self.limits.max_pending_approvals:
            self.end.error(
                call,
                ErrorCode.TOO_MANY_PENDING_APPROVALS,
                "too many approvals pending",
                CallOutcome.CANCELLED,
            )
            return False
        # SPEC A2: registered before tool_start is emitted, so an instant answer is kept.
        approval = self.approvals.open(
            session.id, session.user, call.call_id, tool.name, call.params
        )
        session.pending_approvals.add(approval.approval_id)
        call.approval_id = approval.approval_id
        session.store.stage_call(session.id, call.call_id, "running", pending_note(approval))
        self.metrics.pending_approvals.inc()
        session.emit(
            m.ToolStart(
                call_id=call.call_id,
                tool=tool.name,
                params=call.params,
                approval_id=approval.approval_id,
                expires_at=approval.expires_at,
            )
        )
        return await self.decided(call, tool, approval)

    async def decided(self, call: Call, tool: ToolDef, approval: Approval) -> bool:
        """SPEC A3-A6: wait for the decision on ``approval`` (opened here, or adopted from
        a node that drained, SPEC N6), emit ``tool.resolved``, and end a declined call.

        Returns:
            ``True`` when the call may go on, ``False`` when it ended here (declined).

        Raises:
            asyncio.CancelledError: cancelled while waiting; the approval is settled
                denied ``cancelled`` first, unless the call was handed to another node
                (SPEC N6: it stays pending there).
        """
        session = call.session
        try:
            # F01: waiting decides nothing; only Approvals.settle does.
            outcome = await approval.wait()
        except asyncio.CancelledError:
            if call.handed_off:
                raise
            self.approvals.settle(
                approval.approval_id, m.Resolution.DENIED, m.ResolutionReason.CANCELLED
            )
            assert approval.outcome is not None
            self.resolved(call, approval.approval_id, tool.name, approval.outcome)
            raise
        self.resolved(call, approval.approval_id, tool.name, outcome)
        if outcome.resolution is m.Resolution.ALLOWED:
            if outcome.always:
                session.grants.add(tool.name)
                session.save()
            return True
        self.declined(call, tool, outcome.reason)
        return False

    def resolved(self, call: Call, approval_id: str, tool: str, outcome: Settlement) -> None:
        """SPEC A6: the resolution is an event in the log and part of the audit record."""
        session = call.session
        session.pending_approvals.discard(approval_id)
        call.approval_id = None
        # The recovery note no longer names the approval: it is settled (SPEC A3/A6: a
        # restart must not resolve it a second time).
        note = encode_json({"tool": tool})
        session.store.stage_call(session.id, call.call_id, "running", note)
        self.metrics.pending_approvals.dec()
        call.approval = {
            "approval_id": approval_id,
            "resolution": outcome.resolution.value,
            "reason": outcome.reason.value,
            "always": outcome.always,
            "at": outcome.at,
            "by": session.user if outcome.reason is m.ResolutionReason.USER else "server",
        }
        session.emit(
            m.ToolResolved(
                call_id=call.call_id,
                approval_id=approval_id,
                tool=tool,
                resolution=outcome.resolution,
                reason=outcome.reason,
                always=outcome.always,
            )
        )

    def declined(self, call: Call, tool: ToolDef, reason: m.ResolutionReason) -> None:
        """SPEC A5: a declined call completes normally, telling the model the user said no."""
        result = {"declined": True, "reason": reason.value, "message": self.calls.declined_message}
        outcome = (
            CallOutcome.APPROVAL_TIMEOUT
            if reason is m.ResolutionReason.TIMEOUT
            else CallOutcome.REJECTED_BY_USER
        )
        self.end.finish(call, outcome, m.Result, result=result, declined=True)
