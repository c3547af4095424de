"""The invocation pipeline, in SPEC order I1-I14: a thin runner over its parts.

:meth:`Pipeline.accept` admits an ``invoke`` (:class:`~gateway.admission.Admission`:
limits, idempotency) and starts the call as a task; :meth:`Pipeline.run` is that task,
walking the steps in order, each step a part with its own module:

    I13 stale catalog -> I1 unknown tool -> I2 gates -> I3 wrong route -> I4 params
        (:class:`~gateway.admission.CallChecks`)
    -> I5 context -> I6 pre hooks (:meth:`~gateway.execution.Execution.prepare`)
    -> I7 approval (:class:`~gateway.approval_gate.ApprovalGate`)
    -> A7 re-check -> I8/I9/I14 execute -> I10 post hooks
        (:meth:`~gateway.execution.Execution.execute`)
    -> terminal reply -> I11 audit -> I12 record (:class:`~gateway.call_end.CallEnd`)

Every path ends in exactly one terminal event (``result``, ``dispatched`` or
``call.error``), emitted through :meth:`CallEnd.finish <gateway.call_end.CallEnd.finish>`,
which also records it for idempotent re-sends (SPEC I12) and writes the audit record
(SPEC I11).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from gateway.admission import Admission, CallChecks
from gateway.approval_gate import ApprovalGate
from gateway.approvals import Approval
from gateway.call_end import PASS_THROUGH, Call, CallEnd
from gateway.execution import Execution
from gateway.ledger import CallLedger
from gateway.session import Session
from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.outcomes import CallOutcome

__all__ = ["Call", "Pipeline"]

logger = logging.getLogger("gateway.pipeline")

STOPPED: Final = "the server stopped before this call started; it did not run"
"""The ``unavailable`` message of a call a drain ended before its handler started (SPEC
J6: one that never started is never reported as cut off while it ran)."""


class Pipeline:
    """Runs ``invoke`` messages (SPEC I1-I14); one per server.

    Args:
        ledger: the principals' call ids across sessions (SPEC I15).
        admission: the synchronous refusals (SPEC E2, I12, I15).
        checks: SPEC I13, I1-I4.
        gate: ``tool_start`` and the approval wait (SPEC I7, A1-A6).
        execution: context, hooks and the handler (SPEC I5, I6, I8-I10, I14, A7).
        end: the one exit of every call (SPEC I11, I12, I16).
    """

    def __init__(
        self,
        ledger: CallLedger,
        admission: Admission,
        checks: CallChecks,
        gate: ApprovalGate,
        execution: Execution,
        end: CallEnd,
    ) -> None:
        self.ledger = ledger
        self.admission = admission
        self.checks = checks
        self.gate = gate
        self.execution = execution
        self.end = end
        self._call_state: dict[tuple[str, str], Call] = {}

    def accept(self, session: Session, msg: m.Invoke) -> None:
        """Admit an ``invoke`` and start it, or refuse it at once (SPEC E2, I12, I15);
        see :meth:`Admission.admit <gateway.admission.Admission.admit>`."""
        call = self.admission.admit(session, msg)
        if call is None:
            return
        self.track(call, lambda: self._steps(call, msg.catalog_version))

    def track(self, call: Call, steps: Callable[[], Awaitable[None]]) -> None:
        """Run ``steps()`` (the call's pipeline, or what is left of it) as the call's task,
        through :meth:`run`, tracked per session until it ends (SPEC I8, F33). :meth:`run`
        frees the call's per-session state when it ends; :meth:`cancel` does for a task
        cancelled before its first step, so no done callback (a loop turn a call, issue
        13) is needed."""
        session = call.session
        task = asyncio.get_running_loop().create_task(self.run(call, steps))
        session.inflight[call.call_id] = task
        self._call_state[(session.id, call.call_id)] = call

    def tracked_calls(self) -> int:
        """Calls this pipeline tracks now, over all sessions (case F33)."""
        return len(self._call_state)

    def cancel(self, session: Session, call_id: str) -> bool:
        """Cancel a running or approval-pending call (SPEC I8, A4, F11).

        A task cancelled before its first step never runs :meth:`run` (no ``except``, no
        ``finally``): an ``invoke`` and its ``call.cancel`` or ``bye`` read together. The
        call then ends ``cancelled`` here, at once (SPEC I8, I16), and its per-session
        state is freed (F33)."""
        task = session.inflight.get(call_id)
        call = self._call_state.get((session.id, call_id))
        if task is None or call is None:
            return False
        if not call.begun:
            del session.inflight[call_id]
            del self._call_state[(session.id, call_id)]
            task.cancel()
            self._cancelled(call)
            return True
        if call.approval_id is not None:
            # SPEC A4: settled now, so a confirm in the same batch of frames finds it
            # decided (cancelled) instead of allowing a call that is being cancelled.
            self.gate.approvals.settle(
                call.approval_id, m.Resolution.DENIED, m.ResolutionReason.CANCELLED
            )
        task.cancel()
        return True

    def running(self, session_id: str, call_id: str) -> bool:
        """Whether the call runs (or waits for approval) here (SPEC N3: routing)."""
        return (session_id, call_id) in self._call_state

    def cancel_by_id(self, session_id: str, call_id: str) -> bool:
        """:meth:`cancel` for a call known by ids only: a ``call.cancel`` another node
        received for a session that moved there (SPEC N3, I8)."""
        call = self._call_state.get((session_id, call_id))
        return call is not None and self.cancel(call.session, call_id)

    def in_flight(self) -> list[Call]:
        """Every call in flight here, of live, parked and expired sessions."""
        return list(self._call_state.values())

    def tasks(self) -> list[asyncio.Task[None]]:
        """The task of every call in flight, of live, parked and expired sessions."""
        found = (c.session.inflight.get(c.call_id) for c in self._call_state.values())
        return [task for task in found if task is not None]

    def end_session(self, session: Session) -> None:
        """The session ended (SPEC I8, I15): ``bye`` cancels every call of it. A parked
        session whose resume window ran out cancels only calls whose handler has not
        started; a running handler goes on to its end, and its terminal event is kept
        in the ledger for a re-send from the principal's next session (case F16)."""
        self.ledger.forget(session)
        expired = session.link is None
        for call_id in list(session.inflight):
            call = self._call_state.get((session.id, call_id))
            if not (expired and call is not None and call.executing):
                self.cancel(session, call_id)

    async def settle_plain(self, deadline: float) -> int:
        """A drain of a single node (SPEC S4, J6, D1): wait, until ``deadline``
        (event-loop time), for every call whose plain handler runs in a worker thread,
        or gets one meanwhile, to end: not only for the thread to be free, but for the
        call's task to have staged its terminal event, so that the drain sends it before
        the ``reconnect`` hint. Calls whose handler is a coroutine are not waited for
        (as before: they run on until the drain ends). Returns how many still run."""
        loop = asyncio.get_running_loop()
        lane = self.execution.pool
        told = False
        while True:
            busy = [
                task
                for call in self._call_state.values()
                if call.executing and _plain(call)
                if (task := call.session.inflight.get(call.call_id)) is not None
            ]
            remaining = deadline - loop.time()
            if not (busy or lane.live()) or remaining <= 0:
                return len(busy)
            if not told:
                told = True
                logger.info("drain: waiting up to %.1f s for running call handlers", remaining)
            # A thread freed (or granted to a call that then starts), or a call's end.
            changed = asyncio.ensure_future(lane.changed())
            try:
                await asyncio.wait(
                    [*busy, changed], timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                changed.cancel()

    async def stop_unstarted(self) -> int:
        """A drain (SPEC S4, J6): end every call here whose handler has not started
        (waiting for a worker thread, a commit, a pre-hook; one waiting for approval
        the drain hands off first) ``unavailable`` with :data:`STOPPED`, staged before
        the store closes, so that no restart reports it as cut off while it ran
        (SPEC I15: a re-send gets that outcome). Calls whose handler runs are left to
        the drain. Returns how many were stopped, once each has ended."""
        calls = [c for c in self._call_state.values() if not (c.executing or c.handed_off)]
        tasks = [t for c in calls if (t := c.session.inflight.get(c.call_id)) is not None]
        for call in calls:
            call.stopped = True
            self.cancel(call.session, call.call_id)
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(calls)

    def _cancelled(self, call: Call) -> None:
        """End a cancelled call (SPEC I8): ``cancelled``, or ``unavailable``
        :data:`STOPPED` when a drain stopped it before its handler started (J6)."""
        if call.stopped and not call.executing:
            self.end.error(call, ErrorCode.UNAVAILABLE, STOPPED, CallOutcome.UNAVAILABLE)
            return
        self.end.error(call, ErrorCode.CANCELLED, "the call was cancelled", CallOutcome.CANCELLED)

    async def run(self, call: Call, steps: Callable[[], Awaitable[None]]) -> None:
        """Run one call's ``steps()`` to its single terminal event (SPEC I1-I14, I16)."""
        session = call.session
        call.begun = True
        try:
            await steps()
        except asyncio.CancelledError:
            # SPEC I8: the call ends ``cancelled`` and the cancellation propagates; a call
            # handed to another node (SPEC N6) ends there, not here.
            if not call.handed_off:
                self._cancelled(call)
            raise
        except PASS_THROUGH:
            raise
        except BaseException:  # SPEC I16: the call still ends in one terminal reply
            logger.exception("internal error in call %s of session %s", call.call_id, session.id)
            self.end.error(
                call, ErrorCode.HANDLER_ERROR, "internal error", CallOutcome.HANDLER_ERROR
            )
        finally:
            session.inflight.pop(call.call_id, None)
            self._call_state.pop((session.id, call.call_id), None)

    async def _steps(self, call: Call, catalog_version: str | None) -> None:
        """The SPEC I steps in order; each part ends the call itself when it stops it."""
        if self.checks.stale(call, catalog_version):
            return
        tool = self.checks.lookup(call)
        if tool is None:
            return
        call.tool = tool
        if not self.checks.admissible(call, tool):
            return
        prepared = await self.execution.prepare(call, tool)
        if prepared is None:
            return
        if not (self.gate.ungated(call, tool) or await self.gate.approved(call, tool)):
            return
        await self.execution.execute(call, tool, *prepared)

    async def resume(self, call: Call, approval: Approval) -> None:
        """The steps left to a call adopted while it waited for ``approval`` (SPEC N6,
        :mod:`gateway.handoff`): its checks and pre-hooks passed on the node that took it
        in; the wait, the A7 re-check and the handler run here. A tool that left the
        session's catalog since resolves the approval ``cancelled`` (A6) and ends the
        call ``unknown_tool`` (I1)."""
        tool = self.checks.visible(call)
        if tool is None:
            approvals = self.gate.approvals
            approvals.settle(
                approval.approval_id, m.Resolution.DENIED, m.ResolutionReason.CANCELLED
            )
            assert approval.outcome is not None
            self.gate.resolved(call, approval.approval_id, call.tool_name, approval.outcome)
            self.checks.lookup(call)
            return
        call.tool = tool
        prepared = self.execution.context(call, tool)
        if not await self.gate.decided(call, tool, approval):
            return
        await self.execution.execute(call, tool, *prepared)


def _plain(call: Call) -> bool:
    """Whether ``call``'s handler is a plain function (it runs in a worker thread)."""
    tool = call.tool
    return tool is not None and tool.func is not None and not inspect.iscoroutinefunction(tool.func)
