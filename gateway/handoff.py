"""Calls waiting for approval move with their sessions when a node drains (SPEC N6).

A call whose approval is pending has not run: nothing of it happened but its
``tool_start``. When a node drains as one of several (SPEC N6), its clients resume on
other nodes at once. A call waiting for approval is *handed off*, at once, instead of
waiting out the drain's grace or being cancelled:
:meth:`Handoff.release` stores, in the call's row, what the rest of its pipeline needs
(tool, parameters, approval id, expiry: the ``handoff`` note), lets the approval go
unsettled and ends the call's task here without a terminal event. The node that claims
the drained node's work (SPEC N4), or the next start when no node is left, calls
:meth:`Handoff.adopt`: the same approval id is pending again with the same expiry, the
call id is running again in the principal's ledger (SPEC I15) on that node, and the
call resumes at its approval wait (:meth:`gateway.pipeline.Pipeline.resume`: the A7
re-check and the handler run there). The client sees one ``tool_start``, one
``tool.resolved`` and one terminal event, as if nothing moved; a decision it sent in
between waits in ``node_requests`` (N3) for the node that adopts the call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gateway.approval_gate import pending_note
from gateway.call_end import Call
from gateway.ledger import params_hash
from gateway.metrics import Metrics
from gateway.pipeline import Pipeline
from gateway.session import Session
from protocol.codec import encode_json

logger = logging.getLogger("gateway.nodes")

RECHECK_S = 0.05
"""Seconds between looks, in a drain, for calls that reached their approval wait."""


class Handoff:
    """Hands calls pending approval to another node, and adopts them (SPEC N6).

    Args:
        pipeline: this node's calls in flight, its approvals, ledger and catalog.
        metrics: the ``pending_approvals`` gauge.
    """

    def __init__(self, pipeline: Pipeline, metrics: Metrics) -> None:
        self._pipeline = pipeline
        self._metrics = metrics

    async def drain(self, deadline: float) -> int:
        """A node's drain (SPEC N6): hand off the calls waiting for approval, at once and
        as more reach that wait, and let every other call run until ``deadline``
        (event-loop time). Returns the calls still running then (their handlers go on;
        the node that claims this one's work ends them, N4)."""
        loop = asyncio.get_running_loop()
        while True:
            await self.release()
            busy = [task for task in self._pipeline.tasks() if not task.done()]
            remaining = deadline - loop.time()
            if not busy or remaining <= 0:
                return len(busy)
            # A call may reach its approval wait without its task ending: look again soon.
            await asyncio.wait(busy, timeout=min(remaining, RECHECK_S))

    async def release(self) -> int:
        """Hand off every call here whose approval is pending (SPEC N6): its row keeps
        the ``handoff`` note (staged; the caller flushes), its approval is let go
        unsettled, its task ends without a terminal event. Returns how many."""
        pipeline = self._pipeline
        approvals = pipeline.gate.approvals
        moved: list[asyncio.Task[None]] = []
        for call in pipeline.in_flight():
            approval_id = call.approval_id
            task = call.session.inflight.get(call.call_id)
            if approval_id is None or call.tool is None or task is None:
                continue
            approval = approvals.release(approval_id)
            if approval is None:
                continue
            note = {
                "tool": call.tool.name,
                "approval_id": approval_id,
                "expires_at": approval.expires_at,  # SPEC N3: as pending_note
                "handoff": {"params": call.params, "expires_at": approval.expires_at},
            }
            session = call.session
            session.store.stage_handoff(session.id, call.call_id, encode_json(note))
            session.pending_approvals.discard(approval_id)
            self._metrics.pending_approvals.dec()
            call.handed_off = True
            task.cancel()
            moved.append(task)
        await asyncio.gather(*moved, return_exceptions=True)
        self._metrics.handoffs.labels("released").inc(len(moved))
        if moved:
            logger.info(
                "drain: %d call(s) pending approval handed off (to another node, or to the "
                "next start)",
                len(moved),
            )
        return len(moved)

    def adopt(self, session: Session, call_id: str, note: dict[str, Any]) -> bool:
        """Resume here a call another node handed off (``note``: its row's note, with a
        ``handoff`` entry). Returns ``False`` when the note is no hand-off.

        The call's tool is looked up in this node's catalog: one gone since ends the call
        ``unknown_tool`` (SPEC I1) with its approval resolved ``cancelled``.
        """
        handoff = note.get("handoff")
        approval_id = note.get("approval_id")
        if not isinstance(handoff, dict) or not isinstance(approval_id, str):
            return False
        pipeline = self._pipeline
        tool_name = str(note.get("tool", ""))
        params = handoff.get("params")
        params = params if isinstance(params, dict) else {}
        # Call.started is perf_counter time (SPEC I11: the audit's duration, the latency
        # metric): the call's time here counts from its adoption.
        call = Call(session, call_id, tool_name, params, time.perf_counter())
        pipeline.ledger.open(session, call_id, tool_name, params_hash(params))
        approval = pipeline.gate.approvals.restore(
            approval_id,
            session.id,
            session.user,
            call_id,
            tool_name,
            params,
            float(handoff.get("expires_at", 0.0)),
        )
        call.approval_id = approval_id
        session.pending_approvals.add(approval_id)
        session.store.stage_call(session.id, call_id, "running", pending_note(approval))
        self._metrics.pending_approvals.inc()
        if not session.catalog_names:  # a detached copy (SPEC N4) has no view yet
            session.catalog_names = pipeline.checks.catalog.view(session)[2]
        pipeline.track(call, lambda: pipeline.resume(call, approval))
        self._metrics.handoffs.labels("adopted").inc()
        return True
