"""One call on its way through the pipeline, and its one exit (SPEC I11, I12, I15, I16).

:class:`Call` is the state of one ``invoke`` while it runs. :class:`CallEnd` is the only
place a call ends: :meth:`CallEnd.finish` emits the terminal event (``result``,
``dispatched`` or ``call.error``), refuses a second one for the same ``call_id``, records
it for idempotent re-sends, delivers it to sessions attached through the ledger and
writes the audit record. Admission, the approval gate and execution
(:mod:`gateway.admission`, :mod:`gateway.approval_gate`, :mod:`gateway.execution`) all
end calls through it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from catalog.model import ToolDef
from gateway import audit
from gateway.authority import Lapse
from gateway.config import CallsConfig
from gateway.framesize import clip_text, oversize, payload_budget, too_deep
from gateway.ledger import CallLedger, deliver
from gateway.metrics import Metrics
from gateway.session import Session
from protocol import messages as m
from protocol.codec import (
    SERVER_MAX_DEPTH,
    encode_plain_json,
    encode_result,
    json_problem,
    non_finite,
    non_finite_in,
)
from protocol.errors import ErrorCode
from protocol.outcomes import CallOutcome

logger = logging.getLogger("gateway.pipeline")

_RESULT_FIELDS = frozenset({"result", "declined", "replaced"})
"""The fields :meth:`CallEnd.finish` may be given with a ``result`` it encodes itself."""

PASS_THROUGH = (asyncio.CancelledError, KeyboardInterrupt, SystemExit)
"""What a handler may raise that does not end its call ``handler_error`` (SPEC I8, I16):
cancellation propagates, and an exit request stops the process."""


@dataclass(slots=True)
class Call:
    """One invocation on its way through the pipeline."""

    session: Session
    call_id: str
    tool_name: str
    params: dict[str, Any]
    started: float
    """``time.perf_counter()`` when it was admitted (or adopted, SPEC N6): the audit
    record's ``duration_ms`` and the latency metric count from it (SPEC I11, O2)."""
    tool: ToolDef | None = None
    approval: dict[str, Any] | None = None
    job_id: str | None = None
    approval_id: str | None = None
    """The approval this call waits on, while it waits."""
    begun: bool = False
    """Its task took its first step (:meth:`gateway.pipeline.Pipeline.run` runs)."""
    executing: bool = False
    """Its handler started (the ``on_start`` of :func:`gateway.execute.run_handler`, after
    every wait; after a wait for a worker thread, once its start is durable,
    :class:`gateway.call_start.CallStart`): an expiring session no longer cancels it
    (SPEC I15, I8)."""
    unstarted: bool = False
    """The store is told it has not started: it waited for a pre-hook or a worker thread
    (:func:`gateway.call_start.mark_unstarted`, SPEC J6); its start must be made
    durable before its handler runs (:class:`gateway.call_start.CallStart`)."""
    stopped: bool = False
    """A drain stopped it before its handler started (SPEC S4, J6): it ends
    ``unavailable``, saying it did not run (:meth:`gateway.pipeline.Pipeline.stop_unstarted`)."""
    handed_off: bool = False
    """A draining node handed it, still waiting for approval, to another node (SPEC
    N6): its task ends here without a terminal event; the other node sends it."""
    frame_budget: int | None = None
    """:meth:`CallEnd.budget`, once worked out."""
    in_ledger: bool = True
    """Its key is open in the principal's ledger (SPEC I15); ``False`` for a call of a
    tool outside its session's catalog (SPEC C3): it ends ``unknown_tool`` and its end
    is recorded for its session only, never for the principal."""
    params_size: int | None = None
    """Bytes of ``params`` as JSON when admission knows them (the I15 hash is made of
    the same length); ``None``: not known, encoded when asked. Only for checks made
    before the handler runs: a handler may change its params."""


class CallEnd:
    """The one exit of every call (SPEC I11, I12, I15, I16, E2); one per server.

    Args:
        ledger: the principals' call ids across sessions (SPEC I15): it learns each
            terminal event and names the sessions waiting on it.
        metrics: the server's metrics (one ``invocation`` per call).
        calls: call settings (``audit_param_bytes``).
        max_frame: the announced ``max_message_bytes``: a result and an error text must
            fit their frame (SPEC E2, :mod:`gateway.framesize`); ``None``: no bound.
    """

    def __init__(
        self, ledger: CallLedger, metrics: Metrics, calls: CallsConfig, max_frame: int | None
    ) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.calls = calls
        self.max_frame = max_frame

    def too_big(self, call: Call, value: Any, what: str, size: int | None = None) -> str | None:
        """SPEC E2: why ``value`` (params or result) would not fit in this call's
        ``tool_start``/``result`` frame, e.g. ``params are 70000 bytes as JSON; at most
        65000 fit``, or ``None`` when it fits (or there is no value or no bound).

        ``size``: the bytes of ``value``'s JSON when the caller knows them (admission
        does, for the params); ``None``: encoded here."""
        if self.max_frame is None or value is None:
            return None
        budget = self.budget(call)
        if size is None:
            size = oversize(value, budget)
        elif size <= budget:
            size = None
        return None if size is None else f"{what} {size} bytes as JSON; at most {budget} fit"

    def budget(self, call: Call) -> int:
        """SPEC E2: the largest params or result, in bytes of JSON, that fit this call's
        frame (:func:`gateway.framesize.payload_budget`), worked out once per call."""
        if call.frame_budget is None:
            assert self.max_frame is not None
            call.frame_budget = payload_budget(self.max_frame, call.call_id, call.tool_name)
        return call.frame_budget

    def error(
        self, call: Call, code: ErrorCode, message: str, outcome: CallOutcome, **fields: Any
    ) -> None:
        """End ``call`` with ``call.error`` ``code`` and ``message`` (clipped to fit)."""
        message = self.clip(call, message)
        self.finish(call, outcome, m.CallError, code=code, message=message, **fields)

    def lapsed(self, call: Call, lapse: Lapse) -> None:
        """SPEC A7, S6: a gate failed after a wait; the call ends with its typed denial."""
        self.error(call, lapse.code, lapse.message, CallOutcome(lapse.code.value))

    def clip(self, call: Call, message: str) -> str:
        """SPEC E2: an error text (a handler's exception, a ToolFailure) cut so that its
        ``call.error`` frame fits the announced ``max_message_bytes``."""
        if self.max_frame is None:
            return message
        return clip_text(message, self.budget(call))

    def finish(
        self,
        call: Call,
        outcome: CallOutcome,
        cls: type[m.Result | m.Dispatched | m.CallError],
        **fields: Any,
    ) -> None:
        """Emit the call's one terminal event, record it in the session and the ledger,
        deliver it to attached sessions, audit it (SPEC I11, I12, I15, I16)."""
        session = call.session
        if call.call_id in session.done_calls:
            return
        session.done_calls[call.call_id] = None  # before emit: a second finish is refused
        try:
            body = self._quick_result(call, fields) if cls is m.Result else None
            if body is None:
                self._check_result(call, fields.get("result"))
                body = session.emit(cls(call_id=call.call_id, tool=call.tool_name, **fields))
        except (TypeError, ValueError) as exc:
            # SPEC I16: emit encodes before it stages, so a value the codec refuses never
            # reaches the log; the call still ends, naming the problem.
            problem = json_problem(fields.get("result")) or str(exc)
            logger.info("%s returned a value that cannot be sent: %s", call.tool_name, problem)
            outcome, fields = CallOutcome.HANDLER_ERROR, {"code": ErrorCode.HANDLER_ERROR}
            fields["message"] = self.clip(call, f"the handler's value cannot be sent: {problem}")
            body = session.emit(m.CallError(call_id=call.call_id, tool=call.tool_name, **fields))
        session.call_done(call.call_id, body)
        if call.in_ledger:  # SPEC C3: else another session's call may hold the key
            for waiter in self.ledger.finish(session, call.call_id, body):
                deliver(waiter, call.call_id, body)
        elapsed = time.perf_counter() - call.started
        self.metrics.invocation(
            outcome.value, call.tool.mode.value if call.tool else "none", elapsed
        )
        if audit.enabled():
            self._audit(call, outcome, elapsed, fields.get("code"))

    def _quick_result(self, call: Call, fields: dict[str, Any]) -> bytes | None:
        """Emit a ``result`` whose value is a plain object that passes every check, from
        its JSON encoded once (SPEC E2, I16, D1); the event's bytes are those
        :class:`protocol.messages.Result` would give. ``None`` for anything else (a value
        that is not a ``dict``, that holds a dataclass or cannot be encoded, is too large
        or deep or holds a non-finite number, an unexpected field): :meth:`finish` then
        takes the general path, which names the problem. Nothing is emitted then."""
        value = fields.get("result")
        if type(value) is not dict or not _RESULT_FIELDS.issuperset(fields):
            return None
        declined = fields.get("declined", False)
        replaced = fields.get("replaced", False)
        if type(declined) is not bool or type(replaced) is not bool:
            return None
        try:
            raw = encode_plain_json(value)
        except TypeError:  # a dataclass, or a value the general path names the problem of
            return None
        if self.max_frame is not None and len(raw) > self.budget(call):
            return None
        levels = SERVER_MAX_DEPTH - 1
        # Each level opens a bracket; fewer brackets than levels cannot nest too deep.
        if raw.count(b"{") + raw.count(b"[") > levels and too_deep(value, levels):
            return None
        if non_finite_in(value, raw):
            return None
        call_id, tool = call.call_id, call.tool_name
        return call.session.emit_encoded(
            lambda seq: encode_result(seq, call_id, tool, raw, declined, replaced)
        )

    def _check_result(self, call: Call, value: Any) -> None:
        """SPEC E2, I16: raise :class:`ValueError` naming why ``value`` (a result, or
        ``None``) cannot be sent."""
        too_big = self.too_big(call, value, "result is")
        if too_big is not None:
            # SPEC E2: a result frame must fit the max_message_bytes clients were told.
            raise ValueError(too_big)
        if too_deep(value, SERVER_MAX_DEPTH - 1):
            # SPEC I16: a client drops a frame nested past SERVER_MAX_DEPTH levels, and
            # with it the call's one reply.
            raise ValueError(f"result is nested deeper than {SERVER_MAX_DEPTH - 1} levels")
        if non_finite(value):
            # SPEC I16: orjson would write NaN/Infinity as null and change the data;
            # json_problem names where it is.
            raise ValueError("result holds a number JSON cannot carry")

    def _audit(self, call: Call, outcome: CallOutcome, elapsed: float, code: Any) -> None:
        """SPEC I11: one audit record per call, sensitive params redacted."""
        session = call.session
        sensitive = call.tool.sensitive if call.tool else ()
        # Written once the call's end is durable: a process killed before that commit
        # (or a drain that closed the store with the call still running) leaves the
        # record to the restart that ends the call (gateway.recovery), not two.
        session.outbox.audit(
            audit_fields(
                (session.profile.name, session.user, session.id),
                call.tool_name,
                call.call_id,
                outcome.value,
                code,
                duration_ms=round(elapsed * 1000, 3),
                params=audit.redact(call.params, sensitive, self.calls.audit_param_bytes),
                approval=call.approval,
                job_id=call.job_id,
            )
        )


def audit_fields(
    who: tuple[str | None, str, str | None],
    tool: str,
    call_id: str,
    outcome: str,
    code: Any,
    *,
    duration_ms: float | None,
    params: Any,
    approval: dict[str, Any] | None,
    job_id: str | None,
) -> dict[str, Any]:
    """The fields of one call's audit record (SPEC I11), JSON values: ``tool``,
    ``outcome`` (a :class:`~protocol.outcomes.CallOutcome` value), ``profile``,
    ``user``, ``session`` (``who``: the session's profile name, user and id; profile
    and id are ``None`` for a call whose session a restart no longer had), ``call_id``,
    ``duration_ms`` (milliseconds, ``None`` when unknown), ``params`` (redacted,
    :func:`gateway.audit.redact`), ``approval``, ``job_id`` and ``code`` (the error
    code, or ``None``)."""
    profile, user, session = who
    return {
        "tool": tool,
        "outcome": outcome,
        "profile": profile,
        "user": user,
        "session": session,
        "call_id": call_id,
        "duration_ms": duration_ms,
        "params": params,
        "approval": approval,
        "job_id": job_id,
        "code": code,
    }
