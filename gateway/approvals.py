"""Approval requests and their decisions (SPEC A1-A4, cases F01-F05, F11).

A gated call gets an :class:`Approval` with an unguessable id (192 random bits, SPEC
A2), registered *before* ``tool_start`` is emitted, so a confirmation that arrives at
once finds it. Exactly four things may settle an approval: the user's decision, the
approval timeout (its own clock, SPEC A4), a cancel of the call, and the end of the
session. A waiter that stops waiting decides nothing (F01): the decision is held in
an :class:`asyncio.Event` plus :attr:`Approval.outcome`, not in a shared future that a
waiter's timeout or cancellation could cancel, and only :meth:`Approvals.settle` writes
it. The first settlement wins; later ones are refused with a typed reason (SPEC A3).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from protocol.messages import Decision, NotAcceptedReason, Resolution, ResolutionReason

SETTLED_MEMORY = 10_000
"""Settled approval ids remembered to answer late duplicates ``already_decided``."""


@dataclass(frozen=True, slots=True)
class Settlement:
    """How an approval was settled."""

    resolution: Resolution
    reason: ResolutionReason
    always: bool = False
    at: float = 0.0
    """Unix time in seconds."""


@dataclass(slots=True, eq=False)
class Approval:
    """One pending decision, bound to one call and its arguments (F02)."""

    approval_id: str
    session_id: str
    user: str
    call_id: str
    tool: str
    params: dict[str, Any]
    expires_at: float
    outcome: Settlement | None = None
    """The decision once settled; ``None`` while pending."""
    decided: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    async def wait(self) -> Settlement:
        """Wait for the decision. Any number of waiters may give up (cancel, time out)
        without settling or disturbing the approval (case F01)."""
        await self.decided.wait()
        assert self.outcome is not None
        return self.outcome


class Approvals:
    """Registry of pending approvals across all sessions (SPEC A2-A4).

    Args:
        timeout: seconds an approval may stay pending before it is denied (SPEC A4).
        clock: returns Unix time in seconds (the wall clock; tests may pass their own).
    """

    def __init__(self, timeout: float, clock: Any) -> None:
        self.timeout = timeout
        self._clock = clock
        self.pending: dict[str, Approval] = {}
        self._settled: OrderedDict[str, tuple[str, Settlement]] = OrderedDict()

    def open(
        self, session_id: str, user: str, call_id: str, tool: str, params: dict[str, Any]
    ) -> Approval:
        """Register a pending approval; its timeout clock starts now (SPEC A2, A4)."""
        loop = asyncio.get_running_loop()
        approval = Approval(
            approval_id="ap_" + secrets.token_urlsafe(24),
            session_id=session_id,
            user=user,
            call_id=call_id,
            tool=tool,
            params=params,
            expires_at=self._clock() + self.timeout,
        )
        approval.timer = loop.call_later(
            self.timeout,
            self.settle,
            approval.approval_id,
            Resolution.DENIED,
            ResolutionReason.TIMEOUT,
        )
        self.pending[approval.approval_id] = approval
        return approval

    def release(self, approval_id: str) -> Approval | None:
        """Stop holding a pending approval without settling it: its call moves to
        another node, which :meth:`restore` s it there (SPEC N6). Returns it, or
        ``None`` when it was not pending (settled meanwhile)."""
        approval = self.pending.pop(approval_id, None)
        if approval is not None and approval.timer is not None:
            approval.timer.cancel()
        return approval

    def restore(
        self,
        approval_id: str,
        session_id: str,
        user: str,
        call_id: str,
        tool: str,
        params: dict[str, Any],
        expires_at: float,
    ) -> Approval:
        """Hold again an approval another node :meth:`release` d (SPEC N6): same id,
        same ``expires_at`` (Unix seconds; one already past times out at once, A4)."""
        approval = Approval(approval_id, session_id, user, call_id, tool, params, expires_at)
        approval.timer = asyncio.get_running_loop().call_later(
            max(0.0, expires_at - self._clock()),
            self.settle,
            approval_id,
            Resolution.DENIED,
            ResolutionReason.TIMEOUT,
        )
        self.pending[approval_id] = approval
        return approval

    def confirm(
        self,
        session_id: str,
        user: str,
        approval_id: str,
        decision: Decision,
        at: float | None = None,
    ) -> NotAcceptedReason | None:
        """Apply a client's decision (SPEC A3).

        Args:
            session_id: the deciding session.
            user: its user.
            approval_id: the approval decided.
            decision: the client's decision.
            at: when the gateway received the decision (Unix s): for one routed from
                another node (SPEC N3), that node's time, which it also judged the
                decision by; ``None``: now, on this registry's clock. A decision
                received at or after ``expires_at`` is ``expired``.

        Returns:
            ``None`` when accepted; else why nothing changed: ``unknown`` (never issued,
            forged, or another session's or user's: SPEC A7, case F26, the answer must
            not reveal that such an id exists), ``already_decided``, ``expired`` (the
            approval timed out first, or its ``expires_at`` has passed: it is denied
            ``timeout`` now, SPEC A4). ``not_yours`` is never answered.
        """
        approval = self.pending.get(approval_id)
        if approval is None:
            return self._refusal(session_id, approval_id)
        if approval.session_id != session_id or approval.user != user:
            return NotAcceptedReason.UNKNOWN
        if (self._clock() if at is None else at) >= approval.expires_at:
            # SPEC A4: the deadline is the expires_at tool_start announced, on this clock;
            # the timer runs on the loop's clock (and after a hand-off, SPEC N6, on
            # another node's), so it may not have fired yet.
            self.settle(approval_id, Resolution.DENIED, ResolutionReason.TIMEOUT)
            return NotAcceptedReason.EXPIRED
        resolution = Resolution.DENIED if decision is Decision.DENY else Resolution.ALLOWED
        always = decision is Decision.ALLOW_ALWAYS
        self.settle(approval_id, resolution, ResolutionReason.USER, always)
        return None

    def _refusal(self, session_id: str, approval_id: str) -> NotAcceptedReason:
        settled = self._settled.get(approval_id)
        if settled is None:
            return NotAcceptedReason.UNKNOWN
        owner, outcome = settled
        if owner != session_id:
            return NotAcceptedReason.UNKNOWN
        if outcome.reason is ResolutionReason.TIMEOUT:
            return NotAcceptedReason.EXPIRED
        return NotAcceptedReason.ALREADY_DECIDED

    def settle(
        self,
        approval_id: str,
        resolution: Resolution,
        reason: ResolutionReason,
        always: bool = False,
    ) -> bool:
        """Settle a pending approval; the first settlement wins (SPEC A3).

        Returns:
            ``True`` if this call settled it, ``False`` if it was already settled.
        """
        approval = self.pending.pop(approval_id, None)
        if approval is None:
            return False
        if approval.timer is not None:
            approval.timer.cancel()
        outcome = Settlement(resolution, reason, always, self._clock())
        self._settled[approval_id] = (approval.session_id, outcome)
        while len(self._settled) > SETTLED_MEMORY:
            self._settled.popitem(last=False)
        approval.outcome = outcome
        approval.decided.set()
        return True

    def settle_session(self, session_id: str, reason: ResolutionReason) -> None:
        """Deny every pending approval of a session that ended (SPEC A4)."""
        for approval_id in [
            a.approval_id for a in self.pending.values() if a.session_id == session_id
        ]:
            self.settle(approval_id, Resolution.DENIED, reason)
