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
(:mod:`gateway.pg_fence`). Rows nobody holds are dropped after :data:`REQUEST_TTL`
(judged on the earlier of the sweeping node's clock and the database's).

A routed decision is answered as the node that holds its target would answer it (SPEC
A3, A4): the call's note names the ``expires_at`` that ``tool_start`` or
``elicit.request`` announced, and one received at or after it is ``expired`` here; the
row carries the time it was received (``created_at``, this node's clock), and the node
that applies it judges it by that time, so it settles a late one as its timeout would,
and never a timely one as late. A settlement this node learns of through the inbox
(``tool.resolved``, :meth:`NodeRequests.settled_elsewhere`) answers a later decision as
one node would: ``expired`` after a timeout, else ``already_decided``.

Each node reads the table when notified and every lease interval (the safety net).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
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
from protocol.messages import (
    Decision,
    ElicitAction,
    NotAcceptedReason,
    ResolutionReason,
    ToolResolved,
)

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


def running_note(
    store: PgStore, session_id: str, call_id: str | None, target: str, member: str
) -> dict[str, Any] | None:
    """The note of a running stored call of ``session_id`` with that call id, or whose
    note names ``target`` as its ``member`` (:meth:`NodeRequests.running_elsewhere`);
    ``{}`` when it cannot be read, ``None`` when there is no such call.

    Raises:
        StoreUnavailable: the store cannot be read now.
    """
    # The call's note (gateway.approval_gate, gateway.handoff, gateway.mcp.elicit) is
    # searched as bytes, not cast to json: PostgreSQL's json refuses a NUL escape
    # (\u0000), which a tool name may hold. Inside a JSON string a quote is escaped,
    # so the key and value below can only match the note's own member.
    named = encode_json({member: target})[1:-1]
    rows = store.link.read(
        "SELECT body FROM calls WHERE session_id=%s AND state='running' AND "
        "(call_id=%s OR position(%s::bytea in body) > 0) LIMIT 1",
        (session_id, utf8(call_id or ""), named),
    )
    if not rows:
        return None
    try:
        note = decode_json(bytes(rows[0][0] or b"{}"))
    except ValueError:  # JSONDecodeError: a ValueError
        return {}
    return note if isinstance(note, dict) else {}


class NodeRequests:
    """Routes requests between nodes and applies those for this node (SPEC N3).

    Args:
        store: the shared store.
        approvals: this node's pending approvals (SPEC A3).
        pipeline: this node's running calls (SPEC I8).
        jobs: this node's running jobs (SPEC J3).
        elicitations: this node's pending MCP questions (SPEC M3).
        clock: Unix time in seconds (when a request was received, SPEC A4).
    """

    def __init__(
        self,
        store: PgStore,
        approvals: Approvals,
        pipeline: Pipeline,
        jobs: JobRunner,
        elicitations: Elicitations,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._approvals = approvals
        self._pipeline = pipeline
        self._jobs = jobs
        self._elicitations = elicitations
        self._clock = clock
        self._answered: dict[tuple[str, str], NotAcceptedReason | None] = {}
        """(session, target) -> what this node answered first (``None``: routed), or
        what a settlement it learnt of means for a later decision (SPEC A3)."""
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
        return running_note(self._store, session_id, call_id, approval_id, member) is not None

    def route_confirm(
        self, session_id: str, user: str, approval_id: str, decision: Decision
    ) -> NotAcceptedReason | None:
        """Route a ``tool.confirm`` this node cannot settle to the node where its call
        waits for the decision (SPEC N3, A3, A4); answers as :meth:`route_answer`, and
        as one node answers a decision after the approval was settled (one this node
        learnt of, :meth:`settled_elsewhere`).

        Returns:
            ``None``: routed (accepted; the node that holds the approval settles it,
            and its ``tool.resolved`` tells which settlement won). ``unknown``: no
            running call of ``session_id`` names that approval, or the store cannot be
            used now. ``expired``: received at or after the approval's ``expires_at``
            (routed all the same: the approval is denied ``timeout`` now, as one node
            does, A4), or the approval timed out. ``already_decided``: this node
            already routed a decision for it, or the approval was settled otherwise
            (the first decision wins, A3).
        """
        return self._route_once(
            Kind.CONFIRM, session_id, user, approval_id, "approval_id", str(decision)
        )

    def settled_elsewhere(self, session_id: str, event: ToolResolved) -> None:
        """SPEC A3, A4, N3: a call of ``session_id`` (held here) that waited on another
        node had its approval settled there (its ``tool.resolved`` came through the
        inbox). A later decision for it is answered as one node answers it:
        ``expired`` after a timeout, else ``already_decided``."""
        if event.approval_id is None:
            return
        late = event.reason is ResolutionReason.TIMEOUT
        self._remember(
            (session_id, event.approval_id),
            NotAcceptedReason.EXPIRED if late else NotAcceptedReason.ALREADY_DECIDED,
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
            cannot be used now. ``expired``: received at or after the question's
            ``expires_at`` (routed all the same: the MCP server is answered ``cancel``
            now, as at the timeout, SPEC A4). ``already_decided``: this node already
            routed an answer to it (the first answer wins, A3).
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
        ``member``, and its ``expires_at``) from this node; a later one for the same
        target is not accepted: ``already_decided``, or ``expired`` when the first was.
        The row carries the time it was received here: the node that holds the target
        judges it by that time (SPEC A4)."""
        key = (session_id, target)
        if key in self._answered:
            return self._answered[key] or NotAcceptedReason.ALREADY_DECIDED
        now = self._clock()
        try:
            note = running_note(self._store, session_id, None, target, member)
            if note is None:
                return NotAcceptedReason.UNKNOWN
            self.route(kind, session_id, user, target, decision, now)
        except StoreUnavailable:
            return NotAcceptedReason.UNKNOWN
        expires_at = note.get("expires_at")
        # SPEC A4: the deadline announced, as the node that holds the target judges it.
        late = isinstance(expires_at, int | float) and now >= expires_at
        reason = NotAcceptedReason.EXPIRED if late else None
        self._remember(key, reason)
        return reason

    def _remember(self, key: tuple[str, str], reason: NotAcceptedReason | None) -> None:
        self._answered[key] = reason
        if len(self._answered) > ROUTED_KEPT:
            del self._answered[next(iter(self._answered))]

    def route(
        self,
        kind: Kind,
        session_id: str,
        user: str,
        target: str,
        decision: str | None = None,
        at: float | None = None,
    ) -> None:
        """Store a request for whichever node holds ``target`` and notify every node.
        ``target`` (a call id the client sent, an approval, question or job id) is kept
        as UTF-8 ``BYTEA``: a call id may hold U+0000 (SPEC D6; schema version 4).
        ``at``: when it was received (Unix s; ``None``: now, on this node's clock).

        Raises:
            StoreUnavailable: it could not be stored; nothing was sent.
        """
        received = self._clock() if at is None else at
        self._store.link.execute(
            "WITH r AS (INSERT INTO node_requests "
            '(kind, session_id, "user", target, decision, created_at) '
            "VALUES (%s,%s,%s,%s,%s,%s) RETURNING id) SELECT pg_notify(%s, 'requests *') FROM r",
            (str(kind), session_id, user, utf8(target), decision, received, CHANNEL),
        )

    def sweep(self) -> None:
        """Apply the stored requests whose target this node holds, each once, whatever
        their age; then drop those nobody held for :data:`REQUEST_TTL` seconds.

        A row's ``created_at`` is the routing node's clock (SPEC A4: the holder judges
        the decision by it), not this node's: its age is judged on the earlier of this
        node's clock and the database's, so a node whose clock runs ahead never drops
        a request another node routed a moment ago (SPEC N3, A3: it was answered
        ``accepted``)."""
        try:
            rows = self._store.link.read(
                'SELECT id, kind, session_id, "user", target, decision, created_at '
                "FROM node_requests ORDER BY id"
            )
            for row_id, kind, session_id, user, stored, decision, at in rows:
                target = text_of(stored)
                if self._holds(Kind(kind), session_id, target) and self._claim(row_id):
                    self._apply(Kind(kind), session_id, user, target, decision, float(at))
            self._store.link.execute(
                "DELETE FROM node_requests WHERE created_at < "
                "LEAST(%s, extract(epoch FROM clock_timestamp())) - %s",
                (self._clock(), REQUEST_TTL),
            )
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
        self,
        kind: Kind,
        session_id: str,
        user: str,
        target: str,
        decision: str | None,
        at: float,
    ) -> None:
        """Apply one claimed request; ``at``: when the routing node received it (SPEC A4:
        a decision is judged by that time, as that node judged it)."""
        self.applied += 1
        if kind is Kind.CONFIRM:
            reason = self._approvals.confirm(
                session_id, user, target, Decision(decision or Decision.DENY), at
            )
            logger.info("routed decision on %s: %s", target, reason or "accepted")
        elif kind is Kind.CANCEL_JOB:
            self._jobs.cancel(target)
        elif kind is Kind.ELICIT:
            self._answer(session_id, target, decision, at)
        else:
            self._pipeline.cancel_by_id(session_id, target)

    def _answer(
        self, session_id: str, elicitation_id: str, decision: str | None, at: float
    ) -> None:
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
        reason = self._elicitations.settle(session_id, elicitation_id, action, content, at)
        logger.info("routed answer on %s: %s", elicitation_id, reason or "accepted")
