"""Requests routed to the node where a call, approval or job runs (SPEC N3, A3, I8, J3,
M3).

A session may move to node B while its call waits for approval on node A, or for the
answer to a mounted MCP server's question (M3), or its job runs there. ``tool.confirm``,
``elicit.answer``, ``call.cancel`` and ``job.cancel`` sent to B then name something B
does not hold. B writes a row to ``node_requests`` and notifies every node
(:meth:`NodeRequests.route`); the node that holds the approval, call or job deletes the
row (``DELETE ... RETURNING``: exactly one node acts on it) and applies it as if its own
socket had sent it (:meth:`NodeRequests.sweep`). What that produces (``tool.resolved``,
the call's result, ``job.cancelled``) reaches the client on B through the inbox
(:mod:`gateway.pg_fence`). Rows nobody holds are dropped after :data:`REQUEST_TTL`.

Each node reads the table when notified and every lease interval (the safety net).
"""

from __future__ import annotations

import logging
import time
from enum import StrEnum
from typing import Any

from gateway.approvals import Approvals
from gateway.jobs import JobRunner
from gateway.mcp.elicit import Elicitations
from gateway.pg_fence import CHANNEL
from gateway.pipeline import Pipeline
from gateway.store import StoreUnavailable
from gateway.store_pg import PgStore
from gateway.store_pg_batch import text_of, utf8
from protocol.codec import decode_json, encode_json
from protocol.messages import Decision, ElicitAction, NotAcceptedReason

logger = logging.getLogger("gateway.nodes")

REQUEST_TTL = 60.0
"""Seconds a routed request waits for a node that holds its target before it is dropped
(the call or job ended meanwhile, or its node died)."""


class Kind(StrEnum):
    """What a routed request asks of the node that holds its target."""

    CONFIRM = "confirm"
    CANCEL_CALL = "cancel_call"
    CANCEL_JOB = "cancel_job"
    ELICIT = "elicit"
    """An ``elicit.answer`` (SPEC M3); ``decision`` is ``{"action", "content"}`` as JSON."""


ROUTED_KEPT = 10_000
"""Decisions and answers routed from this node remembered (:meth:`NodeRequests.route_confirm`,
:meth:`NodeRequests.route_answer`)."""


class NodeRequests:
    """Routes requests between nodes and applies those for this node (SPEC N3).

    Args:
        store: the shared store.
        approvals: this node's pending approvals (SPEC A3).
        pipeline: this node's running calls (SPEC I8).
        jobs: this node's running jobs (SPEC J3).
        elicitations: this node's pending MCP questions (SPEC M3).
    """

    def __init__(
        self,
        store: PgStore,
        approvals: Approvals,
        pipeline: Pipeline,
        jobs: JobRunner,
        elicitations: Elicitations,
    ) -> None:
        self._store = store
        self._approvals = approvals
        self._pipeline = pipeline
        self._jobs = jobs
        self._elicitations = elicitations
        self._answered: dict[tuple[str, str], None] = {}
        self.applied = 0
        """Requests from other nodes applied here."""

    def running_elsewhere(
        self, session_id: str, call_id: str | None, approval_id: str, member: str = "approval_id"
    ) -> bool:
        """Whether the stored calls of ``session_id`` hold a running one with that call
        id or whose note names ``approval_id`` as its ``member`` (``approval_id``, or
        ``elicitation_id``: a question pending there, SPEC M3); the node that runs it
        is elsewhere.

        Raises:
            StoreUnavailable: the store cannot be read now.
        """
        # The call's note (gateway.approval_gate, gateway.handoff, gateway.mcp.elicit) is
        # searched as bytes, not cast to json: PostgreSQL's json refuses a NUL escape
        # (\u0000), which a tool name may hold. Inside a JSON string a quote is escaped,
        # so the key and value below can only match the note's own member.
        named = encode_json({member: approval_id})[1:-1]
        rows = self._store.link.read(
            "SELECT 1 FROM calls WHERE session_id=%s AND state='running' AND "
            "(call_id=%s OR position(%s::bytea in body) > 0) LIMIT 1",
            (session_id, utf8(call_id or ""), named),
        )
        return bool(rows)

    def route_confirm(
        self, session_id: str, user: str, approval_id: str, decision: Decision
    ) -> NotAcceptedReason | None:
        """Route a ``tool.confirm`` this node cannot settle to the node where its call
        waits for the decision (SPEC N3, A3); answers as :meth:`route_answer`.

        Returns:
            ``None``: routed (accepted; the node that holds the approval settles it,
            and its ``tool.resolved`` tells which settlement won). ``unknown``: no
            running call of ``session_id`` names that approval, or the store cannot be
            used now. ``already_decided``: this node already routed a decision for it
            (the first decision wins, A3).
        """
        return self._route_once(
            Kind.CONFIRM, session_id, user, approval_id, "approval_id", str(decision)
        )

    def route_answer(
        self,
        session_id: str,
        user: str,
        elicitation_id: str,
        action: ElicitAction,
        content: dict[str, Any] | None,
    ) -> NotAcceptedReason | None:
        """Route an ``elicit.answer`` this node cannot settle to the node where its
        question waits (SPEC N3, M3).

        Returns:
            ``None``: routed (accepted; the node that holds the question settles it as
            if its own socket had answered). ``unknown``: no running call of
            ``session_id`` names that question (a made-up id, another session's, one
            settled before the session moved), content JSON cannot carry, or the store
            cannot be used now. ``already_decided``: this node already routed an answer
            to it (the first answer wins, A3).
        """
        try:
            decision = encode_json({"action": action.value, "content": content}).decode()
        except TypeError:  # content JSON cannot carry
            return NotAcceptedReason.UNKNOWN
        return self._route_once(
            Kind.ELICIT, session_id, user, elicitation_id, "elicitation_id", decision
        )

    def _route_once(
        self, kind: Kind, session_id: str, user: str, target: str, member: str, decision: str
    ) -> NotAcceptedReason | None:
        """Route the first answer for ``target`` (the call's note names it as
        ``member``) from this node; a later one for the same target is not accepted."""
        key = (session_id, target)
        if key in self._answered:
            return NotAcceptedReason.ALREADY_DECIDED
        try:
            if not self.running_elsewhere(session_id, None, target, member):
                return NotAcceptedReason.UNKNOWN
            self.route(kind, session_id, user, target, decision)
        except StoreUnavailable:
            return NotAcceptedReason.UNKNOWN
        self._answered[key] = None
        if len(self._answered) > ROUTED_KEPT:
            del self._answered[next(iter(self._answered))]
        return None

    def route(
        self, kind: Kind, session_id: str, user: str, target: str, decision: str | None = None
    ) -> None:
        """Store a request for whichever node holds ``target`` and notify every node.
        ``target`` (a call id the client sent, an approval, question or job id) is kept
        as UTF-8 ``BYTEA``: a call id may hold U+0000 (SPEC D6; schema version 4).

        Raises:
            StoreUnavailable: it could not be stored; nothing was sent.
        """
        self._store.link.execute(
            "WITH r AS (INSERT INTO node_requests "
            '(kind, session_id, "user", target, decision, created_at) '
            "VALUES (%s,%s,%s,%s,%s,%s) RETURNING id) SELECT pg_notify(%s, 'requests *') FROM r",
            (str(kind), session_id, user, utf8(target), decision, time.time(), CHANNEL),
        )

    def sweep(self) -> None:
        """Apply the stored requests whose target this node holds, each once."""
        try:
            self._store.link.execute(
                "DELETE FROM node_requests WHERE created_at < %s", (time.time() - REQUEST_TTL,)
            )
            rows = self._store.link.read(
                'SELECT id, kind, session_id, "user", target, decision FROM node_requests '
                "ORDER BY id"
            )
            for row_id, kind, session_id, user, stored, decision in rows:
                target = text_of(stored)
                if self._holds(Kind(kind), session_id, target) and self._claim(row_id):
                    self._apply(Kind(kind), session_id, user, target, decision)
        except StoreUnavailable as exc:
            logger.warning("routed requests not read now: %s", exc)

    def _holds(self, kind: Kind, session_id: str, target: str) -> bool:
        if kind is Kind.CONFIRM:
            return target in self._approvals.pending
        if kind is Kind.CANCEL_JOB:
            return target in self._jobs.active
        if kind is Kind.ELICIT:
            return self._elicitations.holds(session_id, target)
        return self._pipeline.running(session_id, target)

    def _claim(self, row_id: int) -> bool:
        rows = self._store.link.read(
            "DELETE FROM node_requests WHERE id=%s RETURNING id", (row_id,)
        )
        return bool(rows)

    def _apply(
        self, kind: Kind, session_id: str, user: str, target: str, decision: str | None
    ) -> None:
        self.applied += 1
        if kind is Kind.CONFIRM:
            reason = self._approvals.confirm(
                session_id, user, target, Decision(decision or Decision.DENY)
            )
            logger.info("routed decision on %s: %s", target, reason or "accepted")
        elif kind is Kind.CANCEL_JOB:
            self._jobs.cancel(target)
        elif kind is Kind.ELICIT:
            self._answer(session_id, target, decision)
        else:
            self._pipeline.cancel_by_id(session_id, target)

    def _answer(self, session_id: str, elicitation_id: str, decision: str | None) -> None:
        """SPEC M3, N3: settle a routed ``elicit.answer`` as if this node's socket had
        sent it (same session, first answer wins); an unreadable one answers ``cancel``."""
        try:
            answer = decode_json(decision or "")
            action = ElicitAction(answer["action"])
            content = answer.get("content")
        except (TypeError, KeyError, ValueError, AttributeError):  # JSONDecodeError: a ValueError
            action, content = ElicitAction.CANCEL, None
        if not isinstance(content, dict):
            content = None
        reason = self._elicitations.settle(session_id, elicitation_id, action, content)
        logger.info("routed answer on %s: %s", elicitation_id, reason or "accepted")
