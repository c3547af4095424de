"""Admission of an ``invoke``: the refusals before a call starts, and its first checks.

:class:`Admission` runs synchronously when the frame arrives (SPEC E2, I12, I15, D6):
duplicate in-flight ids, an unavailable store, a ``call_id`` already finished or used in
another session, the in-flight and rate limits. It refuses with an ``error`` reply (the
call never started) or hands back a :class:`~gateway.call_end.Call` to run.

:class:`CallChecks` runs first inside the call's task (SPEC I13, I1-I4): a stale
catalog, an unknown tool, the gates, the route and the parameters. A failed check ends
the call through :class:`~gateway.call_end.CallEnd`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from catalog.exports import suggest
from catalog.model import Mode, ToolDef
from catalog.params import Violation
from catalog.visibility import Scope, check_access
from gateway.call_end import Call, CallEnd
from gateway.config import LimitsConfig
from gateway.ledger import CallLedger, Check, Verdict, deliver
from gateway.metrics import Metrics
from gateway.session import Session
from protocol import messages as m
from protocol.codec import encode_json
from protocol.errors import ErrorCode
from protocol.outcomes import CallOutcome

if TYPE_CHECKING:
    from gateway.catalog_state import CatalogState

MAX_VIOLATIONS = 50
"""Violations listed in one ``invalid_params`` reply (SPEC I4); the message counts all."""
MAX_VIOLATION_CHARS = 300
"""Longest violation message sent; longer ones (a list of 2,000 unknown keys) are cut."""


def _clip(text: str) -> str:
    if len(text) <= MAX_VIOLATION_CHARS:
        return text
    return text[: MAX_VIOLATION_CHARS - 1] + "…"


class Admission:
    """The synchronous refusals of an ``invoke`` (SPEC E2, I12, I15, D6); one per server.

    Args:
        ledger: the principals' call ids across sessions (SPEC I15).
        limits: per-session limits (``max_inflight_calls``; the rate is the session's
            token bucket, SPEC E2).
        metrics: the server's metrics (``errors`` by code).
    """

    def __init__(self, ledger: CallLedger, limits: LimitsConfig, metrics: Metrics) -> None:
        self.ledger = ledger
        self.limits = limits
        self.metrics = metrics

    def admit(self, session: Session, msg: m.Invoke) -> Call | None:
        """Admit an ``invoke`` or refuse it at once (SPEC E2, I12, I15, C3).

        Refusals for limits and duplicate in-flight ids are ``error`` replies, not call
        outcomes: the call never started, so the client may retry the same ``call_id``.
        Every ``invoke`` past a duplicate in-flight id and a store that cannot commit
        takes a token of the session's rate (SPEC E2), a re-send, an attach and one
        then refused ``too_many_inflight`` too. A ``call_id`` that already finished
        gets its recorded terminal event again. A call of a tool absent from the
        session's catalog is admitted without asking the principal's ledger (SPEC C3:
        that tool does not exist for it; it ends ``unknown_tool`` in
        :meth:`CallChecks.lookup`). A ``call_id`` the principal used in another session
        (SPEC I15) attaches to that call or gets its recorded outcome; with another
        tool or other parameters it is refused ``call_id_conflict``. Either way the
        tool does not run again.

        Returns:
            The admitted call, staged ``running`` and opened in the ledger (a call of a
            tool outside the catalog: neither); the caller starts it. ``None`` when it
            was refused or answered here.
        """
        call_id = msg.call_id
        if call_id in session.inflight:
            self._refuse(session, msg, ErrorCode.DUPLICATE_CALL, "this call_id is still running")
            return None
        if session.outbox.unavailable:
            # SPEC D6: the store cannot commit; start nothing whose outcome could not be
            # stored. Nothing ran, so the client may re-send the same call_id later.
            text = "the store cannot commit right now; try again later"
            self._refuse(session, msg, ErrorCode.UNAVAILABLE, text)
            return None
        if not session.bucket.take(time.monotonic()):
            # SPEC E2: before the re-send and ledger paths, each of which costs a store
            # read (and a re-send a commit): a flood of them is bounded like new calls.
            self._refuse(session, msg, ErrorCode.RATE_LIMITED, "invoke rate limit reached")
            return None
        params = dict(msg.params or {})
        if call_id in session.done_calls:
            conflict = self.ledger.conflicts(session, call_id, msg.tool, params)
            if conflict is None and msg.tool not in session.catalog_names:
                # SPEC I12, C3: a call of a tool outside the catalog is recorded for its
                # session only (no ledger row): its re-send gets that record again.
                conflict = False
            if conflict is not None:
                if conflict:
                    self._known(session, msg, Verdict.CONFLICT, None)
                else:
                    self._resend(session, call_id)
                return None
            # SPEC I15: past its window the id is new again, the session's record too.
            del session.done_calls[call_id]
        if msg.tool not in session.catalog_names:
            # SPEC C3, I1 before I15: the principal's record of this call id (another
            # session's call of a tool this one cannot see) is neither delivered nor
            # attached to, nor is the key taken: the call ends unknown_tool (lookup).
            return self._start(session, msg, params, None)
        check = self.ledger.check(session, call_id, msg.tool, params)
        if check.verdict is Verdict.RECORDED and self._own_still_running(session, call_id):
            # SPEC I12, N3: this session's own call ended on another node, and its
            # terminal event is on its way here (the inbox); delivering the ledger's
            # copy too would end the call twice under two seqs.
            self._refuse(session, msg, ErrorCode.DUPLICATE_CALL, "this call_id is still running")
            return None
        if check.verdict is Verdict.ELSEWHERE:
            # SPEC I15, N3: the call runs on another node. This session's own call (it
            # moved here) gets its terminal event through the inbox; another session of
            # the principal waits for the recorded outcome, as if attached.
            if self._own_still_running(session, call_id) or not self.ledger.elsewhere.attach(
                session, call_id
            ):
                self._refuse(
                    session, msg, ErrorCode.DUPLICATE_CALL, "this call_id is still running"
                )
            return None
        if check.verdict is not Verdict.NEW:
            self._known(session, msg, check.verdict, check.outcome)
            return None
        return self._start(session, msg, params, check)

    def _start(
        self, session: Session, msg: m.Invoke, params: dict[str, Any], check: Check | None
    ) -> Call | None:
        """The call to run, past the in-flight limit (SPEC E2); ``check``: the ledger's
        ``NEW``, whose key it opens; ``None``: a tool outside the session's catalog,
        kept out of the ledger (:attr:`Call.in_ledger`, SPEC C3)."""
        if len(session.inflight) + session.promoted >= self.limits.max_inflight_calls:
            self._refuse(session, msg, ErrorCode.TOO_MANY_INFLIGHT, "too many calls in flight")
            return None
        call_id = msg.call_id
        call = Call(session, call_id, msg.tool, params, time.perf_counter())
        if check is None:
            call.in_ledger = False
            return call
        call.params_size = check.params_size
        session.store.stage_call(session.id, call_id, "running", encode_json({"tool": msg.tool}))
        self.ledger.open(session, call_id, msg.tool, check.params_hash, journal=True)
        return call

    def _refuse(self, session: Session, msg: m.Invoke, code: ErrorCode, text: str) -> None:
        self.metrics.errors.labels(code.value).inc()
        details = {"call_id": msg.call_id}
        session.reply(m.Error(id=msg.id, code=code, message=text, details=details))

    def _known(
        self, session: Session, msg: m.Invoke, verdict: Verdict, outcome: bytes | None
    ) -> None:
        """SPEC I15: a call id the principal used before, seen from this session."""
        if verdict is Verdict.CONFLICT:
            text = "this call_id was used for another tool or other parameters"
            self._refuse(session, msg, ErrorCode.CALL_ID_CONFLICT, text)
        elif verdict is Verdict.DUPLICATE:
            self._refuse(session, msg, ErrorCode.DUPLICATE_CALL, "this call_id is still running")
        elif verdict is Verdict.RECORDED and outcome is not None:
            deliver(session, msg.call_id, outcome)
        # ATTACHED: the running call's terminal event comes here when it ends.

    @staticmethod
    def _own_still_running(session: Session, call_id: str) -> bool:
        """Whether the session's own record of ``call_id`` says it still runs."""
        recorded = session.store.call(session.id, call_id)
        return recorded is not None and recorded[0] != "done"

    def _resend(self, session: Session, call_id: str) -> None:
        # The terminal event may still be staged (finished this tick): commit it first,
        # or the store has no body to re-send and the client would get nothing (I12).
        session.outbox.flush()
        recorded = session.store.call(session.id, call_id)
        # Only a terminal event is re-sent, never a running call's recovery note (I16).
        if recorded is not None and recorded[0] == "done" and recorded[1] is not None:
            session.emit_raw(recorded[1])


class CallChecks:
    """The first steps of a running call: SPEC I13, I1, I2, I3, I4; one per server.

    Args:
        catalog: the server's current catalog state (swapped on hot reload).
        end: the one exit; a failed check ends the call there.
    """

    def __init__(self, catalog: CatalogState, end: CallEnd) -> None:
        self.catalog = catalog
        self.end = end

    def stale(self, call: Call, catalog_version: str | None) -> bool:
        """SPEC I13: ``True`` when the client called from another catalog version; the
        call is refused and the current catalog pushed."""
        session = call.session
        if catalog_version is None or catalog_version == session.catalog_version:
            return False
        self.end.error(
            call,
            ErrorCode.STALE_CATALOG,
            "the catalog changed; use the new one",
            CallOutcome.STALE_CATALOG,
            catalog_version=session.catalog_version,
        )
        self.catalog.push(session, m.CatalogReason.STALE, force=True)
        return True

    def lookup(self, call: Call) -> ToolDef | None:
        """SPEC I1, C3: a tool absent from the session's catalog does not exist for it;
        the call ends ``unknown_tool``. So does a call admitted while it was absent
        (:attr:`Call.in_ledger` ``False``), even if the catalog shows it by now: it was
        never opened in the ledger, so it must not run (SPEC I15)."""
        tool = self.visible(call) if call.in_ledger else None
        if tool is not None:
            return tool
        visible = call.session.catalog_names
        guidance = self.catalog.current.guidance.get(call.tool_name)
        self.end.error(
            call,
            ErrorCode.UNKNOWN_TOOL,
            f"no tool named {call.tool_name!r}",
            CallOutcome.UNKNOWN_TOOL,
            suggestions=suggest(call.tool_name, visible),
            guidance=guidance,
        )
        return None

    def visible(self, call: Call) -> ToolDef | None:
        """The call's tool when the session's catalog shows it now (SPEC I1, C3)."""
        tool = self.catalog.current.tools.get(call.tool_name)
        return tool if tool is not None and tool.name in call.session.catalog_names else None

    def admissible(self, call: Call, tool: ToolDef) -> bool:
        """SPEC I2 (gates re-checked now), I3 (route), I4 (parameters)."""
        session = call.session
        denial = check_access(
            tool,
            session.profile,
            Scope(session.context, session.origin),
            self.catalog.current.safe_default,
        )
        if denial is not None:
            code = ErrorCode(denial.value)
            text = f"{tool.name} is not available: {denial.value}"
            self.end.error(call, code, text, CallOutcome(denial.value))
            return False
        if tool.mode is Mode.CLIENT:
            self.end.error(
                call,
                ErrorCode.WRONG_ROUTE,
                f"{tool.name} runs in the client, not on the server",
                CallOutcome.WRONG_ROUTE,
            )
            return False
        return self._valid(call, tool)

    def _valid(self, call: Call, tool: ToolDef) -> bool:
        """SPEC I4, E2: the params match the tool's schema and fit the frame."""
        violations = self.catalog.validators[tool.name].validate(call.params)
        size = call.params_size
        too_big = None if violations else self.end.too_big(call, call.params, "params are", size)
        if too_big is not None:
            # SPEC E2: tool_start echoes the params; they must fit the announced frame size.
            violations = [Violation("", too_big, "maxBytes")]
        if not violations:
            return True
        # Every violation up to a bound: a hostile call with thousands of bad keys gets a
        # reply of bounded size; the message still gives the total.
        wire = [
            m.Violation(pointer=v.pointer, message=_clip(v.message), keyword=v.keyword)
            for v in violations[:MAX_VIOLATIONS]
        ]
        shown = "" if len(violations) <= MAX_VIOLATIONS else f", first {MAX_VIOLATIONS} listed"
        self.end.error(
            call,
            ErrorCode.INVALID_PARAMS,
            f"{len(violations)} parameter problem(s){shown}",
            CallOutcome.INVALID_PARAMS,
            violations=wire,
        )
        return False
